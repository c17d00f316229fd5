// The loop shared by every fused kernel (online, flash1, flash2, flashd, splitkv): one invocation
// owns one query row, the workgroup walks K/V in tiles of BC keys staged in shared memory, and
// each invocation applies its recurrence to the tile CH keys at a time. The including file
// supplies its own recurrence:
//   const uint PASSES;                               1, or 2 for the two-pass online softmax
//   bool pass_needs_v(uint pass);
//   void state_init();
//   void tile_begin(uint pass);                      remembers the state the tile starts from
//   void chunk_update(uint pass, uint c0);           the recurrence over the scores in sc[]
//   void tile_end(uint pass, Row r, uint j0);        records the trace
//   void state_finish(Row r);
// With BC = 1 (and so CH = 1) a chunk is one key: the seeds' per-key loops, used for traces.

// The keys this workgroup walks: all of them, or its chunk for splitkv, up to the last one any of
// its rows can see.
void key_range(Row r, out uint begin, out uint end) {
  begin = 0u;
  end = pc.nk;
#ifdef SPLIT_KV
  begin = min(pc.nk, gl_WorkGroupID.z * pc.keys_per_split);
  end = min(pc.nk, begin + pc.keys_per_split);
#endif
  end = min(end, workgroup_key_end(r));
}

#ifdef REG_TILE
// Register tiles: no barriers, and every lane of a subgroup runs every step together (rows
// outside the problem compute on zeros and store nothing), as the shuffles need.
void main() {
  Row r = packed_row();
  load_q(r);
  uint begin, end;
  key_range(r, begin, end);
  state_init();
  for (uint pass = 0u; pass < PASSES; ++pass) {
    for (uint j0 = begin; j0 < end; j0 += BC) {
      uint n = min(BC, end - j0);
      load_reg_tile(r, j0, n, pass_needs_v(pass));
      tile_begin(pass);
      chunk_scores(r, j0, 0u, n);
      chunk_update(pass, 0u);
      if (pass_needs_v(pass)) accumulate_o(0u);
    }
  }
  if (r.valid) state_finish(r);
}
#else
void main() {
  Row r = packed_row();
  load_q(r);
  uint begin, end;
  key_range(r, begin, end);
  state_init();
  for (uint pass = 0u; pass < PASSES; ++pass) {
    for (uint j0 = begin; j0 < end; j0 += BC) {
      uint n = min(BC, end - j0);
      barrier();  // every invocation is done with the previous tile
      load_k_tile(r.kv_base, j0, n);
      if (pass_needs_v(pass)) load_v_tile(r.kv_base, j0, n);
      barrier();  // the tile is complete in shared memory
      if (!r.valid) continue;
      tile_begin(pass);
      for (uint c0 = 0u; c0 < n; c0 += CH) {
        chunk_scores(r, j0, c0, n);
        chunk_update(pass, c0);
        if (pass_needs_v(pass)) accumulate_o(c0);
      }
      if (BC == 1u && is_traced(r)) trace_put(j0, 0u, sc[0]);  // per-key trace: the score
      tile_end(pass, r, j0);
    }
  }
  if (r.valid) state_finish(r);
}
#endif
