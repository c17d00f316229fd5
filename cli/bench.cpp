#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

#include "args.hpp"
#include "commit.hpp"
#include "flashvk.hpp"
#include "flashvk/tools/peak.hpp"

namespace flashvk::cli {

std::string tiling_text(Variant variant, TileLayout layout, uint32_t block_rows,
                        uint32_t block_keys, uint32_t splits) {
  std::string s = tile_layout_name(layout);
  if (block_keys == 0) return s;  // naive: no tiles
  s += " " + std::to_string(block_rows) + "x" + std::to_string(block_keys);
  if (variant_info(variant).splits_keys)
    s += ", " + std::to_string(splits) + (splits == 1 ? " split" : " splits");
  return s;
}

namespace {

using Json = nlohmann::ordered_json;

const char* kBenchHelp = R"(usage: flashvk bench [options]

Times each variant on random inputs with GPU timestamp queries, after a warm-up on the same keys
with at most 512 query rows (which builds the pipeline). The variants of a shape run in --repeat
rounds, each variant once per round, so that they all see the same drift of the machine's speed;
a variant's time is the median of its runs, and "vs flash2" the median, over rounds, of its time
over flash2's in the same round. Before every run a 128 MiB buffer is filled on the device, so
that the inputs come from device memory and not from a cache warmed by the run before (a decode
step finds its KV cache cold). GFLOP/s counts 4 * B * H * Nq * Nk * d, only of the pairs
attention computes (inside the causal limit and the window, and not hidden by a mask). Memory
is what the call allocated on the device: outputs and scratch (S for naive); the inputs are not
counted.

options:
  --variant LIST|all  one variant, several separated by commas (flash2,flashd), or all six
                      (default all)
  --batch B --heads H --kv-heads Hk --nq N --nk N --d D --dv D
                      shape (default 1, 8, H, 1024, Nq, 64, d)
MODIFIERS  --layout auto|shared|registers|coopmat|lanes|blocks
                      where the fused kernels keep K/V tiles (default auto; coopmat: the
                      tile products on the matrix units, fp16 only; lanes: splitkv's
                      decoding kernel, a key's head dimension over a few lanes, with
                      --variant splitkv; blocks: GPUs without matrix units, 4-row blocks
                      of S and O per invocation from vector reads; the last column,
                      tiles, names the layout that ran, its query rows per workgroup x keys
                      per tile and, for splitkv, its number of key chunks)
  --fp16-arithmetic   fp16 products in the fused variants (register blocks, or the matrix
                      units), summed in fp32 every 8; needs shaderFloat16 (`flashvk devices`);
                      naive runs fp32 (the tiles column says which rows ran it)
  --block-rows N      invocations per workgroup (default: the engine's choice; with register
                      tiles a multiple of the subgroup size, each invocation working on R rows)
  --block-keys N      keys per K/V tile (shared tiles: at most what fits in shared memory;
                      register tiles: the subgroup size)
  --splits N          splitkv's number of key chunks (default: from the device); these three
                      tune one shape: the tiles column shows what ran
  --suite standard    the fixed set of docs/performance.md instead of one shape: prefill
                      (B=1 H=8 N=512..4096, d=64 and 128, full and causal), a sliding window
                      (N=16384 d=64, window 1023,0, beside causal at 16384) and decode
                      (Nq=1 H=32 Hkv=8 Nk=4096..65536 d=128), fp32 and fp16 (decode also
                      with q8_0 K and V)
  --suite modifiers   what each modifier costs: one shape (default B=1 H=8 N=2048 d=64,
                      --variant flash2,flashd; the shape options, --variant, --dtype,
                      --kv-dtype, --layout and the tiling options change it) in causal
                      attention, its base, then with softcap 30, ALiBi (max_bias 8), a sink
                      per head, an additive mask of the causal pattern in --causal's place,
                      and a sparse one (the first Nk/32 keys and a window of Nk/8: tiles it
                      hides are skipped), all in the same rounds; "vs base" is the median
                      over rounds of a row's time over its variant's base run in the same
                      round
  --peak              measure the device's FMA throughput and read bandwidth with calibration
                      shaders first, then the FMA throughput again around the runs (at most
                      once a second: short runs share their probes), and report each variant
                      as the median of its runs' fractions of the mean of the probes just
                      before and just after it; on devices with cooperative matrices also
                      their fp16 peak, which the cooperative_matrix rows are a fraction of
  --repeat N          rounds: timed runs per variant (default 3; 1 with --suite standard, 9
                      with --suite modifiers)
  --min-time S        more rounds for short runs: a variant whose first run is shorter than
                      S / --repeat seconds runs ceil(S / first run) rounds, at most 100, and
                      flash2 as many as the most (default 0; 0.5 with --suite standard)
  --flashd-rounds N   flashd and flash2 run at least N rounds, so that their ratio, which
                      FLASH-D's target names, is a median of N pairs (default 0; 9 with
                      --suite standard: on a noisy machine the median of 3 pairs misses by a
                      tenth)
  --warm-cache        skip the cache flush before each run
  --gpu-warm S        before each shape's timed runs, keep the device busy for S seconds
                      (the FMA calibration, back to back), so that a GPU has raised its clocks
                      from idle: an H100 ran its first seconds of work about 4x slower
                      (default 1 on GPUs, 0 on CPU drivers)
  --check             also report the max error against the float64 reference (slow)
  --decode-loop       instead, a decode loop as an app runs it: a KV cache of --nk tokens
                      (default 4096; H 32, Hkv 8, d 128 unless given; --variant one,
                      default splitkv), filled one token a step by a recording made once
                      that appends the token's K and V and attends over the cache, submitted
                      every step after set_position(). Reports the host's time per step
                      (set_position + vkQueueSubmit), the GPU's (timestamps around the
                      recording), beside one attention() over the full cache, and the Vulkan
                      objects the engine created after the first step (exit status 1 if any)
  --rope interleaved|half
                      with --decode-loop: rotate each K as it is appended, and Q
  --json FILE         write every figure as JSON
  --device N          Vulkan device index

