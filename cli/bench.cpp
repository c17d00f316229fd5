#include "bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "args.hpp"
#include "flashvk.hpp"

namespace flashvk::cli {
namespace {

const char* kBenchHelp = R"(usage: flashvk bench [options]

Times each variant on random inputs with GPU timestamp queries: the median of --repeat runs
after one warm-up. GFLOP/s counts 4 * B * H * Nq * Nk * d (only visible pairs when causal).
Memory is what the call allocated on the device: outputs and scratch (S for naive).

options:
  --variant NAME|all  one variant or all six (default all)
  --batch B --heads H --kv-heads Hk --nq N --nk N --d D --dv D
                      shape (default 1, 8, H, 1024, Nq, 64, d)
  --causal            causal mask
  --dtype f32|f16     storage type (default f32)
  --repeat N          timed runs per variant (default 3)
  --check             also report the max error against the float64 reference (slow)
  --json FILE         write every figure as JSON
  --device N          Vulkan device index

example:
  flashvk bench --nq 512 --d 64 --causal --repeat 5 --json bench.json
)";

struct Row {
  Variant variant;
  double ms = 0, gflops = 0, max_err = -1;
  uint64_t bytes = 0;
};

double visible_pairs(const Dims& d, bool causal) {
  if (!causal) return double(d.nq) * d.nk;
  double pairs = 0;
  for (uint32_t i = 0; i < d.nq; ++i)
    pairs += std::clamp<double>(double(i) + d.nk - d.nq + 1, 0, d.nk);
  return pairs;
}

HostTensor random_input(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : t.data) x = dist(rng);
  return t;
}

double measure(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionParams& params, int repeat, uint64_t* bytes) {
  AttentionResult warm = attention(ctx, q, k, v, params);
  *bytes = warm.device_bytes;
  std::vector<double> times;
  for (int i = 0; i < repeat; ++i) times.push_back(attention(ctx, q, k, v, params).gpu_ms);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double check_error(Context& ctx, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                   const AttentionParams& params, DType dtype) {
  HostAttentionResult r = attention(ctx, q, k, v, params, dtype);
  reference::Result ref = reference::direct(q, k, v, params);
  double err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i)
    err = std::max(err, std::abs(double(r.out.data[i]) - ref.out[i]));
  return err;
}

std::string json(const DeviceInfo& dev, const Dims& d, bool causal, DType dtype,
                 const std::vector<Row>& rows) {
  std::string s = "{\"device\": \"" + dev.name + "\", \"driver\": \"" + dev.driver +
                  "\", \"commit\": \"" FLASHVK_COMMIT "\", \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    char buf[512];
    std::snprintf(
        buf, sizeof buf,
        "%s\n  {\"variant\": \"%s\", \"batch\": %u, \"heads\": %u, \"kv_heads\": %u, "
        "\"nq\": %u, \"nk\": %u, \"d\": %u, \"dv\": %u, \"causal\": %s, \"dtype\": \"%s\", "
        "\"ms\": %.6g, \"gflops\": %.6g, \"device_bytes\": %llu",
        i ? "," : "", variant_name(r.variant), d.batch, d.heads, d.kv_heads, d.nq, d.nk, d.d, d.dv,
        causal ? "true" : "false", dtype_name(dtype), r.ms, r.gflops,
        static_cast<unsigned long long>(r.bytes));
    s += buf;
    if (r.max_err >= 0) {
      std::snprintf(buf, sizeof buf, ", \"max_err\": %.3g", r.max_err);
      s += buf;
    }
    s += "}";
  }
  return s + "\n]}\n";
}

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--help") != argv.end())
    return std::cout << kBenchHelp, 0;
  Args args(argv,
            {"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv", "dtype", "repeat",
             "json", "device"},
            {"causal", "check"});
  const int64_t big = 1 << 24;
  auto batch = args.integer("batch", 1, 1, 4096);
  auto heads = args.integer("heads", 8, 1, 4096);
  auto kv_heads = args.integer("kv-heads", heads, 1, 4096);
  auto nq = args.integer("nq", 1024, 1, big);
  auto nk = args.integer("nk", nq, 1, big);
  auto d = args.integer("d", 64, 1, 256);
  auto dv = args.integer("dv", d, 1, 256);
  int repeat = static_cast<int>(args.integer("repeat", 3, 1, 1000));
  std::string dtype_text = args.text("dtype", "f32");
  if (dtype_text != "f32" && dtype_text != "f16")
    throw UsageError{"--dtype must be f32 or f16, got '" + dtype_text + "'"};
  DType dtype = dtype_text == "f16" ? DType::f16 : DType::f32;
  std::vector<Variant> variants = all_variants();
  if (args.text("variant", "all") != "all") {
    try {
      variants = {parse_variant(args.text("variant"))};
    } catch (const Error& e) {
      throw UsageError{std::string("--variant: ") + e.what()};
    }
  }
  HostTensor q = random_input({batch, heads, nq, d}, 1),
             k = random_input({batch, kv_heads, nk, d}, 2),
             v = random_input({batch, kv_heads, nk, dv}, 3);
  Dims dims = check_shapes(q.shape, k.shape, v.shape);
  ContextOptions options;
  options.device = static_cast<int>(args.integer("device", -1, 0, 1 << 20));
  Context ctx = Context::create(options);
  Tensor tq = Tensor::upload(ctx, q, dtype), tk = Tensor::upload(ctx, k, dtype),
         tv = Tensor::upload(ctx, v, dtype);
  bool causal = args.flag("causal");
  double flops = 4.0 * dims.batch * dims.heads * visible_pairs(dims, causal) * dims.d;

  std::printf(
      "device: %s\nshape: B=%lld H=%lld Hkv=%lld Nq=%lld Nk=%lld d=%lld dv=%lld %s %s, median of "
      "%d\n\n",
      ctx.device().name.c_str(), (long long)batch, (long long)heads, (long long)kv_heads,
      (long long)nq, (long long)nk, (long long)d, (long long)dv, causal ? "causal" : "full",
      dtype_name(dtype), repeat);
  std::printf("%-8s %12s %10s %12s%s\n", "variant", "time (ms)", "GFLOP/s", "memory (MiB)",
              args.flag("check") ? "    max error" : "");
  std::vector<Row> rows;
  for (size_t i = 0; i < variants.size(); ++i) {
    if (isatty(2))
      std::fprintf(stderr, "[%zu/%zu] %s ...\r", i + 1, variants.size(), variant_name(variants[i]));
    AttentionParams params;
    params.variant = variants[i];
    params.causal = causal;
    params.want_lse = false;
    Row r{variants[i]};
    r.ms = measure(ctx, tq, tk, tv, params, repeat, &r.bytes);
    r.gflops = r.ms > 0 ? flops / (r.ms * 1e6) : 0;
    if (args.flag("check")) r.max_err = check_error(ctx, q, k, v, params, dtype);
    std::printf("%-8s %12.3f %10.2f %12.2f", variant_name(r.variant), r.ms, r.gflops,
                double(r.bytes) / (1 << 20));
    if (r.max_err >= 0) std::printf("    %.2e", r.max_err);
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(r);
  }
  if (args.has("json")) {
    std::string path = args.text("json"), tmp = path + ".tmp." + std::to_string(::getpid());
    std::ofstream(tmp) << json(ctx.device(), dims, causal, dtype, rows);
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw Error("output file '" + path + "': cannot write");
    }
  }
  return 0;
}

}  // namespace flashvk::cli
