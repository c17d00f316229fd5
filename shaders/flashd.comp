#version 460
#extension GL_GOOGLE_include_directive : require
// FLASH-D (seed 000 §4): no running max and no division of the output. Each step blends the new
// value into the normalised output with a sigmoid weight, o <- o (1 - w) + v w.
//
// The seed writes w_i = sigma(s_i - s_{i-1} + ln w_{i-1}). In fp32, ln w_{i-1} underflows to -inf
// after a long run of falling scores and every later weight becomes 0. Since
// s_{i-1} - ln w_{i-1} = ln(sum_{j<i} e^{s_j}) =: L_{i-1} exactly, we carry the running
// log-sum-exp L instead: w_i = sigma(s_i - L_{i-1}), L_i = L_{i-1} + softplus(s_i - L_{i-1}).
// L is bounded by the scores themselves, so it never under- or overflows, and a masked key
// (s = -inf) gives w = 0 and leaves L alone. Per chunk of keys, the chunk's own log-sum-exp t
// plays the part of s: w = sigma(t - L), and the chunk's normalised output plays the part of v.
// See docs/algorithms.md for the derivation.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float lse_run = NEG_INF;  // L: log of the softmax denominator of the keys seen so far
float t_tile;  // log-sum-exp of the current tile's scores, for its weight in traces

void state_init() {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void tile_begin(uint pass) { t_tile = NEG_INF; }

void chunk_update(uint pass, uint c0) {
  o_hold();
  // The chunk's own log-sum-exp, stabilised by its local max (not a running one).
  float m_chunk = chunk_max();
  if (m_chunk == NEG_INF) return;  // every key of the chunk is masked: w = 0
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[ci] == NEG_INF ? 0.0 : exp(sc[ci] - m_chunk);
    l_chunk += p[ci];
  }
  float t = m_chunk + log(l_chunk);
#ifdef TRACE
  t_tile = t_tile == NEG_INF ? t : max(t_tile, t) + softplus(-abs(t_tile - t));
#endif
  float w = 1.0;  // the first visible chunk takes the whole weight
  float keep = 0.0;
  if (lse_run != NEG_INF) {
    // sigma(x), sigma(-x) = 1 - w without cancellation, and softplus(x), from one exp.
    float x = t - lse_run;
    float e = exp(-abs(x));
    float inv = 1.0 / (1.0 + e);
    w = x >= 0.0 ? inv : e * inv;
    keep = x >= 0.0 ? e * inv : inv;
    lse_run += max(x, 0.0) + (e < 1e-4 ? e - 0.5 * e * e : log(1.0 + e));
  } else {
    lse_run = t;
  }
  float wt = w / l_chunk;
  o_keep = keep;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[ci] = p[ci] * wt;
}

void tile_end(uint pass, Row r, uint j0) {
  if (!is_traced(r) || lse_run == NEG_INF) return;
  uint t = j0 / BC;
  // The tile's weight in the output: e^(t_tile - L_end), which is sigma(t_tile - L_start).
  trace_put(t, 3u, t_tile == NEG_INF ? 0.0 : exp(t_tile - lse_run));
  trace_put(t, 4u, lse_run);
  [[unroll]] for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = lse_run;
}

#include "fused_main.glsl"
