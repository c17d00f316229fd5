#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>

#include "args.hpp"
#include "commit.hpp"
#include "flashvk.hpp"

namespace flashvk::cli {
namespace {

const char* kBenchHelp = R"(usage: flashvk bench [options]

Times each variant on random inputs with GPU timestamp queries: the median of --repeat runs
after a warm-up on a small problem of the same kind (which builds the pipeline). GFLOP/s counts
4 * B * H * Nq * Nk * d (only visible pairs when causal). Memory is what the call allocated on
the device: outputs and scratch (S for naive); the inputs are not counted.

options:
  --variant NAME|all  one variant or all six (default all)
  --batch B --heads H --kv-heads Hk --nq N --nk N --d D --dv D
                      shape (default 1, 8, H, 1024, Nq, 64, d)
  --causal            causal mask
  --dtype f32|f16     storage type (default f32)
  --layout auto|shared|registers
                      where the fused kernels keep K/V tiles (default auto)
  --suite standard    the fixed set of docs/performance.md instead of one shape: prefill
                      (B=1 H=8 N=512..4096, d=64 and 128, full and causal) and decode (Nq=1
                      H=32 Hkv=8 Nk=4096..65536 d=128), fp32 and fp16
  --peak              measure the device's FMA throughput and read bandwidth with calibration
                      shaders first, then the FMA throughput again just before each case, and
                      report each case as a fraction of the calibration next to it
  --repeat N          timed runs per case (default 3, 1 with --suite)
  --check             also report the max error against the float64 reference (slow)
  --json FILE         write every figure as JSON
  --device N          Vulkan device index

examples:
  flashvk bench --nq 512 --d 64 --causal --repeat 5 --json bench.json
  flashvk bench --suite standard --peak --json suite.json
)";

// One shape, and the variants to time on it.
struct Case {
  const char* kind;  // "prefill", "decode" or "custom"
  Dims dims;
  bool causal = false;
  DType dtype = DType::f32;
  std::vector<Variant> variants;
};

struct Row {
  const Case* c;
  Variant variant;
  double ms = 0, gflops = 0, max_err = -1;
  double peak_gflops = 0;  // --peak: the FMA calibration run just before this case
  uint64_t bytes = 0;
};

Dims make_dims(uint32_t b, uint32_t h, uint32_t hkv, uint32_t nq, uint32_t nk, uint32_t d,
               uint32_t dv) {
  Dims dims;
  dims.batch = b, dims.heads = h, dims.kv_heads = hkv, dims.nq = nq, dims.nk = nk;
  dims.d = d, dims.dv = dv;
  return dims;
}

double visible_pairs(const Dims& d, bool causal) {
  if (!causal) return double(d.nq) * d.nk;
  double pairs = 0;
  for (uint32_t i = 0; i < d.nq; ++i)
    pairs += std::clamp<double>(double(i) + d.nk - d.nq + 1, 0, d.nk);
  return pairs;
}

double case_flops(const Case& c) {
  return 4.0 * c.dims.batch * c.dims.heads * visible_pairs(c.dims, c.causal) * c.dims.d;
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
          Case c{"prefill", make_dims(1, 8, 8, n, n, d, d), causal, dtype, fused};
          if (dtype == DType::f32 && d == 64) c.variants.insert(c.variants.begin(), Variant::naive);
          cases.push_back(c);
        }
  for (DType dtype : {DType::f32, DType::f16})
    for (uint32_t nk : {4096u, 16384u, 65536u})
      cases.push_back({"decode",
                       make_dims(1, 32, 8, 1, nk, 128, 128),
                       false,
                       dtype,
                       {Variant::flash2, Variant::flashd, Variant::splitkv}});
  return cases;
}

// Builds the variant's pipeline on a small problem of the same kind, so the timed runs
// measure the kernel and not the driver's compiler.
void warm_up(Context& ctx, const Case& c, const AttentionParams& params) {
  Dims small = c.dims;
  small.nq = std::min(small.nq, 64u);
  small.nk = std::min(small.nk, 64u);
  Inputs in = make_inputs(small);
  attention(ctx, in.q, in.k, in.v, params, c.dtype);
}

