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
float o_acc[DV];

void state_init() {
  for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void first_pass(Row r, uint j0, float s[BC]) {
  float m_tile = NEG_INF;
  for (uint c = 0; c < BC; ++c) m_tile = max(m_tile, s[c]);
  float m_new = max(m_run, m_tile);
  if (m_new == NEG_INF) return;
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float l_tile = 0.0;
  for (uint c = 0; c < BC; ++c) l_tile += s[c] == NEG_INF ? 0.0 : exp(s[c] - m_new);
  l_run = l_run * alpha + l_tile;
  m_run = m_new;
  if (is_traced(r)) {
    trace_put(j0 / BC, 1u, m_run);
    trace_put(j0 / BC, 2u, l_run);
    trace_put(j0 / BC, 4u, m_run + log(l_run));
  }
}

void second_pass(Row r, uint j0, float s[BC]) {
  if (l_run == 0.0) return;  // the row sees no key
  float inv = 1.0 / l_run;
  float w_tile = 0.0;
  for (uint c = 0; c < BC; ++c) {
    s[c] = s[c] == NEG_INF ? 0.0 : exp(s[c] - m_run) * inv;
    w_tile += s[c];
  }
  for (uint k = 0; k < DV; ++k) {
    float acc = o_acc[k];
    for (uint c = 0; c < BC; ++c) acc += s[c] * tile_v[c * DV + k];
    o_acc[k] = acc;
  }
  if (is_traced(r)) {
    trace_put(j0 / BC, 3u, w_tile);
    for (uint k = 0; k < DV; ++k) trace_put(j0 / BC, TRACE_FIELDS + k, o_acc[k]);
  }
}

void state_tile(uint pass, Row r, uint j0, uint n, inout float s[BC]) {
  if (pass == 0u) {
    first_pass(r, j0, s);
  } else {
    second_pass(r, j0, s);
  }
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k];
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
}

#include "fused_main.glsl"
