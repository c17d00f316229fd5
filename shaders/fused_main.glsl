// The loop shared by every fused kernel (online, flash1, flash2, flashd, splitkv): one invocation
// owns one query row, the workgroup walks K/V in tiles of BC keys staged in shared memory, and the
// including file supplies the per-tile update of its own recurrence:
//   const uint PASSES;                     1, or 2 for the two-pass online softmax
//   bool pass_needs_v(uint pass);
//   void state_init();
//   void state_tile(uint pass, Row r, uint j0, uint n, inout float s[BC]);
//   void state_finish(Row r);

void main() {
  Row r = packed_row();
  load_q(r);
  uint begin = 0u;
  uint end = pc.nk;
#ifdef SPLIT_KV
  begin = min(pc.nk, gl_WorkGroupID.z * pc.keys_per_split);
  end = min(pc.nk, begin + pc.keys_per_split);
#endif
  end = min(end, workgroup_key_end(r));
  state_init();
  float s[BC];
  for (uint pass = 0u; pass < PASSES; ++pass) {
    for (uint j0 = begin; j0 < end; j0 += BC) {
      uint n = min(BC, end - j0);
      barrier();  // every invocation is done with the previous tile
      load_k_tile(r.kv_base, j0, n);
      if (pass_needs_v(pass)) load_v_tile(r.kv_base, j0, n);
      barrier();  // the tile is complete in shared memory
      if (r.valid) {
        tile_scores(r, j0, n, s);
        if (BC == 1u && is_traced(r)) trace_put(j0, 0u, s[0]);  // per-key trace: the score
        state_tile(pass, r, j0, n, s);
      }
    }
  }
  if (r.valid) state_finish(r);
}
