#version 460
#extension GL_GOOGLE_include_directive : require
// FlashAttention (seed 000 §2, seeds 002/003): one pass with the output kept normalised at every
// step, o <- o * (l_prev e^(m_prev - m_new) / l_new) + sum_c v_c e^(s_c - m_new) / l_new.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float m_run[ROWS];
float l_run[ROWS];
float l_tile[ROWS];  // the current tile's part of l_run, for its share in traces

void state_init(uint rr) {
  m_run[rr] = start_max(rr);
  l_run[rr] = start_sum(rr);
  [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] = 0.0;
}

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void chunk_update(uint pass, uint c0, uint rr) {
  o_hold(rr);
  float m_new = max(m_run[rr], chunk_max(rr));
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - m_new);
    l_chunk += p[ci];
  }
  l_chunk = row_sum(l_chunk);  // before the branch: with register blocks every invocation sums
  if (m_new == NEG_INF) return;
  float alpha = m_run[rr] == NEG_INF ? 0.0 : exp(m_run[rr] - m_new);
  float l_new = l_run[rr] * alpha + l_chunk;
  l_tile[rr] = l_tile[rr] * alpha + l_chunk;
  float inv = 1.0 / l_new;
  o_keep[rr] = l_run[rr] * alpha / l_new;  // share of the old output in the new one
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = p[ci] * inv;
  m_run[rr] = m_new;
  l_run[rr] = l_new;
}

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
  float m = m_run[rr], l = l_run[rr];
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, 1.0);
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l > 0.0 ? m + log(l) : NEG_INF;
}

#include "fused_main.glsl"