double median_ms(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionParams& params, int repeat, uint64_t* bytes) {
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) {
    AttentionResult r = attention(ctx, q, k, v, params);
    *bytes = r.device_bytes;
    times.push_back(r.gpu_ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double check_error(Context& ctx, const Inputs& in, const AttentionParams& params, DType dtype) {
  HostAttentionResult r = attention(ctx, in.q, in.k, in.v, params, dtype);
  reference::Result ref = reference::direct(in.q, in.k, in.v, params);
  double err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i)
    err = std::max(err, std::abs(double(r.out.data[i]) - ref.out[i]));
  return err;
}

struct Options {
  int repeat = 3;
  bool check = false;
  TileLayout layout = TileLayout::automatic;
  std::optional<DevicePeak> peak;
};

void print_header(const Options& o) {
  std::printf("%-7s %-5s %6s %6s %5s %6s %-8s %11s %9s %s%11s%s\n", "kind", "dtype", "Nq", "Nk",
              "d", "mask", "variant", "time (ms)", "GFLOP/s", o.peak ? " of peak " : "",
              "memory MiB", o.check ? "  max error" : "");
}

void print_row(const Row& r, const Options& o) {
  const Dims& d = r.c->dims;
  std::printf("%-7s %-5s %6u %6u %5u %6s %-8s %11.2f %9.2f", r.c->kind, dtype_name(r.c->dtype),
              d.nq, d.nk, d.d, r.c->causal ? "causal" : "full", variant_name(r.variant), r.ms,
              r.gflops);
  if (o.peak) std::printf(" %7.1f%% ", 100.0 * r.gflops / r.peak_gflops);
  std::printf("%11.2f", double(r.bytes) / (1 << 20));
  if (r.max_err >= 0) std::printf("  %9.2e", r.max_err);
  std::printf("\n");
  std::fflush(stdout);
}

// Progress on stderr: one line per case, rewritten in place on a terminal.
void progress(size_t done, size_t total, const Case& c, Variant v, double elapsed_s) {
  bool tty = isatty(2);
  std::fprintf(stderr, "%s[%zu/%zu] %s %s N=%u/%u d=%u %s  (%.0f s so far)%s",
               tty ? "\r\033[K" : "", done + 1, total, c.kind, variant_name(v), c.dims.nq,
               c.dims.nk, c.dims.d, dtype_name(c.dtype), elapsed_s, tty ? "" : "\n");
  std::fflush(stderr);
}

std::vector<Row> run_cases(Context& ctx, const std::vector<Case>& cases, const Options& o) {
  size_t total = 0, done = 0;
  for (const Case& c : cases) total += c.variants.size();
  auto start = std::chrono::steady_clock::now();
  std::vector<Row> rows;
  print_header(o);
  for (const Case& c : cases) {
    Inputs in = make_inputs(c.dims);
    Tensor tq, tk, tv;
    try {
      tq = Tensor::upload(ctx, in.q, c.dtype);
      tk = Tensor::upload(ctx, in.k, c.dtype);
      tv = Tensor::upload(ctx, in.v, c.dtype);
    } catch (const Error& e) {
      if (cases.size() == 1) throw;
      // One shape beyond this device's limits does not cost the rest of a long suite.
      std::printf("%-7s %-5s %6u %6u %5u  not run: %s\n", c.kind, dtype_name(c.dtype), c.dims.nq,
                  c.dims.nk, c.dims.d, e.what());
      done += c.variants.size();
      continue;
    }
    for (Variant variant : c.variants) {
      double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      progress(done++, total, c, variant, elapsed);
      AttentionParams params;
      params.variant = variant;
      params.causal = c.causal;
      params.want_lse = false;
      if (variant != Variant::naive) params.tile_layout = o.layout;
      warm_up(ctx, c, params);
      Row r{&c, variant};
      // The machine's speed drifts (a shared CPU: 70-110 GFLOP/s within minutes here), so each
      // case is set against a calibration taken just before it.
      if (o.peak) r.peak_gflops = measure_fma_peak(ctx);
      r.ms = median_ms(ctx, tq, tk, tv, params, o.repeat, &r.bytes);
      r.gflops = r.ms > 0 ? case_flops(c) / (r.ms * 1e6) : 0;
      if (o.check) r.max_err = check_error(ctx, in, params, c.dtype);
      if (isatty(2)) std::fprintf(stderr, "\r\033[K");
      print_row(r, o);
      rows.push_back(r);
    }
  }
  double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "%zu runs in %.1f s\n", rows.size(), total_s);
  if (o.peak && !rows.empty()) {
    auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.peak_gflops < b.peak_gflops;
    });
    std::printf("FMA peak next to the cases: %.2f to %.2f GFLOP/s\n", lo->peak_gflops,
                hi->peak_gflops);
  }
  return rows;
}

