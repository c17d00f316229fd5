// flashvk bench: the cases it times (--suite standard, --suite modifiers, or the shape of the
// options in each storage of a --kv-dtype list).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>

#include "bench_cases.hpp"

namespace flashvk::cli {

namespace {

// Query-key pairs of all (batch, head) inside the causal limit and the sliding window, less
// those an additive mask hides (-inf): the pairs attention computes.
double visible_pairs(const Case& c) {
  const Modifiers& p = c.mods;
  const HostTensor& mask = p.mask;
  // The mask's [Nq, Nk] matrices, each standing for heads / matrices of the B * H.
  uint64_t matrices = mask.data.empty() ? 1 : mask.data.size() / (uint64_t(c.dims.nq) * c.dims.nk);
  double pairs = 0;
  for (uint64_t x = 0; x < matrices; ++x)
    for (uint32_t i = 0; i < c.dims.nq; ++i) {
      KeyRange keys = window_keys(p, c.dims.nq, c.dims.nk, i);
      if (p.mask_twin) {  // a user's mask_mod, counted through its C++ twin
        for (uint32_t b = 0; b < c.dims.batch; ++b)
          for (uint32_t h = 0; h < c.dims.heads; ++h)
            for (int64_t j = keys.begin; j < keys.end; ++j)
              if (p.mask_twin(int(b), int(h), int(i), int(j)))
                pairs += 1.0 / (c.dims.batch * c.dims.heads);
        continue;
      }
      if (mask.data.empty()) {
        pairs += double(keys.end - keys.begin);
        continue;
      }
      const float* row = mask.data.data() + (x * c.dims.nq + i) * c.dims.nk;
      for (int64_t j = keys.begin; j < keys.end; ++j)
        if (row[j] != -std::numeric_limits<float>::infinity()) pairs += 1;
    }
  return pairs * c.dims.batch * c.dims.heads / double(matrices);
}

HostTensor random_input(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : t.data) x = dist(rng);
  return t;
}

// "flash2,flashd": the variants in the order given, each once.
std::vector<Variant> parse_variant_list(const std::string& text) {
  return parse_list<Variant>("--variant", text, parse_variant, variant_name);
}

// Gives c's K and V `storage`, refused before any output if its blocks do not divide d or dv (as
// uploading them would be).
void set_storage(Case& c, const Storage& storage) {
  for (auto [dtype, width, option] :
       {std::tuple{storage.k, c.dims.d, "--d"}, {storage.v, c.dims.dv, "--dv"}})
    if (width % dtype_block(dtype) != 0)
      throw UsageError{"--kv-dtype " + std::string(dtype_name(dtype)) + " stores blocks of " +
                       std::to_string(dtype_block(dtype)) + " values: " + option +
                       " must be a multiple of " + std::to_string(dtype_block(dtype)) + ", got " +
                       std::to_string(width)};
  c.storage = storage;
}

// The one shape given by --batch, --heads, ... for the chosen variants (default: Nq 1024, all), in
// `storage`.
Case custom_case(const Args& args, const Storage& storage, int64_t default_nq = 1024,
                 const std::string& default_variants = "all") {
  const int64_t big = 1 << 24;
  auto batch = args.integer("batch", 1, 1, 4096);
  auto heads = args.integer("heads", 8, 1, 4096);
  auto kv_heads = args.integer("kv-heads", heads, 1, 4096);
  auto nq = args.integer("nq", default_nq, 1, big);
  auto nk = args.integer("nk", nq, 1, big);
  auto d = args.integer("d", 64, 1, 256);
  auto dv = args.integer("dv", d, 1, 256);
  Case c{"custom"};
  // check_shapes gives the usual messages for heads that do not divide, and so on.
  std::vector<int64_t> qs{batch, heads, nq, d}, ks{batch, kv_heads, nk, d},
      vs{batch, kv_heads, nk, dv};
  c.dims = check_shapes(qs, ks, vs);
  modifier_options(args, c.mods);
  set_storage(c, storage);
  c.variants = all_variants();
  std::string variants = args.text("variant", default_variants);
  if (variants != "all") c.variants = parse_variant_list(variants);
  return c;
}

}  // namespace

Dims make_dims(uint32_t b, uint32_t h, uint32_t hkv, uint32_t nq, uint32_t nk, uint32_t d,
               uint32_t dv) {
  Dims dims;
  dims.batch = b, dims.heads = h, dims.kv_heads = hkv, dims.nq = nq, dims.nk = nk;
  dims.d = d, dims.dv = dv;
  return dims;
}

double case_flops(const Case& c) {
  return 4.0 * visible_pairs(c) * c.dims.d;
}

Inputs make_inputs(const Dims& d) {
  return {random_input({d.batch, d.heads, d.nq, d.d}, 1),
          random_input({d.batch, d.kv_heads, d.nk, d.d}, 2),
          random_input({d.batch, d.kv_heads, d.nk, d.dv}, 3)};
}

