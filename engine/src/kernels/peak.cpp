// Host side of the calibration shaders behind measure_peak(): peak_fma.comp and
// peak_bandwidth.comp, timed with the same timestamp queries as attention.
#include "flashvk/tools/peak.hpp"

#include <algorithm>

#include "../plan.hpp"

namespace flashvk {

namespace {

constexpr uint32_t kGroupSize = 64;

// GPU milliseconds of one dispatch of `shader` over `groups` workgroups.
double time_dispatch(Context& ctx, const char* shader, VkBuffer input, VkBuffer output,
                     uint32_t groups, uint32_t iterations, MatrixApi matrix = MatrixApi::none,
                     MatrixShape shape = kMatrixShapes[0]) {
  detail::Plan plan(ctx);
  detail::Bindings b;
  b.fill(ctx.impl().dummy.handle());
  if (input) b[detail::kQ] = input;
  b[detail::kO] = output;
  detail::Push push{};
  push.nk = iterations;
  push.scale = 0.999f;
  detail::Spec spec;
  spec.workgroup = kGroupSize;
  spec.layout = TileLayout::cooperative_matrix;  // its subgroups as the attention kernel's
  spec.matrix = matrix;
  spec.subgroup = shape.subgroup;
  spec.cm_m = shape.m;
  spec.cm_n = shape.n;
  detail::KernelKey key{.program = shader, .matrix = matrix};
  plan.add(
      ctx.impl().pipeline(
          detail::find_build(detail::peak_shader_blobs(), detail::kernel_name(key)), spec),
      plan.make_set(b), {groups, 1, 1}, &push, sizeof(push));
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { plan.record(cmd); });
  return plan.gpu_ms();
}

double fma_flops(uint32_t groups, uint32_t iterations) {
  return double(groups) * kGroupSize * iterations * 8 * 8 * 4 * 2;
}

uint32_t fma_groups(Context& ctx) {
  return ctx.device().type == "cpu" ? 64 : 4096;
}

// The read shader's grid: each invocation reads a run of vec4s.
constexpr uint32_t kReadGroups = 1024, kReadThreads = kReadGroups * kGroupSize;

// The largest buffer of at most `at_most` bytes that one binding can see and the grid covers
// evenly (vec4 runs a multiple of 4 long).
uint64_t read_size(const DeviceInfo& info, uint64_t at_most) {
  uint64_t bytes = std::min({info.max_storage_buffer_range, info.max_allocation, at_most});
  uint64_t per_thread = bytes / 16 / kReadThreads / 4 * 4;
  return per_thread * kReadThreads * 16;
}

double read_ms(Context& ctx, const detail::Buffer& in, const detail::Buffer& out) {
  auto per_thread = static_cast<uint32_t>(in.bytes() / 16 / kReadThreads);
  return time_dispatch(ctx, "peak_bandwidth", in.handle(), out.handle(), kReadGroups, per_thread);
}

// Reads a buffer as large as one binding allows (at most 256 MiB), best of `repeat`.
double bandwidth_gbs(Context& ctx, int repeat) {
  detail::Buffer in(ctx.impl(), read_size(ctx.device(), uint64_t(256) << 20));
  in.fill(0);
  detail::Buffer out(ctx.impl(), uint64_t(kReadThreads) * 4);
  double ms = 0;
  for (int i = 0; i < repeat + 1; ++i) {  // the first run warms caches and page tables
    double t = read_ms(ctx, in, out);
    if (i == 1 || (i > 1 && t < ms)) ms = t;
  }
  return ms > 0 ? double(in.bytes()) / (ms * 1e6) : 0;
}

}  // namespace

struct FmaProbe::Output {
  detail::Buffer buffer;
};

// Doubles the FMA loop until a run is long enough to time.
FmaProbe::FmaProbe(Context& ctx, double min_ms)
    : ctx_(&ctx),
      out_(std::make_unique<Output>(
          Output{detail::Buffer(ctx.impl(), uint64_t(fma_groups(ctx)) * kGroupSize * 4)})) {
  while (iterations_ < 32768 && run_ms() < min_ms) iterations_ *= 2;
}

FmaProbe::~FmaProbe() = default;

double FmaProbe::run_ms() {
  return time_dispatch(*ctx_, "peak_fma", VK_NULL_HANDLE, out_->buffer.handle(), fma_groups(*ctx_),
                       iterations_);
}

double FmaProbe::gflops() {
  double ms = run_ms();
  return ms > 0 ? fma_flops(fma_groups(*ctx_), iterations_) / (ms * 1e6) : 0;
}

double measure_fma_peak(Context& ctx, int repeat, double min_ms) {
  if (repeat < 1) throw Error("measure_fma_peak: repeat must be at least 1");
  FmaProbe probe(ctx, min_ms);
  double best = 0;
  for (int i = 0; i < repeat; ++i) best = std::max(best, probe.gflops());
  return best;
}

double measure_coopmat_peak(Context& ctx, int repeat, double min_ms) {
  if (repeat < 1) throw Error("measure_coopmat_peak: repeat must be at least 1");
  MatrixApi api = ctx.impl().matrix_api;
  if (!on_matrix_units(api)) return 0;  // no matrix units
  if (api == MatrixApi::nv2) api = MatrixApi::khr;  // the same units, through khr's products
  const MatrixShape shape = ctx.device().matrix_shape;  // the attention kernels'
  constexpr uint32_t kGroups = 4096;
  const uint32_t subgroups = kGroupSize / shape.subgroup;
  detail::Buffer out(ctx.impl(), uint64_t(kGroups) * subgroups * shape.m * shape.n * 4);
  uint32_t iterations = 16;
  auto run = [&] {
    return time_dispatch(ctx, "peak_coopmat", VK_NULL_HANDLE, out.handle(), kGroups, iterations,
                         api, shape);
  };
  while (iterations < (1u << 20) && run() < min_ms) iterations *= 2;
  double flops =
      double(kGroups) * subgroups * iterations * 8 * 2 * shape.m * shape.n * double(shape.k);
  double best = 0;
  for (int i = 0; i < repeat; ++i) {
    double ms = run();
    if (ms > 0) best = std::max(best, flops / (ms * 1e6));
  }
  return best;
}

struct CacheFlush::Buffers {
  detail::Buffer bytes;
};

CacheFlush::CacheFlush(Context& ctx)
    : ctx_(&ctx),
      buffers_(std::make_unique<Buffers>(Buffers{detail::Buffer(
          ctx.impl(), std::min(ctx.device().max_allocation, uint64_t(128) << 20))})) {}

CacheFlush::~CacheFlush() = default;

// Writes evict as well as reads do, and a fill costs the device only its bandwidth: reading
// through a shader took llvmpipe 110 ms, eight times a fill's cost, and dominated short runs.
void CacheFlush::run() {
  VkBuffer buffer = buffers_->bytes.handle();
  ctx_->impl().submit_and_wait(
      [&](VkCommandBuffer cmd) { vkCmdFillBuffer(cmd, buffer, 0, VK_WHOLE_SIZE, ++word_); });
}

DevicePeak measure_peak(Context& ctx, int repeat, double min_ms) {
  if (repeat < 1) throw Error("measure_peak: repeat must be at least 1");
  DevicePeak peak;
  peak.fma_gflops = measure_fma_peak(ctx, repeat, min_ms);
  peak.bandwidth_gbs = bandwidth_gbs(ctx, repeat);
  peak.coopmat_gflops = measure_coopmat_peak(ctx, repeat, min_ms);
  return peak;
}

}  // namespace flashvk