std::string json(const DeviceInfo& dev, const Options& o, const std::vector<Row>& rows) {
  std::string s = "{\"device\": \"" + dev.name + "\", \"driver\": \"" + dev.driver +
                  "\", \"commit\": \"" FLASHVK_COMMIT "\"";
  char buf[640];
  if (o.peak) {
    std::snprintf(buf, sizeof buf, ", \"peak\": {\"fma_gflops\": %.6g, \"bandwidth_gbs\": %.6g}",
                  o.peak->fma_gflops, o.peak->bandwidth_gbs);
    s += buf;
  }
  s += ", \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const Dims& d = r.c->dims;
    std::snprintf(
        buf, sizeof buf,
        "%s\n  {\"kind\": \"%s\", \"variant\": \"%s\", \"batch\": %u, \"heads\": %u, "
        "\"kv_heads\": %u, \"nq\": %u, \"nk\": %u, \"d\": %u, \"dv\": %u, \"causal\": %s, "
        "\"dtype\": \"%s\", \"ms\": %.6g, \"gflops\": %.6g, \"device_bytes\": %llu",
        i ? "," : "", r.c->kind, variant_name(r.variant), d.batch, d.heads, d.kv_heads, d.nq, d.nk,
        d.d, d.dv, r.c->causal ? "true" : "false", dtype_name(r.c->dtype), r.ms, r.gflops,
        static_cast<unsigned long long>(r.bytes));
    s += buf;
    if (o.peak) {
      std::snprintf(buf, sizeof buf, ", \"peak_gflops\": %.6g, \"peak_fraction\": %.4g",
                    r.peak_gflops, r.gflops / r.peak_gflops);
      s += buf;
    }
    if (r.max_err >= 0) {
      std::snprintf(buf, sizeof buf, ", \"max_err\": %.3g", r.max_err);
      s += buf;
    }
    s += "}";
  }
  return s + "\n]}\n";
}

TileLayout parse_layout(const std::string& text) {
  if (text == "auto") return TileLayout::automatic;
  if (text == "shared") return TileLayout::shared;
  if (text == "registers") return TileLayout::registers;
  throw UsageError{"--layout must be auto, shared or registers, got '" + text + "'"};
}

// The one shape given by --batch, --heads, ... for the chosen variants.
Case custom_case(const Args& args) {
  const int64_t big = 1 << 24;
  auto batch = args.integer("batch", 1, 1, 4096);
  auto heads = args.integer("heads", 8, 1, 4096);
  auto kv_heads = args.integer("kv-heads", heads, 1, 4096);
  auto nq = args.integer("nq", 1024, 1, big);
  auto nk = args.integer("nk", nq, 1, big);
  auto d = args.integer("d", 64, 1, 256);
  auto dv = args.integer("dv", d, 1, 256);
  std::string dtype_text = args.text("dtype", "f32");
  if (dtype_text != "f32" && dtype_text != "f16")
    throw UsageError{"--dtype must be f32 or f16, got '" + dtype_text + "'"};
  Case c{"custom"};
  // check_shapes gives the usual messages for heads that do not divide, and so on.
  std::vector<int64_t> qs{batch, heads, nq, d}, ks{batch, kv_heads, nk, d},
      vs{batch, kv_heads, nk, dv};
  c.dims = check_shapes(qs, ks, vs);
  c.causal = args.flag("causal");
  c.dtype = dtype_text == "f16" ? DType::f16 : DType::f32;
  c.variants = all_variants();
  if (args.text("variant", "all") != "all") {
    try {
      c.variants = {parse_variant(args.text("variant"))};
    } catch (const Error& e) {
      throw UsageError{std::string("--variant: ") + e.what()};
    }
  }
  return c;
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--help") != argv.end())
    return std::cout << kBenchHelp, 0;
  Args args(argv,
            {"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv", "dtype", "repeat",
             "json", "device", "suite", "layout"},
            {"causal", "check", "peak"});
  std::vector<Case> cases;
  if (args.has("suite")) {
    if (args.text("suite") != "standard")
      throw UsageError{"--suite must be 'standard', got '" + args.text("suite") + "'"};
    for (const char* shape_option :
         {"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv", "dtype"})
      if (args.has(shape_option))
        throw UsageError{std::string("--suite standard fixes the shapes; drop --") + shape_option};
    cases = standard_suite();
  } else {
    cases = {custom_case(args)};
  }
  Options o;
  o.repeat = static_cast<int>(args.integer("repeat", args.has("suite") ? 1 : 3, 1, 1000));
  o.check = args.flag("check");
  o.layout = parse_layout(args.text("layout", "auto"));

  ContextOptions options;
  options.device = static_cast<int>(args.integer("device", -1, 0, 1 << 20));
  options.pipeline_cache_path = default_pipeline_cache();
  Context ctx = Context::create(options);
  std::printf("device: %s (driver %s), median of %d\n", ctx.device().name.c_str(),
              ctx.device().driver.c_str(), o.repeat);
  if (args.flag("peak")) {
    std::fprintf(stderr, "measuring the device's peak ...\n");
    o.peak = measure_peak(ctx);
    std::printf("peak: %.2f GFLOP/s fp32 FMA, %.2f GB/s read bandwidth\n", o.peak->fma_gflops,
                o.peak->bandwidth_gbs);
  }
  if (cases.size() == 1) {
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
