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
float l_tile;  // the current tile's part of l_run, for its share in traces

void state_init() {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void tile_begin(uint pass) { l_tile = 0.0; }

void chunk_update(uint pass, uint c0) {
  o_hold();
  float m_new = max(m_run, chunk_max());
  if (m_new == NEG_INF) return;
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[ci] == NEG_INF ? 0.0 : exp(sc[ci] - m_new);
    l_chunk += p[ci];
  }
  float l_new = l_run * alpha + l_chunk;
  l_tile = l_tile * alpha + l_chunk;
  float keep = l_run * alpha / l_new;  // share of the old output in the new one
  float inv = 1.0 / l_new;
  o_keep = keep;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[ci] = p[ci] * inv;
  m_run = m_new;
  l_run = l_new;
}

void tile_end(uint pass, Row r, uint j0) {
  if (!is_traced(r) || l_run == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m_run);
  trace_put(t, 2u, l_run);
  trace_put(t, 3u, l_tile / l_run);
  trace_put(t, 4u, m_run + log(l_run));
  [[unroll]] for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
}

#include "fused_main.glsl"