examples:
  flashvk bench --nq 512 --d 64 --causal --repeat 5 --json bench.json
  flashvk bench --suite standard --peak --json suite.json
  flashvk bench --suite modifiers --dtype f16
  flashvk bench --variant flash2 --nq 2048 --layout shared --block-rows 128 --block-keys 32
  flashvk bench --decode-loop --dtype f16 --rope interleaved
)";

// One shape, and the variants to time on it.
struct Case {
  const char* kind;  // "prefill", "window", "decode", "modifier" or "custom"
  Dims dims;
  Modifiers mods;   // causal, the window, ...
  Storage storage;  // Q's, K's and V's
  std::vector<Variant> variants;
  // Runs in the rounds of the case before it, on the same inputs (a group: --suite modifiers, or
  // a --kv-dtype list, each case in its own storage), so that each of its variants has a run of
  // the group's first case, its base, in every round.
  bool with_previous = false;
};

// One timed run, and the FMA calibration around it (--peak): the mean of one just before and
// one just after.
struct Run {
  double ms = 0, peak_gflops = 0;
};

struct Row {
  const Case* c;
  Variant variant;
  std::vector<Run> runs;
  double ms = 0, gflops = 0, max_err = -1;
  double peak_gflops = 0, peak_fraction = 0;  // medians over the runs (--peak)
  double vs_flash2 = 0;  // median over rounds of time / flash2's time in the same round
  double vs_base = 0;  // the same over the base's time (the same variant in the group's first case)
  uint64_t bytes = 0;
  TileLayout layout = TileLayout::shared;               // the kernel that ran
  uint32_t block_rows = 0, block_keys = 0, splits = 1;  // and its tiling
  bool fp16_arithmetic = false;                         // --fp16-arithmetic applied to it
};

Dims make_dims(uint32_t b, uint32_t h, uint32_t hkv, uint32_t nq, uint32_t nk, uint32_t d,
               uint32_t dv) {
  Dims dims;
  dims.batch = b, dims.heads = h, dims.kv_heads = hkv, dims.nq = nq, dims.nk = nk;
  dims.d = d, dims.dv = dv;
  return dims;
}

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

double case_flops(const Case& c) {
  return 4.0 * visible_pairs(c) * c.dims.d;
}

// The mask column: the modifiers, or "full".
std::string mask_text(const Case& c) {
  std::string mods = modifier_text(c.mods);
  return mods.empty() ? "full" : mods;
}

HostTensor random_input(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : t.data) x = dist(rng);
  return t;
}

