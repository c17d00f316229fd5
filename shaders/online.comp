#version 460
#extension GL_GOOGLE_include_directive : require
// Two-pass online softmax (docs/algorithms.md, variants, online). Pass 1 walks the keys and keeps
// m and d' online: m_i = max(m_{i-1}, x_i), d'_i = d'_{i-1} e^(m_{i-1} - m_i) + e^(x_i - m_i).
// Pass 2 walks them again: a_i = e^(x_i - m_N) / d'_N, o_i = o_{i-1} + a_i v_i.
#include "common.glsl"
#include "tile.glsl"
#include "max_state.glsl"

const uint PASSES = 2u;
bool pass_needs_v(uint pass) { return pass == 1u; }

float w_tile[ROWS];  // pass 2: the weight the tile's keys add to the output

void state_init(uint rr) {
  state_start(rr);
  [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] = 0.0;
}

void tile_begin(uint pass, uint rr) { w_tile[rr] = 0.0; }

void first_pass(uint rr) {
  float ref = tile_ref(rr, chunk_max(rr));
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci)
    l_chunk += sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - ref);
  l_chunk = row_sum(l_chunk);  // with register blocks every invocation sums
  rescale_state(rr, ref, l_chunk);
}

void second_pass(uint rr) {
  if (l_run[rr] == 0.0) return;  // the row sees no key
  float inv = 1.0 / l_run[rr];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    float a = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - m_run[rr]) * inv;
    w_tile[rr] += a;
    o_coef[rr][ci] = a;
  }
}

void chunk_update(uint pass, uint c0, uint rr) {
  o_hold(rr);
  if (pass == 0u) {
    first_pass(rr);
  } else {
    second_pass(rr);
  }
}

void tile_end(uint pass, uint j0, uint rr) {
  float m = m_run[rr], l = l_run[rr];
  if (!is_traced(rows[rr]) || l == 0.0) return;
  uint t = j0 / BC;
  if (pass == 0u) {
    trace_put(t, 1u, m);
    trace_put(t, 2u, l);
    trace_put(t, 4u, m + log(l));
  } else {
    trace_put(t, 3u, w_tile[rr]);
    [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
  }
}

void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, 1.0);
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = row_lse(rr);
}

#include "fused_main.glsl"
