#pragma once
// The device's own limits, measured: the roofline that `flashvk bench --peak` reports against.
#include "flashvk/context.hpp"

namespace flashvk {

struct DevicePeak {
  double fma_gflops = 0;     ///< fp32 fused multiply-add throughput, 2 FLOPs per FMA
  double bandwidth_gbs = 0;  ///< read bandwidth of a storage buffer, 1e9 bytes per second
};

/// Runs two small calibration shaders (shaders/peak_fma.comp and peak_bandwidth.comp), each
/// sized until one run takes at least `min_ms` of GPU time, and returns the best of `repeat`.
DevicePeak measure_peak(Context& ctx, int repeat = 3, double min_ms = 100.0);

/// The FMA part of measure_peak alone (GFLOP/s): quick enough to repeat next to each timed
/// case on a machine whose speed drifts (a shared CPU).
double measure_fma_peak(Context& ctx, int repeat = 2, double min_ms = 50.0);

}  // namespace flashvk