struct Inputs {
  HostTensor q, k, v;
};

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
          Case c{"prefill", make_dims(1, 8, 8, n, n, d, d), {}, dtype,
                 naive ? all_variants() : fused};
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

// Builds the variant's pipeline on a problem of the same kind with at most 512 query rows, so the
// timed runs measure the kernel and not the driver's compiler (llvmpipe compiles at the first
// dispatch). 512, not fewer: register tiles size their workgroups by the rows of a KV head below
// 256 (64 invocations x 4 rows), so a smaller warm-up would build another pipeline. The keys stay
// as they are: K and V are texel buffers for the register-tile kernels, and llvmpipe compiles
// another variant of a shader for textures of another size class (a warm-up on 64 keys left the
// first timed run at N = 300 with a 10 s compile).
void warm_up(Context& ctx, const Case& c, const AttentionParams& params) {
  Dims small = c.dims;
  small.nq = std::min(small.nq, 512u);
  Inputs in = make_inputs(small);
  AttentionParams p = params;
  if (p.mods.has_mask() && small.nq < c.dims.nq) {  // the mask's first rows of each slice
    std::vector<int64_t> shape = p.mods.mask.shape;
    int64_t slices = numel(shape) / (int64_t(c.dims.nq) * c.dims.nk);
    shape[shape.size() - 2] = small.nq;
    HostTensor rows(shape);
    for (int64_t s = 0; s < slices; ++s)
      std::copy_n(p.mods.mask.data.begin() + s * int64_t(c.dims.nq) * c.dims.nk,
                  int64_t(small.nq) * c.dims.nk,
                  rows.data.begin() + s * int64_t(small.nq) * c.dims.nk);
    p.mods.mask = std::move(rows);
  }
  attention(ctx, in.q, in.k, in.v, p, c.storage);
}

// Of an even count, the mean of the middle two: the upper one alone made a pair's median its
// worse run.
double median(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : 0.5 * (x[h - 1] + x[h]);
}

// Against the float64 reference on the inputs, or, with K and V stored otherwise than Q
// (--kv-dtype), on the values K and V hold once stored, so that the error is the kernel's.
double check_error(Context& ctx, const Inputs& in, const AttentionParams& params,
                   const Storage& storage) {
  HostAttentionResult r = attention(ctx, in.q, in.k, in.v, params, storage);
  reference::Result ref = storage.own_kv()
                              ? reference::direct(in.q, stored_values(in.k, storage.k),
                                                  stored_values(in.v, storage.v), params)
                              : reference::direct(in.q, in.k, in.v, params);
  double err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i)
    err = std::max(err, std::abs(double(r.out.data[i]) - ref.out[i]));
  return err;
}

struct Options {
  int repeat = 3;
  double min_time = 0;    // seconds of runs each variant gathers, in extra rounds if need be
  int flashd_rounds = 0;  // rounds flashd and flash2 run at least
  bool check = false;
  bool flush = true;    // fill a cache-sized buffer before every timed run
  double gpu_warm = 0;  // seconds of busy work before each shape (GPU clocks up from idle)
  TileLayout layout = TileLayout::automatic;
  bool fp16_arithmetic = false;
  uint32_t block_rows = 0, block_keys = 0, splits = 0;  // 0: the engine's choice
  std::optional<DevicePeak> peak;
  bool vs_base = false;  // the "vs base" column (--suite modifiers, --kv-dtype lists)
  int mask_width = 6;    // the mask column's: its longest text
};

void print_header(const Options& o) {
  std::printf("%-8s %-9s %6s %6s %5s %-*s %-8s %11s %9s %s%9s%s %11s%s  %s\n", "kind", "dtype",
              "Nq", "Nk", "d", o.mask_width, "mask", "variant", "time (ms)", "GFLOP/s",
              o.peak ? " of peak " : "", "vs flash2", o.vs_base ? "  vs base" : "", "memory MiB",
              o.check ? "  max error" : "", "tiles");
}

std::string tiles_text(const Row& r) {
  return tiling_text(r.variant, r.layout, r.block_rows, r.block_keys, r.splits) +
         (r.fp16_arithmetic ? ", fp16 arithmetic" : "");
}

