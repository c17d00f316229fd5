#pragma once
// trace(): what one query row's recurrence holds after every key and after every tile,
// recorded on the GPU by trace builds of the real kernels.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flashvk/attention.hpp"

namespace flashvk {

/// State after each step. A value a variant does not keep is NaN (null in JSON): flashd keeps no
/// m or l, only the running log-sum-exp. For masked keys s is -inf and w is 0.
struct TraceSeries {
  std::vector<float> s;               ///< scaled score (per-key series only)
  std::vector<float> m;               ///< running max
  std::vector<float> l;               ///< running denominator, relative to m
  std::vector<float> w;               ///< weight of the new key (or tile) in the normalised output
  std::vector<float> lse;             ///< running log-sum-exp, m + ln l
  std::vector<std::vector<float>> o;  ///< the variant's own output state (flash2: unnormalised)
  size_t size() const { return w.size(); }
};

/// One split of splitkv as it enters the log-sum-exp merge.
struct TraceSplit {
  uint32_t begin = 0, end = 0;  ///< keys [begin, end)
  float m = 0.0f, l = 0.0f;
  std::vector<float> o;  ///< normalised
};

struct Trace {
  Variant variant = Variant::flash2;
  uint32_t batch = 0, head = 0, row = 0;
  uint32_t keys = 0, dim = 0, dim_v = 0;
  float scale = 1.0f;
  uint32_t heads = 1;  ///< query heads of the input, for the row's ALiBi slope
  /// The score modifiers the row was traced with (the trace JSON names them as the row met them:
  /// its window, softcap, ALiBi slope and sink; modifier_json()).
  Modifiers mods;
  std::string device;
  TraceSeries steps;       ///< one entry per key: the per-key recurrence (Bc = 1)
  uint32_t tile_size = 0;  ///< keys per tile of the tiled kernel (0: naive, untiled softmax)
  TraceSeries tiles;       ///< one entry per tile of the tiled kernel
  std::vector<TraceSplit> splits;
  std::vector<float> out;
  float lse = 0.0f;
};

/// Traces query `row` of (batch, head), Q, K and V uploaded in `storage` (attention()'s).
/// Throws Error when an index is out of range.
Trace trace(Context& ctx, const HostTensor& q, const HostTensor& k, const HostTensor& v,
            const AttentionParams& params, uint32_t batch, uint32_t head, uint32_t row,
            Storage storage = {});

/// The trace JSON of DESIGN.md / docs/formats.md.
std::string trace_to_json(const Trace& trace);

}  // namespace flashvk