// The prefill and decode sets of the performance issue. naive runs at d = 64 in fp32 only: it
// is an order of magnitude slower on a CPU driver, and its curve against N is what matters.
std::vector<Case> standard_suite() {
  std::vector<Case> cases;
  const std::vector<Variant> fused = {Variant::online, Variant::flash1, Variant::flash2,
                                      Variant::flashd, Variant::splitkv};
  for (DType dtype : {DType::f32, DType::f16})
    for (uint32_t d : {64u, 128u})
      for (bool causal : {false, true})
        for (uint32_t n : {512u, 1024u, 2048u, 4096u}) {
          bool naive = dtype == DType::f32 && d == 64;  // all_variants(): naive, then the fused
          Case c{
              "prefill", make_dims(1, 8, 8, n, n, d, d), {}, dtype, naive ? all_variants() : fused};
          c.mods.causal = causal;
          cases.push_back(c);
        }
  // Long context with a sliding window of 1024 keys (window 1023,0), beside full causal attention
  // at the same N, which sees 8x the pairs: the window's cost must follow its pairs.
  for (DType dtype : {DType::f32, DType::f16})
    for (bool windowed : {true, false}) {
      Case c{"window", make_dims(1, 8, 8, 16384, 16384, 64, 64), {}, dtype, {Variant::flash2}};
      c.mods.causal = !windowed;
      if (windowed) c.mods.window_left = 1023, c.mods.window_right = 0;
      cases.push_back(c);
    }
  // Decoding over a KV cache in fp32, fp16 and q8_0 (K and V; Q in fp16).
  for (Storage storage :
       {Storage(DType::f32), Storage(DType::f16), Storage(DType::f16, DType::q8_0, DType::q8_0)})
    for (uint32_t nk : {4096u, 16384u, 65536u})
      cases.push_back({"decode",
                       make_dims(1, 32, 8, 1, nk, 128, 128),
                       {},
                       storage,
                       {Variant::flash2, Variant::flashd, Variant::splitkv}});
  return cases;
}

std::vector<Case> kernel_suite() {
  std::vector<Case> cases;
  std::vector<Modifiers> mods(3);
  mods[1].causal = true;
  mods[2].causal = true;
  mods[2].window_left = 1023, mods[2].window_right = 0;
  mods[2].softcap = 30.0f;
  mods[2].alibi_max_bias = 8.0f;
  const DType f32 = DType::f32, f16 = DType::f16;
  struct Kind {
    const char* kind;
    Storage storage;
    bool fp16_arithmetic;
  };
  std::vector<Kind> prefill = {{"prefill", f32, false}, {"prefill", f16, false}, {"prefill", f16, true}};
  std::vector<Kind> decode = {{"decode", f32, false}, {"decode", f16, false}};
  for (DType t : dtypes())  // fp16 Q with K and V in each block format
    if (dtype_quantised(t)) {
      prefill.push_back({"prefill", {f16, t, t}, false});
      decode.push_back({"decode", {f16, t, t}, false});
    }
  for (uint32_t d : {64u, 80u, 96u, 128u, 256u})
    for (size_t i = 0; i < mods.size(); ++i) {
      const Modifiers& m = mods[i];
      bool sinks = i == 2;  // a sink logit per query head
      for (const Kind& k : prefill) {
        if (d % dtype_block(k.storage.k) != 0) continue;  // the block formats' blocks of 32
        Case c{k.kind, make_dims(1, 8, 8, 2048, 2048, d, d), m, k.storage, all_variants()};
        if (sinks) c.mods.sinks.assign(8, 0.5f);
        c.fp16_arithmetic = k.fp16_arithmetic;
        cases.push_back(c);
      }
      for (const Kind& k : decode) {
        if (d % dtype_block(k.storage.k) != 0) continue;
        Case c{k.kind,
               make_dims(1, 32, 8, 1, 16384, d, d),
               m,
               k.storage,
               {Variant::flash2, Variant::flashd, Variant::splitkv}};
        if (sinks) c.mods.sinks.assign(32, 0.5f);
        cases.push_back(c);
      }
    }
  return cases;
}

// The shape of the options once per storage of K and V that --kv-dtype lists ("f16,q8_0"),
// on the same inputs and in the same rounds, the first the others' base (vs base).
std::vector<Case> custom_cases(const Args& args) {
  std::vector<Storage> storages = storage_list(args);
  std::vector<Case> cases = {custom_case(args, storages[0])};  // reads the modifiers' files once
  for (size_t i = 1; i < storages.size(); ++i) {
    cases.push_back(cases[0]);
    set_storage(cases.back(), storages[i]);
    cases.back().with_previous = true;
  }
  return cases;
}

// --suite modifiers: the shape (default B=1 H=8 N=2048 d=64, flash2 and flashd) in causal
// attention, its base, then each modifier's examples (modifier_table(): softcap 30, ALiBi with
// max_bias 8, a sink logit per head, a mask of the causal pattern in causal's place, a sparse
// mask whose hidden tiles the kernels skip, ...), all in the same rounds.
std::vector<Case> modifier_suite(const Args& args) {
  Case base = custom_case(args, storage_options(args, "--suite modifiers"), 2048, "flash2,flashd");
  base.kind = "modifier";
  base.mods.causal = true;
  std::vector<Case> cases = {base};
  for (const ModifierInfo& info : modifier_table())
    if (info.examples)
      for (const Modifiers& mods : info.examples(base.mods, base.dims)) {
#ifndef FLASHVK_CLI_FLEX
        if (mods.user_functions()) continue;  // no flashvk::flex in this build
#endif
        cases.push_back(base);
        cases.back().mods = mods;
        cases.back().with_previous = true;
      }
  return cases;
}

}  // namespace flashvk::cli