void print_row(const Row& r, const Options& o) {
  const Dims& d = r.c->dims;
  std::printf("%-8s %-9s %6u %6u %5u %-*s %-8s %11.2f %9.2f", r.c->kind,
              storage_text(r.c->storage).c_str(), d.nq, d.nk, d.d, o.mask_width,
              mask_text(*r.c).c_str(), variant_name(r.variant), r.ms, r.gflops);
  if (o.peak) std::printf(" %7.1f%% ", 100.0 * r.peak_fraction);
  auto ratio = [](double x) {
    if (x > 0)
      std::printf(" %8.3f", x);
    else
      std::printf(" %8s", "-");
  };
  ratio(r.vs_flash2);
  if (o.vs_base) ratio(r.vs_base);
  std::printf(" %11.2f", double(r.bytes) / (1 << 20));
  if (r.max_err >= 0) std::printf("  %9.2e", r.max_err);
  std::printf("  %s\n", tiles_text(r).c_str());
  std::fflush(stdout);
}

// Progress on stderr: one line per run, rewritten in place on a terminal.
void progress(size_t done, size_t total, const Case& c, Variant v, int round, double elapsed_s) {
  bool tty = isatty(2);
  std::fprintf(stderr, "%s[%zu/%zu] %s %s N=%u/%u d=%u %s %s round %d  (%.0f s so far)%s",
               tty ? "\r\033[K" : "", done + 1, total, c.kind, variant_name(v), c.dims.nq,
               c.dims.nk, c.dims.d, storage_text(c.storage).c_str(), mask_text(c).c_str(),
               round + 1, elapsed_s, tty ? "" : "\n");
  std::fflush(stderr);
}

struct Clock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  size_t done = 0, total = 0;
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

// The FMA calibration around the runs (--peak). The machine's speed drifts, so a run's peak is
// the mean of a probe just before it and one just after; short runs share their probes, one a
// second at most, so that calibrating does not take longer than the runs it calibrates.
class Calibration {
 public:
  explicit Calibration(Context& ctx) : probe_(ctx) {}
  void before(Row& row) {
    if (!last_ || since_.seconds() > kGapSeconds) take();
    row.runs.back().peak_gflops = *last_;
    pending_.push_back({&row, row.runs.size() - 1});
  }
  void after() {
    if (since_.seconds() > kGapSeconds) take();
  }
  void finish() {
    if (!pending_.empty()) take();
  }

 private:
  static constexpr double kGapSeconds = 1.0;
  void take() {
    double gflops = probe_.gflops();
    for (auto [row, i] : pending_)
      row->runs[i].peak_gflops = 0.5 * (row->runs[i].peak_gflops + gflops);
    pending_.clear();
    last_ = gflops;
    since_ = Clock{};
  }
  FmaProbe probe_;
  std::optional<double> last_;
  Clock since_;
  std::vector<std::pair<Row*, size_t>> pending_;
};

// What the timed runs need next to them: the cache flush and the FMA calibration.
struct Meters {
  std::optional<CacheFlush> flush;
  std::optional<FmaProbe> busy;  // --gpu-warm's work
  std::optional<Calibration> fma;
};

AttentionParams case_params(const Case& c, Variant variant, const Options& o) {
  AttentionParams params;
  params.mods = c.mods;
  params.variant = variant;
  params.want_lse = false;
  if (variant_info(variant).fused) {
    params.hints.tile_layout = o.layout;
    params.hints.fp16_arithmetic = o.fp16_arithmetic;
  }
  params.hints.block_rows = o.block_rows;
  params.hints.block_keys = o.block_keys;
  if (variant_info(variant).splits_keys) params.hints.splits = o.splits;
  return params;
}

// Medians of a variant's runs; ratios are taken run by run, so that drift cancels: to flash2's
// runs on the same case, and to `base`'s (the same variant on the group's base case).
void summarise(Row& r, const Row* flash2, const Row* base, const Case& c) {
  std::vector<double> ms, peak, fraction, ratio, base_ratio;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const Run& run = r.runs[i];
    ms.push_back(run.ms);
    peak.push_back(run.peak_gflops);
    if (run.ms > 0 && run.peak_gflops > 0)
      fraction.push_back(case_flops(c) / (run.ms * 1e6) / run.peak_gflops);
    if (flash2 && flash2->runs[i].ms > 0) ratio.push_back(run.ms / flash2->runs[i].ms);
    if (base && base->runs[i].ms > 0) base_ratio.push_back(run.ms / base->runs[i].ms);
  }
  r.ms = median(ms);
  r.gflops = r.ms > 0 ? case_flops(c) / (r.ms * 1e6) : 0;
  r.peak_gflops = median(peak);
  r.peak_fraction = median(fraction);
  r.vs_flash2 = median(ratio);
  r.vs_base = median(base_ratio);
}

