#pragma once
// float64 CPU implementations of every variant, written as the seeds' loops. The tests' oracle
// and the viewer's ground truth. Masked keys carry s = -inf and are skipped by every recurrence.
#include <cstdint>
#include <limits>
#include <vector>

#include "flashvk/attention.hpp"

namespace flashvk::reference {

using Vec = std::vector<double>;

/// What one query row holds after every key.
struct RowTrace {
  Vec m, l, w, lse;        ///< NaN where a variant does not keep the value
  std::vector<Vec> o;      ///< the variant's own output state
  Vec out;                 ///< final output
  double final_lse = 0.0;  ///< -inf when the row sees no key
};

/// Per-key recurrences of one row: s are the final scores (-inf masked), v the value rows, and
/// `sink` an attention sink's logit (-inf: none), which each recurrence starts from as a key of
/// zero value seen first (m = sink, l = 1; FLASH-D: L = sink).
constexpr double kNoSink = -std::numeric_limits<double>::infinity();
RowTrace naive_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
RowTrace online_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
RowTrace flash1_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
RowTrace flash2_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
/// FLASH-D carried as the running log-sum-exp L: w_i = sigma(s_i - L_{i-1}).
RowTrace flashd_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
/// FLASH-D exactly as docs/algorithms.md's "FLASH-D without underflow" first writes it: w_i = sigma(s_i - s_{i-1} + ln w_{i-1}), in float64,
/// or in fp32 with `in_fp32` (as a kernel would run it; it underflows sooner).
RowTrace flashd_seed_row(const Vec& s, const std::vector<Vec>& v, bool in_fp32 = false);
/// Flash-Decoding: flash2 over chunks of `chunk` keys, merged with log-sum-exp (the sink joins
/// in the merge).
RowTrace splitkv_row(const Vec& s, const std::vector<Vec>& v, uint32_t chunk,
                     double sink = kNoSink);
/// softmax(s) v by the direct formula, e^(s - max) / (sum e^(s - max) + e^(sink - max)).
RowTrace direct_row(const Vec& s, const std::vector<Vec>& v, double sink = kNoSink);
RowTrace variant_row(Variant variant, const Vec& s, const std::vector<Vec>& v, uint32_t chunk,
                     double sink = kNoSink);

/// Scores of query `row` of (batch, head) against every key, as the kernels define them: scaled,
/// softcapped, ALiBi's bias and the additive mask added, -inf outside the window and the causal
/// limit and where the key mask hides the key; `dims` from check_shapes(q, k, v).
Vec row_scores(const HostTensor& q, const HostTensor& k, const Dims& dims,
               const AttentionParams& params, uint32_t batch, uint32_t head, uint32_t row);
/// The sink logit of query head `head` (kNoSink without sinks).
double row_sink(const AttentionParams& params, uint32_t head);
/// Value rows seen by (batch, head).
std::vector<Vec> value_rows(const HostTensor& v, const Dims& dims, uint32_t batch, uint32_t head);

struct Result {
  Vec out;  ///< [B, H, Nq, dv]
  Vec lse;  ///< [B, H, Nq]
};

/// Whole attention by a variant's recurrence (RoPE applied first when asked for).
Result attention(Variant variant, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params);
/// Whole attention by the direct softmax formula (RoPE applied first when asked for).
Result direct(const HostTensor& q, const HostTensor& k, const HostTensor& v,
              const AttentionParams& params);

/// Rotary embedding of [.., N, d] in float64 (returned rounded to float32).
HostTensor rope(const HostTensor& x, const RopeParams& params);

}  // namespace flashvk::reference
