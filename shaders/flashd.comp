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
// (s = -inf) gives w = 0 and leaves L alone. Per tile, the tile's own log-sum-exp t plays the
// part of s: w = sigma(t - L), and the tile's normalised output plays the part of v.
// See docs/algorithms.md for the derivation.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float lse_run = NEG_INF;  // L: log of the softmax denominator of the keys seen so far
float o_acc[DV];          // normalised output

void state_init() {
  for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void state_tile(uint pass, Row r, uint j0, uint n, inout float s[BC]) {
  // The tile's own log-sum-exp, stabilised by the tile's local max (not a running one).
  float m_tile = NEG_INF;
  for (uint c = 0; c < BC; ++c) m_tile = max(m_tile, s[c]);
  if (m_tile == NEG_INF) return;  // every key of the tile is masked: w = 0
  float l_tile = 0.0;
  for (uint c = 0; c < BC; ++c) {
    s[c] = s[c] == NEG_INF ? 0.0 : exp(s[c] - m_tile);
    l_tile += s[c];
  }
  float t = m_tile + log(l_tile);
  float w = 1.0;   // the first visible tile takes the whole weight
  float keep = 0.0;
  if (lse_run != NEG_INF) {
    float x = t - lse_run;
    w = sigmoid(x);
    keep = sigmoid(-x);  // 1 - w without cancellation
    lse_run += softplus(x);
  } else {
    lse_run = t;
  }
  float wt = w / l_tile;
  for (uint k = 0; k < DV; ++k) {
    float acc = 0.0;
    for (uint c = 0; c < BC; ++c) acc += s[c] * tile_v[c * DV + k];
    o_acc[k] = o_acc[k] * keep + acc * wt;
  }
  if (is_traced(r)) {
    uint t_idx = j0 / BC;
    trace_put(t_idx, 3u, w);
    trace_put(t_idx, 4u, lse_run);
    for (uint k = 0; k < DV; ++k) trace_put(t_idx, TRACE_FIELDS + k, o_acc[k]);
  }
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = lse_run;
}

#include "fused_main.glsl"
