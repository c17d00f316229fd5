// The loop shared by every fused kernel (online, flash1, flash2, flashd, splitkv). The workgroup
// walks K/V in tiles of BC keys and each query row's recurrence runs over a tile CH keys at a
// time (tile.glsl has the two layouts). The including file supplies the recurrence, per row rr
// of the ROWS this invocation works on:
//   const uint PASSES;                               1, or 2 for the two-pass online softmax
//   bool pass_needs_v(uint pass);
//   void state_init(uint rr);
//   void tile_begin(uint pass, uint rr);             remembers the state the tile starts from
//   void chunk_update(uint pass, uint c0, uint rr);  the recurrence over the scores in sc[rr]
//   void tile_end(uint pass, uint j0, uint rr);      records the trace
//   void state_finish(uint rr);
// With BC = 1 a chunk is one key: the seeds' per-key loops, used for traces.

void start_rows() {
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    rows[rr] = packed_row(rr);
    load_q(rr);
    state_init(rr);
  }
}

void finish_rows() {
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    if (rows[rr].valid) state_finish(rr);
}

#ifdef REG_TILE
// Register tiles: no barriers; every lane of a subgroup runs every step together (rows outside
// the problem compute on zeros and store nothing), as the shuffles need. The rows of a workgroup
// share one batch and K/V head.
// One pass over the keys. Called with a constant pass, so that pass_needs_v(pass) is a constant:
// llvmpipe runs both sides of a branch on a value it cannot see is uniform, so in a loop over the
// passes the online softmax's first pass would fetch and add the values under a mask.
void key_pass(uint pass, uint begin, uint end) {
  for (uint j0 = next_seen_tile(begin, end); j0 < end; j0 = next_seen_tile(j0 + BC, end)) {
    uint n = min(BC, end - j0);
    mark_tile_keys(rows[0], j0, n);
    score_tile();
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      tile_begin(pass, rr);
      chunk_update(pass, 0u, rr);
    }
    if (pass_needs_v(pass)) accumulate_o(0u);
  }
}

void main() {
  start_rows();
  uint begin, end;
  key_range(begin, end);
  key_pass(0u, begin, end);
  if (PASSES > 1u) key_pass(1u, begin, end);
  finish_rows();
}
#elif defined(BLOCK_TILE)
// Register blocks: the workgroup's queries once, then per tile K (and V) into shared memory, each
// invocation's block of scores, every row's recurrence (its max and sums reduced over the row
// group), the coefficients into P, and each invocation's block of the outputs. Every invocation
// runs every step, rows outside the problem on zeros: the barriers and reductions need them all.
void main() {
  load_q_tile();
  start_rows();
  uint begin, end;
  key_range(begin, end);  // its barriers also complete the queries in shared memory
  uint kv_base = rows[0].kv_base;  // the same for every row of the workgroup
  for (uint pass = 0u; pass < PASSES; ++pass) {
    bool with_v = pass_needs_v(pass);
    uint j0 = next_seen_tile(begin, end);
    if (j0 < end) {
      fetch_k_tile(kv_base, j0, min(BC, end - j0));
      if (with_v) fetch_v_tile(kv_base, j0, min(BC, end - j0));
    }
    while (j0 < end) {
      uint n = min(BC, end - j0);
      uint next = next_seen_tile(j0 + BC, end);
      uint next_n = next < end ? min(BC, end - next) : 0u;
      barrier();  // every invocation is done with the previous tile
      store_k_tile();
      if (with_v && !SHARE_KV) store_v_tile();
      barrier();  // the tile is complete in shared memory
      if (next_n > 0u) {  // the next tile's loads, in flight during this one's products
        fetch_k_tile(kv_base, next, next_n);
        if (with_v && !SHARE_KV) fetch_v_tile(kv_base, next, next_n);
      }
      block_scores(j0, n);
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
        tile_begin(pass, rr);
        chunk_update(pass, 0u, rr);
      }
      if (with_v) {
        if (SHARE_KV) barrier();  // every invocation is done with K: V takes its place
        store_p();
        if (SHARE_KV) {
          store_v_tile();
          if (next_n > 0u) fetch_v_tile(kv_base, next, next_n);
        }
        barrier();  // P and V are complete
        accumulate_o(0u);
      }
      j0 = next;
    }
  }
  finish_rows();
}
#else
// Shared tiles: one row per invocation (ROWS = 1).
void main() {
  start_rows();
  Row r = rows[0];
  uint begin, end;
  key_range(begin, end);
  for (uint pass = 0u; pass < PASSES; ++pass) {
    for (uint j0 = next_seen_tile(begin, end); j0 < end; j0 = next_seen_tile(j0 + BC, end)) {
      uint n = min(BC, end - j0);
      barrier();  // every invocation is done with the previous tile
      load_k_tile(r.kv_base, j0, n);
      if (pass_needs_v(pass)) load_v_tile(r.kv_base, j0, n);
      barrier();  // the tile is complete in shared memory
      if (!r.valid) continue;
      tile_begin(pass, 0u);
      for (uint c0 = 0u; c0 < n; c0 += CH) {
        chunk_scores(j0, c0, n);
        chunk_update(pass, c0, 0u);
        if (pass_needs_v(pass)) accumulate_o(c0);
      }
      if (BC == 1u && is_traced(r)) trace_put(j0, 0u, sc[0][0]);  // per-key trace: the score
      tile_end(pass, j0, 0u);
    }
  }
  finish_rows();
}
#endif
