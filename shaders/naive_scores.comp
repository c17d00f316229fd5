#version 460
#extension GL_GOOGLE_include_directive : require
// Naive attention, step 1 of 3 (seed 000 §1): materialise S = scale * Q K^T in device memory.
// Masked entries are stored as -inf. Workgroup y = (b, h) within this chunk, x = block of rows.
#include "common.glsl"
#include "tile.glsl"

void main() {
  uint bh = pc.bh0 + gl_WorkGroupID.y;
  uint i = gl_GlobalInvocationID.x;
  Row r = make_row(bh / pc.heads, bh % pc.heads, min(i, pc.nq - 1u), i < pc.nq);
  rows[0] = r;  // ROWS is 1
  load_q(0u);
  uint base = (gl_WorkGroupID.y * pc.nq + r.i) * kv_len();
  for (uint j0 = 0u; j0 < kv_len(); j0 += BC) {
    uint n = min(BC, kv_len() - j0);
    barrier();
    load_k_tile(r.kv_base, j0, n);
    barrier();
    if (!r.valid) continue;
    for (uint c0 = 0u; c0 < n; c0 += CH) {
      chunk_scores(j0, c0, n);
      [[unroll]] for (uint ci = 0; ci < CH; ++ci)
        if (c0 + ci < n) scratch1[base + j0 + c0 + ci] = sc[0][ci];
    }
  }
}