// One timed run of `r`'s variant, the cache flushed before it and calibrated around it.
void time_run(Context& ctx, const Case& c, const Tensor* qkv, const Options& o, Meters& meters,
              Row& r) {
  r.runs.emplace_back();
  if (meters.fma) meters.fma->before(r);
  if (meters.flush) meters.flush->run();
  AttentionParams params = case_params(c, r.variant, o);
  AttentionResult res = attention(ctx, qkv[0], qkv[1], qkv[2], params);
  r.fp16_arithmetic = params.hints.fp16_arithmetic;
  if (meters.fma) meters.fma->after();
  r.runs.back().ms = res.gpu_ms;
  r.bytes = res.device_bytes;
  r.layout = res.tile_layout;
  r.block_rows = res.block_rows, r.block_keys = res.block_keys, r.splits = res.splits;
}

constexpr int kMaxRounds = 100;
constexpr double kSuiteMinTime = 0.5;
constexpr int kSuiteFlashdRounds = 9;
constexpr int kModifierRounds = 9;  // --suite modifiers: each ratio to the base a median of 9 pairs

// Rounds each variant runs: --repeat, or more for short runs until they add up to --min-time
// (judged by the first round), and for flashd and flash2 at least --flashd-rounds. flash2 runs
// as many as any other, so every ratio has its pair.
std::vector<int> rounds_per_row(const std::vector<Row>& rows, const Options& o) {
  std::vector<int> rounds;
  int most = o.repeat;
  for (const Row& r : rows) {
    double ms = std::max(r.runs.front().ms, 1e-3);
    double wanted = std::ceil(o.min_time * 1e3 / ms);
    rounds.push_back(
        std::clamp(int(std::min(wanted, 1e6)), o.repeat, std::max(o.repeat, kMaxRounds)));
    if (r.variant == Variant::flashd || r.variant == Variant::flash2)
      rounds.back() = std::max(rounds.back(), o.flashd_rounds);
    most = std::max(most, rounds.back());
  }
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].variant == Variant::flash2) rounds[i] = most;
  return rounds;
}

// Every variant of a group of cases on the same inputs (one case, --suite modifiers' cases, or a
// shape in each storage of a --kv-dtype list; qkv[g]: Q, K and V uploaded in group[g]'s storage),
// in rounds: each round runs each (case, variant) once, each first in turn, so that all of them
// see the same drift of the machine's speed, and their ratios are fair.
std::vector<Row> run_group(Context& ctx, const std::vector<const Case*>& group,
                           const std::vector<const Tensor*>& qkv, const Inputs& in,
                           const Options& o, Meters& meters, Clock& clock) {
  std::vector<Row> rows;
  for (const Case* c : group)
    for (Variant v : c->variants) {
      rows.push_back(Row{c, v});
      warm_up(ctx, *c, case_params(*c, v, o));
    }
  if (o.gpu_warm > 0) {
    if (!meters.busy) meters.busy.emplace(ctx);
    auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           o.gpu_warm)
      meters.busy->gflops();
  }
  const size_t n = rows.size();
  std::vector<int> rounds(n, o.repeat);
  for (int round = 0; round < *std::max_element(rounds.begin(), rounds.end()); ++round) {
    for (size_t k = 0; k < n; ++k) {
      size_t i = (size_t(round) + k) % n;
      if (round >= rounds[i]) continue;
      progress(clock.done++, clock.total, *rows[i].c, rows[i].variant, round, clock.seconds());
      size_t g = size_t(std::find(group.begin(), group.end(), rows[i].c) - group.begin());
      time_run(ctx, *rows[i].c, qkv[g], o, meters, rows[i]);
    }
    if (round > 0) continue;
    rounds = rounds_per_row(rows, o);
    if (group.size() > 1)  // every run has its base's run of the same round
      rounds.assign(n, *std::max_element(rounds.begin(), rounds.end()));
    for (int r : rounds) clock.total += size_t(r - o.repeat);
  }
  if (meters.fma) meters.fma->finish();
  // The matrix units' peak bounds the cooperative-matrix kernels, not the FMA units'.
  for (Row& r : rows)
    if (o.peak && r.layout == TileLayout::cooperative_matrix)
      for (Run& run : r.runs) run.peak_gflops = o.peak->coopmat_gflops;
  auto find = [&](const Case* c, Variant v) -> const Row* {
    for (const Row& r : rows)
      if (r.c == c && r.variant == v) return &r;
    return nullptr;
  };
  for (Row& r : rows) {
    const Row* base = group.size() > 1 ? find(group.front(), r.variant) : nullptr;
    summarise(r, find(r.c, Variant::flash2), base, *r.c);
    if (o.check) r.max_err = check_error(ctx, in, case_params(*r.c, r.variant, o), r.c->storage);
  }
  return rows;
}

