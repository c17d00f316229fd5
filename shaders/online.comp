#version 460
#extension GL_GOOGLE_include_directive : require
// Two-pass online softmax (seed 004, "2-pass online softmax"). Pass 1 walks the keys and keeps
// m and d' online: m_i = max(m_{i-1}, x_i), d'_i = d'_{i-1} e^(m_{i-1} - m_i) + e^(x_i - m_i).
// Pass 2 walks them again: a_i = e^(x_i - m_N) / d'_N, o_i = o_{i-1} + a_i v_i.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 2u;
bool pass_needs_v(uint pass) { return pass == 1u; }

float m_run = NEG_INF;
float l_run = 0.0;
float w_tile;  // pass 2: the weight the tile's keys add to the output

void state_init() {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void tile_begin(uint pass) { w_tile = 0.0; }

void first_pass() {
  float m_new = max(m_run, chunk_max());
  if (m_new == NEG_INF) return;
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci)
    l_chunk += sc[ci] == NEG_INF ? 0.0 : exp(sc[ci] - m_new);
  l_run = l_run * alpha + l_chunk;
  m_run = m_new;
}

void second_pass(uint c0) {
  if (l_run == 0.0) return;  // the row sees no key
  float inv = 1.0 / l_run;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    float a = sc[ci] == NEG_INF ? 0.0 : exp(sc[ci] - m_run) * inv;
    w_tile += a;
    o_coef[ci] = a;
  }
}

void chunk_update(uint pass, uint c0) {
  o_hold();
  if (pass == 0u) {
    first_pass();
  } else {
    second_pass(c0);
  }
}

void tile_end(uint pass, Row r, uint j0) {
  if (!is_traced(r) || l_run == 0.0) return;
  uint t = j0 / BC;
  if (pass == 0u) {
    trace_put(t, 1u, m_run);
    trace_put(t, 2u, l_run);
    trace_put(t, 4u, m_run + log(l_run));
  } else {
    trace_put(t, 3u, w_tile);
    [[unroll]] for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
  }
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
}

#include "fused_main.glsl"
