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
  // The output row in passes of OS columns, each over all the keys: one pass up to 128 columns;
  // a longer row (d = 256) in passes of 64, lest its accumulators spill on GPUs.
  const uint OS = DV <= 128u ? DV : 64u;
  for (uint s0 = 0u; s0 < DV; s0 += OS) {
    float o[OS];
    [[unroll]] for (uint k = 0; k < OS; ++k) o[k] = 0.0;
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
          [[unroll]] for (uint k = 0; k < OS; ++k)
            if (s0 + k < DV) o[k] += p * tile_v[c * DV + s0 + k];
          if (traced && c < n)
            [[unroll]] for (uint k = 0; k < OS; ++k)
              if (s0 + k < DV) trace_put(j0 + c, TRACE_FIELDS + s0 + k, o[k]);
        }
      }
    }
    if (r.valid)
      [[unroll]] for (uint k = 0; k < OS; ++k)
        if (s0 + k < DV) o_buf[o_at(r.bh, r.i) + s0 + k] = o[k];
  }
}
