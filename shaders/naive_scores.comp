#version 460
#extension GL_GOOGLE_include_directive : require
// Naive attention, step 1 of 3 (docs/algorithms.md, variants, naive): materialise S = scale * Q K^T in device memory.
// Masked entries are stored as -inf. Workgroup y = (b, h) within this chunk, x = block of rows.
#include "common.glsl"
#include "tile.glsl"

// The query row in registers up to 128 elements (tile.glsl's load_q and chunk_scores); a longer
// one (d = 256) is read from memory 64 elements at a time for each chunk of keys, lest it spill
// on GPUs. The same products, summed in the same order.
const bool Q_IN_REGISTERS = D <= 128u;
const uint QS = 64u;

void long_chunk_scores(uint j0, uint c0, uint n) {
  uint qb = q_at(rows[0].bh, rows[0].i);
  float acc[CH];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[ci] = 0.0;
  for (uint k0 = 0u; k0 < D; k0 += QS) {
    float q[QS];
    [[unroll]] for (uint k = 0; k < QS; ++k) q[k] = k0 + k < D ? float(q_buf[qb + k0 + k]) : 0.0;
    [[unroll]] for (uint ci = 0; ci < CH; ++ci)
      [[unroll]] for (uint k = 0; k < QS; ++k)
        if (k0 + k < D) acc[ci] = fma(q[k], tile_k[(c0 + ci) * D + k0 + k], acc[ci]);
  }
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    sc[0][ci] = row_score(0u, j0 + c, c < n && key_visible(0u, j0 + c), acc[ci] * pc.scale);
  }
}

void main() {
  uint bh = pc.bh0 + gl_WorkGroupID.y;
  uint i = gl_GlobalInvocationID.x;
  Row r = make_row(bh / pc.heads, bh % pc.heads, min(i, pc.nq - 1u), i < pc.nq);
  rows[0] = r;  // ROWS is 1
  if (Q_IN_REGISTERS) load_q(0u);
  uint base = (gl_WorkGroupID.y * pc.nq + r.i) * kv_len();
  for (uint j0 = 0u; j0 < kv_len(); j0 += BC) {
    uint n = min(BC, kv_len() - j0);
    barrier();
    load_k_tile(r.kv_base, j0, n);
    barrier();
    if (!r.valid) continue;
    for (uint c0 = 0u; c0 < n; c0 += CH) {
      if (Q_IN_REGISTERS)
        chunk_scores(j0, c0, n);
      else
        long_chunk_scores(j0, c0, n);
      [[unroll]] for (uint ci = 0; ci < CH; ++ci)
        if (c0 + ci < n) scratch1[base + j0 + c0 + ci] = sc[0][ci];
    }
  }
}
