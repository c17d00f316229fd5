// The fused kernels' side of a variant's recurrence (flash1.comp, flash2_state.glsl, flashd.comp):
// the variant's tile_step (flash1_step.glsl, flash2_step.glsl, flashd_step.glsl) over each chunk
// of scores that tile.glsl forms, its coefficients handed to accumulate_o, and the row's output
// at the end. The including file
// supplies trace_chunk(rr, ref, l_chunk), what a trace records of the chunk (TRACE builds), and
// calls this after its step include.
void trace_chunk(uint rr, float ref, float l_chunk);

void chunk_update(uint pass, uint c0, uint rr) {
  float ref = tile_ref(rr, chunk_max(rr));
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - ref);  // exp(-inf) spelled out as 0
    l_chunk += p[ci];
  }
  l_chunk = row_sum(l_chunk);  // register blocks: over the row group; every invocation sums
#ifdef TRACE
  trace_chunk(rr, ref, l_chunk);  // before the step: it sees the state the chunk starts from
#endif
  float keep, coef;
  tile_step(rr, ref, l_chunk, keep, coef);
  o_keep[rr] = keep;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = p[ci] * coef;
}

void state_init(uint rr) {
  state_start(rr);
  [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] = 0.0;
}

// The row's output at the end: O (divided as the variant says, out_scale) and LSE; splitkv's
// chunks store their normalised o', m and l for the merge instead (docs/algorithms.md, variants, splitkv).
void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
#ifdef SPLIT_KV
  uint part = row * pc.splits + gl_WorkGroupID.z;
  store_partial(part * DV, rr, out_scale(rr));
  scratch2[part * 2u] = m_run[rr];
  scratch2[part * 2u + 1u] = l_run[rr];
#else
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, out_scale(rr));
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = row_lse(rr);
#endif
}
