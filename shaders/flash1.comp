#version 460
#extension GL_GOOGLE_include_directive : require
// FlashAttention (seed 000 §2, seeds 002/003): one pass with the output kept normalised at every
// step, o <- o * (l_prev e^(m_prev - m_new) / l_new) + sum_c v_c e^(s_c - m_new) / l_new.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float m_run = NEG_INF;
float l_run = 0.0;
float o_acc[DV];  // normalised output of the keys seen so far

void state_init() {
  for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void state_tile(uint pass, Row r, uint j0, uint n, inout float s[BC]) {
  float m_tile = NEG_INF;
  for (uint c = 0; c < BC; ++c) m_tile = max(m_tile, s[c]);
  float m_new = max(m_run, m_tile);
  if (m_new == NEG_INF) return;
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float l_tile = 0.0;
  for (uint c = 0; c < BC; ++c) {
    s[c] = s[c] == NEG_INF ? 0.0 : exp(s[c] - m_new);
    l_tile += s[c];
  }
  float l_new = l_run * alpha + l_tile;
  float keep = l_run * alpha / l_new;  // share of the old output in the new one
  float inv = 1.0 / l_new;
  for (uint k = 0; k < DV; ++k) {
    float acc = 0.0;
    for (uint c = 0; c < BC; ++c) acc += s[c] * tile_v[c * DV + k];
    o_acc[k] = o_acc[k] * keep + acc * inv;
  }
  m_run = m_new;
  l_run = l_new;
  if (is_traced(r)) {
    uint t = j0 / BC;
    trace_put(t, 1u, m_run);
    trace_put(t, 2u, l_run);
    trace_put(t, 3u, l_tile * inv);
    trace_put(t, 4u, m_run + log(l_run));
    for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
  }
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
}

#include "fused_main.glsl"