// What a case's inputs depend on: its shape.
auto input_key(const Case& c) {
  const Dims& d = c.dims;
  return std::make_tuple(d.batch, d.heads, d.kv_heads, d.nq, d.nk, d.d, d.dv);
}

auto storage_key(const Storage& s) {
  return std::make_tuple(s.q, s.k, s.v);
}

std::vector<Row> run_cases(Context& ctx, const std::vector<Case>& cases, const Options& o) {
  Clock clock;
  for (const Case& c : cases) clock.total += c.variants.size() * size_t(o.repeat);
  Meters meters;
  if (o.flush) meters.flush.emplace(ctx);
  if (o.peak) meters.fma.emplace(ctx);
  std::vector<Row> rows;
  print_header(o);
  for (size_t first = 0, end = 0; first < cases.size(); first = end) {
    std::vector<const Case*> group;  // a case and those that run with it
    for (end = first; end < cases.size() && (end == first || cases[end].with_previous); ++end)
      group.push_back(&cases[end]);
    const Case& c = cases[first];
    for (const Case* g : group)  // they share c's inputs
      if (input_key(*g) != input_key(c))
        throw std::logic_error("bench: a case of a group has another shape");
    Inputs in = make_inputs(c.dims);
    // The inputs in each storage of the group, uploaded once each.
    std::vector<std::array<Tensor, 3>> uploads(group.size());
    std::vector<const Tensor*> qkv(group.size());
    try {
      for (size_t g = 0; g < group.size(); ++g) {
        for (size_t h = 0; h < g && !qkv[g]; ++h)
          if (storage_key(group[h]->storage) == storage_key(group[g]->storage)) qkv[g] = qkv[h];
        if (qkv[g]) continue;
        uploads[g] = upload_qkv(ctx, in.q, in.k, in.v, group[g]->storage);
        qkv[g] = uploads[g].data();
      }
    } catch (const Error& e) {
      // A shape given alone, or a group of several cases (today always the whole list), is
      // refused; one shape beyond this device's limits does not cost the rest of a long suite.
      if (cases.size() == group.size()) throw;
      std::printf("%-8s %-9s %6u %6u %5u %-*s  not run: %s\n", c.kind,
                  storage_text(c.storage).c_str(), c.dims.nq, c.dims.nk, c.dims.d, o.mask_width,
                  mask_text(c).c_str(), e.what());
      for (const Case* g : group) clock.done += g->variants.size() * size_t(o.repeat);
      continue;
    }
    std::vector<Row> case_rows = run_group(ctx, group, qkv, in, o, meters, clock);
    if (isatty(2)) std::fprintf(stderr, "\r\033[K");
    for (const Row& r : case_rows) print_row(r, o);
    rows.insert(rows.end(), case_rows.begin(), case_rows.end());
  }
  std::fprintf(stderr, "%zu runs in %.1f s\n", clock.done, clock.seconds());
  if (o.peak && !rows.empty()) {
    auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.peak_gflops < b.peak_gflops;
    });
    std::printf(
        "peak around the runs (median per case): %.2f to %.2f GFLOP/s%s\n", lo->peak_gflops,
        hi->peak_gflops,
        o.peak->coopmat_gflops > 0 ? " (cooperative_matrix rows: of the fp16 matrix peak)" : "");
  }
  return rows;
}

std::vector<double> run_list(const std::vector<Run>& runs, double Run::*field) {
  std::vector<double> out;
  for (const Run& r : runs) out.push_back(r.*field);
  return out;
}

