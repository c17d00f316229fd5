#pragma once
// Benchmark tooling, outside the API an application uses (flashvk.hpp does not include it): the
// device's own limits, measured, the roofline that `flashvk bench --peak` reports against, and
// a cache flush between timed runs.
#include <cstdint>
#include <memory>

#include "flashvk/context.hpp"

namespace flashvk {

struct DevicePeak {
  double fma_gflops = 0;     ///< fp32 fused multiply-add throughput, 2 FLOPs per FMA
  double bandwidth_gbs = 0;  ///< read bandwidth of a storage buffer, 1e9 bytes per second
  /// fp16 x fp16 + fp32 matrix-unit throughput (shaders/peak_coopmat.comp); 0 where the context
  /// cannot run cooperative matrices (DeviceInfo::cooperative_matrix).
  double coopmat_gflops = 0;
};

/// Runs two small calibration shaders (shaders/peak_fma.comp and peak_bandwidth.comp), each
/// sized until one run takes at least `min_ms` of GPU time, and returns the best of `repeat`.
DevicePeak measure_peak(Context& ctx, int repeat = 3, double min_ms = 100.0);

/// The cooperative-matrix part of measure_peak alone (GFLOP/s); 0 without cooperative matrices.
double measure_coopmat_peak(Context& ctx, int repeat = 3, double min_ms = 50.0);

/// The FMA part of measure_peak alone (GFLOP/s).
double measure_fma_peak(Context& ctx, int repeat = 2, double min_ms = 50.0);

/// The FMA calibration sized once, then cheap to repeat: on a machine whose speed drifts (a
/// shared CPU), `flashvk bench --peak` reads it next to every timed run.
class FmaProbe {
 public:
  explicit FmaProbe(Context& ctx, double min_ms = 30.0);
  ~FmaProbe();
  FmaProbe(const FmaProbe&) = delete;
  FmaProbe& operator=(const FmaProbe&) = delete;
  double gflops();  ///< one timed run of the calibration shader

 private:
  double run_ms();
  struct Output;  // the shader's output buffer, allocated once
  Context* ctx_;
  std::unique_ptr<Output> out_;
  uint32_t iterations_ = 16;
};

/// Fills a buffer larger than any cache (128 MiB, or the largest allocation) on the device, so
/// the next dispatch finds its inputs in device memory: as a decode step finds its KV cache
/// after the rest of a model's layer has run. The buffer is allocated once, at construction.
class CacheFlush {
 public:
  explicit CacheFlush(Context& ctx);
  ~CacheFlush();
  CacheFlush(const CacheFlush&) = delete;
  CacheFlush& operator=(const CacheFlush&) = delete;
  void run();

 private:
  struct Buffers;
  Context* ctx_;
  std::unique_ptr<Buffers> buffers_;
  uint32_t word_ = 0;  // a new value each run, so no driver can skip a fill as redundant
};

}  // namespace flashvk
