// The loop shared by every fused kernel (online, flash1, flash2, flashd, splitkv). The workgroup
// walks K/V in tiles of BC keys and each query row's recurrence runs over a tile CH keys at a
// time (tile.glsl: the layout the build runs). The including file supplies the recurrence, per row rr
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

// The key loop of the layout the build runs (tile_layout.glsl, each layout's LAYOUT_MAIN part).
#define LAYOUT_MAIN
#include "tile_layout.glsl"
#undef LAYOUT_MAIN
