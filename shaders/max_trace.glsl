// What a trace records of a running-max recurrence (flash1.comp, flash2_state.glsl): per tile its
// share of the denominator, from the chunks' sums rescaled as the max moves (TRACE builds;
// fused_step.glsl calls trace_chunk before each step), and the tile's m, l, w, LSE and output.
float l_tile[ROWS];  // the current tile's part of l_run

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void trace_chunk(uint rr, float ref, float l_chunk) {
  float m_prev = m_run[rr];
  l_tile[rr] = l_tile[rr] * (m_prev == NEG_INF ? 0.0 : exp(m_prev - ref)) + l_chunk;
}

void tile_end(uint pass, uint j0, uint rr) {
  float m = m_run[rr], l = l_run[rr];
  if (!is_traced(rows[rr]) || l == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m);
  trace_put(t, 2u, l);
  trace_put(t, 3u, l_tile[rr] / l);  // the tile's share of the denominator
  trace_put(t, 4u, m + log(l));
  [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}
