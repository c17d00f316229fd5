#pragma once
// float64 CPU implementations of every variant, written as the seeds' loops. The tests' oracle
// and the viewer's ground truth. Masked keys carry s = -inf and are skipped by every recurrence.
#include <cstdint>
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

/// Per-key recurrences of one row: s are the scaled scores (-inf masked), v the value rows.
RowTrace naive_row(const Vec& s, const std::vector<Vec>& v);
RowTrace online_row(const Vec& s, const std::vector<Vec>& v);
RowTrace flash1_row(const Vec& s, const std::vector<Vec>& v);
RowTrace flash2_row(const Vec& s, const std::vector<Vec>& v);
/// FLASH-D carried as the running log-sum-exp L: w_i = sigma(s_i - L_{i-1}).
RowTrace flashd_row(const Vec& s, const std::vector<Vec>& v);
/// FLASH-D exactly as seed 000 writes it: w_i = sigma(s_i - s_{i-1} + ln w_{i-1}), in float64,
/// or in fp32 with `in_fp32` (as a kernel would run it; it underflows sooner).
RowTrace flashd_seed_row(const Vec& s, const std::vector<Vec>& v, bool in_fp32 = false);
/// Flash-Decoding: flash1 over chunks of `chunk` keys, merged with log-sum-exp.
RowTrace splitkv_row(const Vec& s, const std::vector<Vec>& v, uint32_t chunk);
/// softmax(s) v by the direct formula, e^(s - max) / sum e^(s - max).
RowTrace direct_row(const Vec& s, const std::vector<Vec>& v);
RowTrace variant_row(Variant variant, const Vec& s, const std::vector<Vec>& v, uint32_t chunk);

/// Scaled, masked scores of query `row` of (batch, head) against every key; `dims` from
/// check_shapes(q, k, v).
Vec row_scores(const HostTensor& q, const HostTensor& k, const Dims& dims,
               const AttentionParams& params, uint32_t batch, uint32_t head, uint32_t row);
/// Value rows seen by (batch, head).
std::vector<Vec> value_rows(const HostTensor& v, const Dims& dims, uint32_t batch, uint32_t head);

struct Result {
  Vec out;  ///< [B, H, Nq, dv]
  Vec lse;  ///< [B, H, Nq]
};

/// Whole attention by a variant's recurrence (RoPE applied first when asked for).
Result attention(Variant variant, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params);
/// Whole attention by the direct softmax formula.
Result direct(const HostTensor& q, const HostTensor& k, const HostTensor& v,
              const AttentionParams& params);

/// Rotary embedding of [.., N, d] in float64 (returned rounded to float32).
HostTensor rope(const HostTensor& x, const RopeParams& params);

}  // namespace flashvk::reference
