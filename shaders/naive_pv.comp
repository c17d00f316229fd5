#version 460
#extension GL_GOOGLE_include_directive : require
// Naive attention, step 3 of 3: O = P V, reading the materialised P, with V walked in tiles.
#include "common.glsl"
#include "tile.glsl"

void main() {
  uint bh = pc.bh0 + gl_WorkGroupID.y;
  uint i = gl_GlobalInvocationID.x;
  Row r = make_row(bh / pc.heads, bh % pc.heads, min(i, pc.nq - 1u), i < pc.nq);
  uint base = (gl_WorkGroupID.y * pc.nq + r.i) * kv_len();
  bool traced = is_traced(r);
  float o[DV];
  [[unroll]] for (uint k = 0; k < DV; ++k) o[k] = 0.0;
  for (uint j0 = 0u; j0 < kv_len(); j0 += BC) {
    uint n = min(BC, kv_len() - j0);
    barrier();
    load_v_tile(r.kv_base, j0, n);
    barrier();
    if (!r.valid) continue;
    for (uint c0 = 0u; c0 < n; c0 += CH) {
      [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
        uint c = c0 + ci;
        float p = 0.0;
        if (c < n) p = scratch1[base + j0 + c];  // a branch: a select would read past the row
        [[unroll]] for (uint k = 0; k < DV; ++k) o[k] += p * tile_v[c * DV + k];
        if (traced && c < n)
          [[unroll]] for (uint k = 0; k < DV; ++k) trace_put(j0 + c, TRACE_FIELDS + k, o[k]);
      }
    }
  }
  if (r.valid)
    [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[o_at(r.bh, r.i) + k] = o[k];
}
