// K/V tiles, the scores of the query rows against them, and the output accumulators, in the
// layout the build runs (tile_layout.glsl: tile_shared.glsl, tile_registers.glsl or
// tile_blocks.glsl), then what every layout shares. Arrays are indexed only by unrolled
// (constant) indices: llvmpipe keeps a private array indexed at run time in memory and gathers
// from it. Each layout defines CH (keys of a chunk an invocation scores at once) and OW (output
// columns an invocation holds), load_q, its scores, row_max and row_sum (over the invocations
// that share a row), accumulate_o, first_column and layout_keys.
#include "tile_layout.glsl"

// The max of row rr's scores in the chunk; and row_sum(), which every recurrence applies to its
// chunk's sum of e^(s - m): over every invocation that holds part of the row's chunk.
float chunk_max(uint rr) {
  float m = NEG_INF;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) m = max(m, sc[rr][ci]);
  return row_max(m);
}

// Writes row rr's output, times mul, to dst[base .. base + DV): the dimensions this invocation
// holds.
void store_o(uint base, uint rr, float mul) {
  base += first_column();
  [[unroll]] for (uint e = 0; e < OW; ++e) o_buf[base + e] = o_acc[rr][e] * mul;
}

#ifdef SPLIT_KV
void store_partial(uint base, uint rr, float mul) {
  base += first_column();
  [[unroll]] for (uint e = 0; e < OW; ++e) scratch1[base + e] = o_acc[rr][e] * mul;
}
#endif

// The keys this workgroup (register tiles: subgroup) walks, from the union of those its rows see,
// so that tiles no row sees are skipped: all of them, or its chunk for splitkv (walk_bounds).
void key_range(out uint begin, out uint end) {
  uint lo, hi;
  rows_key_union(lo, hi);
  layout_keys(lo, hi);
  walk_bounds(lo, hi, begin, end);
}
