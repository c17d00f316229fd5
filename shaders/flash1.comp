#version 460
#extension GL_GOOGLE_include_directive : require
// FlashAttention (flash1_step.glsl) in the fused kernels: one pass with the output kept
// normalised at every step.
#include "common.glsl"
#include "tile.glsl"
#include "flash1_step.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float l_tile[ROWS];  // the current tile's part of l_run, for its share in traces

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void trace_chunk(uint rr, float ref, float l_chunk) {
  float m_prev = m_run[rr];
  l_tile[rr] = l_tile[rr] * (m_prev == NEG_INF ? 0.0 : exp(m_prev - ref)) + l_chunk;
}

#include "fused_step.glsl"

void tile_end(uint pass, uint j0, uint rr) {
  float m = m_run[rr], l = l_run[rr];
  if (!is_traced(rows[rr]) || l == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m);
  trace_put(t, 2u, l);
  trace_put(t, 3u, l_tile[rr] / l);
  trace_put(t, 4u, m + log(l));
  [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}

void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, out_scale(rr));
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = row_lse(rr);
}

#include "fused_main.glsl"
