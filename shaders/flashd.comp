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
// With t = m + ln l (the chunk's max and sum of e^(s - m)) and a = m - L, w, 1 - w and the new L
// come from one exp, one division and one log, without forming t (see chunk_update).
// See docs/algorithms.md for the derivation.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float lse_run[ROWS];  // L: log of the softmax denominator of the keys seen so far
float t_tile[ROWS];   // log-sum-exp of the current tile's scores, for its weight in traces

void state_init(uint rr) {
  lse_run[rr] = start_max(rr);  // L = ln e^sink, or -inf
  [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] = 0.0;
}

void tile_begin(uint pass, uint rr) { t_tile[rr] = NEG_INF; }

#include "flashd_step.glsl"


void chunk_update(uint pass, uint c0, uint rr) {
  // The chunk's own log-sum-exp, stabilised by its local max (not a running one). A fully masked
  // chunk (m = -inf) gives w = 0 and leaves L alone; selects, not a branch, keep it so: a row's
  // branch costs register tiles more than the few operations it would skip.
  float m_chunk = chunk_max(rr);
  bool seen = m_chunk != NEG_INF;
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - m_chunk);
    l_chunk += p[ci];
  }
  l_chunk = row_sum(l_chunk);
#ifdef TRACE
  if (seen) {
    float t = m_chunk + log(l_chunk);
    float tt = t_tile[rr];
    t_tile[rr] = tt == NEG_INF ? t : max(tt, t) + softplus(-abs(tt - t));
  }
#endif
  float lse = lse_run[rr], keep, wt;
  sigma_step(seen ? m_chunk : 0.0, seen ? l_chunk : 1.0, lse, keep, wt);
  lse_run[rr] = seen ? lse : lse_run[rr];
  o_keep[rr] = seen ? keep : 1.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = p[ci] * (seen ? wt : 0.0);
}

void tile_end(uint pass, uint j0, uint rr) {
  float lse = lse_run[rr], tt = t_tile[rr];
  if (!is_traced(rows[rr]) || lse == NEG_INF) return;
  uint t = j0 / BC;
  // The tile's weight in the output: e^(t_tile - L_end), which is sigma(t_tile - L_start).
  trace_put(t, 3u, tt == NEG_INF ? 0.0 : exp(tt - lse));
  trace_put(t, 4u, lse);
  [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}

void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, 1.0);
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = lse_run[rr];
}

#include "fused_main.glsl"