// docs/formats.md's bench JSON, keys in that order.
std::string json(const DeviceInfo& dev, const Options& o, const std::vector<Row>& rows) {
  Json j;
  j["device"] = dev.name;
  j["driver"] = dev.driver;
  j["commit"] = FLASHVK_COMMIT;
  if (o.peak)
    j["peak"] = {{"fma_gflops", o.peak->fma_gflops},
                 {"bandwidth_gbs", o.peak->bandwidth_gbs},
                 {"coopmat_gflops", o.peak->coopmat_gflops}};
  j["runs"] = o.repeat;
  j["min_time"] = o.min_time;
  j["flashd_rounds"] = o.flashd_rounds;
  j["cache_flush"] = o.flush;
  j["gpu_warm"] = o.gpu_warm;
  Json results = Json::array();
  for (const Row& r : rows) {
    const Dims& d = r.c->dims;
    Json x;
    x["kind"] = r.c->kind;
    x["variant"] = variant_name(r.variant);
    x["batch"] = d.batch;
    x["heads"] = d.heads;
    x["kv_heads"] = d.kv_heads;
    x["nq"] = d.nq;
    x["nk"] = d.nk;
    x["d"] = d.d;
    x["dv"] = d.dv;
    for (const auto& [name, value] : modifier_json(r.c->mods)) x[name] = Json::parse(value);
    x["dtype"] = dtype_name(r.c->storage.q);
    x["kv_dtype"] = dtype_name(r.c->storage.k);
    x["ms"] = r.ms;
    x["gflops"] = r.gflops;
    x["device_bytes"] = r.bytes;
    x["tile_layout"] = tile_layout_name(r.layout);
    x["block_rows"] = r.block_rows;
    x["block_keys"] = r.block_keys;
    x["splits"] = r.splits;
    x["fp16_arithmetic"] = r.fp16_arithmetic;
    if (o.peak) {
      x["peak_gflops"] = r.peak_gflops;
      x["peak_fraction"] = r.peak_fraction;
    }
    if (r.vs_flash2 > 0) x["vs_flash2"] = r.vs_flash2;
    if (r.vs_base > 0) x["vs_base"] = r.vs_base;
    x["runs_ms"] = run_list(r.runs, &Run::ms);
    if (o.peak) x["runs_peak_gflops"] = run_list(r.runs, &Run::peak_gflops);
    if (r.max_err >= 0) x["max_err"] = r.max_err;
    results.push_back(std::move(x));
  }
  j["results"] = std::move(results);
  return j.dump(1) + "\n";
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

// The shape of the options once per storage of K and V that --kv-dtype lists ("f16,q8_0,q4_0"),
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
        cases.push_back(base);
        cases.back().mods = mods;
        cases.back().with_previous = true;
      }
  return cases;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--help") != argv.end())
    return std::cout << with_modifier_help(kBenchHelp), 0;
  Args args(
      argv,
      with_modifiers(
          {"variant", "batch",      "heads",      "kv-heads",      "nq",       "nk",     "d",
           "dv",      "repeat",     "min-time",   "flashd-rounds", "json",     "device", "suite",
           "layout",  "block-rows", "block-keys", "splits",        "gpu-warm", "rope"}),
      with_modifier_flags({"check", "peak", "warm-cache", "decode-loop", "fp16-arithmetic"}));
  if (args.has("json")) check_writable(args.text("json"));  // before a long run, not after
  if (args.flag("decode-loop")) return run_decode_loop(args);
  if (args.has("rope"))
    throw UsageError{"--rope is for --decode-loop (bench times attention without RoPE)"};
  std::vector<Case> cases;
  std::string suite = args.text("suite");
  if (suite == "standard") {
    for (const std::string& shape_option :
         with_modifiers({"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv",
                         "block-rows", "block-keys", "splits"}))
      if (args.has(shape_option))
        throw UsageError{
            std::string("--suite standard fixes its shapes, storages and modifiers and runs the "
                        "engine's own tiles; drop --") +
            shape_option};
    if (args.flag("causal")) throw UsageError{"--suite standard fixes its shapes; drop --causal"};
    cases = standard_suite();
  } else if (suite == "modifiers") {
    if (args.flag("causal"))
      throw UsageError{"--suite modifiers runs causal attention as its base; drop --causal"};
    for (const std::string& option : modifier_option_names())
      if (args.has(option))
        throw UsageError{"--suite modifiers times its own modifiers on causal attention; drop --" +
                         option};
    cases = modifier_suite(args);
  } else if (args.has("suite")) {
    throw UsageError{"--suite must be 'standard' or 'modifiers', got '" + suite + "'"};
  } else {
    cases = custom_cases(args);
  }
  bool standard = suite == "standard";
  Options o;
  o.repeat = static_cast<int>(args.integer("repeat",
                                           standard               ? 1
                                           : suite == "modifiers" ? kModifierRounds
                                                                  : 3,
                                           1, 1000));
  o.min_time = args.number("min-time", standard ? kSuiteMinTime : 0);
  if (o.min_time < 0) throw UsageError{"--min-time must be at least 0 seconds"};
  o.flashd_rounds =
      static_cast<int>(args.integer("flashd-rounds", standard ? kSuiteFlashdRounds : 0, 0, 1000));
  o.vs_base =
      std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.with_previous; });
  for (const Case& c : cases) o.mask_width = std::max(o.mask_width, int(mask_text(c).size()));
  o.check = args.flag("check");
  o.flush = !args.flag("warm-cache");
  o.gpu_warm = args.number("gpu-warm", -1);
  if (args.has("gpu-warm") && o.gpu_warm < 0)
    throw UsageError{"--gpu-warm must be at least 0 seconds"};
  o.layout = parse_layout(args.text("layout", "auto"));
  o.fp16_arithmetic = args.flag("fp16-arithmetic");
  o.block_rows = static_cast<uint32_t>(args.integer("block-rows", 0, 1, 1 << 16));
  o.block_keys = static_cast<uint32_t>(args.integer("block-keys", 0, 1, 1 << 16));
  o.splits = static_cast<uint32_t>(args.integer("splits", 0, 1, 1 << 16));

  ContextOptions options;
  options.device = static_cast<int>(args.integer("device", -1, 0, 1 << 20));
  options.pipeline_cache_path = default_pipeline_cache();
  Context ctx = Context::create(options);
  if (o.gpu_warm < 0) o.gpu_warm = ctx.device().type == "cpu" ? 0.0 : 1.0;
  if (o.layout == TileLayout::cooperative_matrix && !ctx.device().cooperative_matrix)
    throw Error(
        "--layout coopmat needs cooperative matrices (VK_NV_cooperative_matrix with fp16 "
        "16x16x16 products into fp32); " +
        ctx.device().name + " has none (see `flashvk devices`)");
  // Tile sizes (and fp16 arithmetic) the device cannot run are refused before any output, by the
  // engine's message (the first case, and those of its group: --suite modifiers).
  if (o.block_rows || o.block_keys || o.fp16_arithmetic)
    for (size_t i = 0; i < cases.size() && (i == 0 || cases[i].with_previous); ++i)
      for (Variant v : cases[i].variants) warm_up(ctx, cases[i], case_params(cases[i], v, o));
  std::printf("device: %s (driver %s), median of %s%d\n", ctx.device().name.c_str(),
              ctx.device().driver.c_str(), o.min_time > 0 || o.flashd_rounds > 0 ? "at least " : "",
              o.repeat);
  if (args.flag("peak")) {
    std::fprintf(stderr, "measuring the device's peak ...\n");
    o.peak = measure_peak(ctx);
    std::printf("peak: %.2f GFLOP/s fp32 FMA, %.2f GB/s read bandwidth", o.peak->fma_gflops,
                o.peak->bandwidth_gbs);
    if (o.peak->coopmat_gflops > 0)
      std::printf(", %.2f GFLOP/s fp16 cooperative matrix", o.peak->coopmat_gflops);
    std::printf("\n");
  }
  if (cases.size() == 1 || o.vs_base) {  // one shape (a group's cases share it)
    const Dims& d = cases[0].dims;
    std::printf("shape: B=%u H=%u Hkv=%u Nq=%u Nk=%u d=%u dv=%u\n", d.batch, d.heads, d.kv_heads,
                d.nq, d.nk, d.d, d.dv);
  }
  std::printf("\n");
  std::vector<Row> rows = run_cases(ctx, cases, o);
  if (args.has("json")) write_text(args.text("json"), json(ctx.device(), o, rows));
  return 0;
}

}  // namespace flashvk::cli
