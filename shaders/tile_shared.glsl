// Shared tiles (TileLayout::shared; the layout traces record from, and naive's): ROWS = 1;
// every invocation of the workgroup helps load BC keys into shared memory, then each reads all of
// them, CH keys at a time, for its own query row.
// tile.glsl includes the tiles (tile_layout.glsl), fused_main.glsl the key loop (LAYOUT_MAIN).
#ifndef LAYOUT_MAIN
// Keys per chunk: the recurrence runs over a shared-memory tile one key at a time, with the
// head-dim loops unrolled (unrolling more keys multiplies llvmpipe's compile time for little
// gain).
const uint CH = 1u;
const uint OW = DV;  // output columns of each invocation: whole rows
#include "tile_state.glsl"
shared float tile_k[BC * D];
shared float tile_v[BC * DV];

void load_k_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * D + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / D;
    float x = 0.0;
    if (e < BC * D && c < n) x = k_value(key_row(kv_base, j0 + c) * D + e % D);
    if (e < BC * D) tile_k[e] = x;  // keys past the end are zeros
  }
}

void load_v_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * DV + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / DV;
    float x = 0.0;
    if (e < BC * DV && c < n) x = v_value(key_row(kv_base, j0 + c) * DV + e % DV);
    if (e < BC * DV) tile_v[e] = x;
  }
}

float q_reg[ROWS][D];  // queries, kept in registers

void load_q(uint rr) {
  Row r = rows[rr];
  uint base = q_at(r.bh, r.i);
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = float(q_buf[base + k]);
}

// Scores of keys j0+c0 .. j0+c0+CH-1 (tile offsets c0..c0+CH-1 of a tile holding n keys).
void chunk_scores(uint j0, uint c0, uint n) {
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    float acc = 0.0;
    [[unroll]] for (uint k = 0; k < D; ++k) acc = fma(q_reg[0][k], tile_k[c * D + k], acc);
    sc[0][ci] = row_score(0u, j0 + c, c < n && key_visible(0u, j0 + c), acc * pc.scale);
  }
}


float row_max(float x) { return x; }  // an invocation holds its row's whole chunk
float row_sum(float x) { return x; }

void accumulate_o(uint c0) {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[0][k] *= o_keep[0];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci)
    [[unroll]] for (uint k = 0; k < DV; ++k)
      o_acc[0][k] = fma(o_coef[0][ci], tile_v[(c0 + ci) * DV + k], o_acc[0][k]);
}

uint first_column() { return 0u; }

// The union [lo, hi) of the keys the workgroup's rows see.
void layout_keys(inout uint lo, inout uint hi) { workgroup_keys(lo, hi); }
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
