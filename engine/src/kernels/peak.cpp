// Host side of the calibration shaders behind measure_peak(): peak_fma.comp and
// peak_bandwidth.comp, timed with the same timestamp queries as attention.
#include "flashvk/peak.hpp"

#include <algorithm>

#include "../plan.hpp"

namespace flashvk {

namespace {

constexpr uint32_t kGroupSize = 64;

// GPU milliseconds of one dispatch of `shader` over `groups` workgroups.
double time_dispatch(Context& ctx, const char* shader, VkBuffer input, VkBuffer output,
                     uint32_t groups, uint32_t iterations) {
  detail::Plan plan(ctx);
  detail::Bindings b;
  b.fill(ctx.impl().dummy.handle());
  if (input) b[detail::kQ] = input;
  b[detail::kO] = output;
  detail::Push push{};
  push.nk = iterations;
  push.scale = 0.999f;
  detail::Spec spec;
  spec.rows = kGroupSize;
  plan.add(ctx.impl().pipeline(shader, spec), plan.make_set(b), {groups, 1, 1}, &push,
           sizeof(push));
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { plan.record(cmd); });
  return plan.gpu_ms();
}

// Doubles the FMA loop until a run is long enough to time, then keeps the best of `repeat`.
double fma_gflops(Context& ctx, int repeat, double min_ms) {
  uint32_t groups = ctx.device().type == "cpu" ? 64 : 4096;
  detail::Buffer out(ctx.impl(), uint64_t(groups) * kGroupSize * 4);
  uint32_t iterations = 16;
  double ms = time_dispatch(ctx, "peak_fma_f32", VK_NULL_HANDLE, out.handle(), groups, iterations);
  while (ms < min_ms && iterations < 32768) {
    iterations *= 2;
    ms = time_dispatch(ctx, "peak_fma_f32", VK_NULL_HANDLE, out.handle(), groups, iterations);
  }
  for (int i = 1; i < repeat; ++i)
    ms = std::min(
        ms, time_dispatch(ctx, "peak_fma_f32", VK_NULL_HANDLE, out.handle(), groups, iterations));
  double flops = double(groups) * kGroupSize * iterations * 8 * 8 * 4 * 2;
  return ms > 0 ? flops / (ms * 1e6) : 0;
}

// Reads a buffer as large as one binding allows (at most 256 MiB), best of `repeat`.
double bandwidth_gbs(Context& ctx, int repeat) {
  const DeviceInfo& info = ctx.device();
  uint64_t bytes =
      std::min<uint64_t>({info.max_storage_buffer_range, info.max_allocation, uint64_t(256) << 20});
  const uint32_t groups = 1024, threads = groups * kGroupSize;
  uint32_t per_thread = static_cast<uint32_t>(bytes / 16 / threads) / 4 * 4;
  bytes = uint64_t(per_thread) * threads * 16;
  detail::Buffer in(ctx.impl(), bytes);
  in.fill(0);
  detail::Buffer out(ctx.impl(), uint64_t(threads) * 4);
  double ms = 0;
  for (int i = 0; i < repeat + 1; ++i) {  // the first run warms caches and page tables
    double t =
        time_dispatch(ctx, "peak_bandwidth_f32", in.handle(), out.handle(), groups, per_thread);
    if (i == 1 || (i > 1 && t < ms)) ms = t;
  }
  return ms > 0 ? double(bytes) / (ms * 1e6) : 0;
}

}  // namespace

double measure_fma_peak(Context& ctx, int repeat, double min_ms) {
  if (repeat < 1) throw Error("measure_fma_peak: repeat must be at least 1");
  return fma_gflops(ctx, repeat, min_ms);
}

DevicePeak measure_peak(Context& ctx, int repeat, double min_ms) {
  if (repeat < 1) throw Error("measure_peak: repeat must be at least 1");
  DevicePeak peak;
  peak.fma_gflops = measure_fma_peak(ctx, repeat, min_ms);
  peak.bandwidth_gbs = bandwidth_gbs(ctx, repeat);
  return peak;
}

}  // namespace flashvk
