#version 460
#extension GL_GOOGLE_include_directive : require
// User-written attention's functions (flashvk::flex) evaluated at given points, for code on the
// host that needs their values (flex::DeviceTwins: the viewer's float64 reference on a file the
// host has no C++ twin of). Point e is scratch1[5e .. 5e + 4]: the score, then b, h, q_idx and
// kv_idx as int bits; it writes scratch2[2e + 1] = 1 where mask_mod keeps the key (always
// without one) and scratch2[2e] = score_mod's score where it does (else the score itself), as
// the kernels call them. FLEX_NQ is pc.nq,
// FLEX_NK pc.nk; pc.kv_keys points, over the grid's x and y.
#define FLEX_EVAL
#include "common.glsl"

void main() {
  uint e = gl_GlobalInvocationID.y * gl_NumWorkGroups.x * gl_WorkGroupSize.x +
           gl_GlobalInvocationID.x;
  if (e >= pc.kv_keys) return;
  float score = scratch1[5u * e];
  int b = floatBitsToInt(scratch1[5u * e + 1u]), h = floatBitsToInt(scratch1[5u * e + 2u]);
  int q_idx = floatBitsToInt(scratch1[5u * e + 3u]), kv_idx = floatBitsToInt(scratch1[5u * e + 4u]);
  float kept = 1.0;
#ifdef FLEX
  FLEX_NQ = int(pc.nq);
  FLEX_NK = int(pc.nk);
#ifdef FLEX_MASK_MOD
  kept = mask_mod(b, h, q_idx, kv_idx) ? 1.0 : 0.0;
#endif
#ifdef FLEX_SCORE_MOD
  if (kept != 0.0) score = score_mod(score, b, h, q_idx, kv_idx);  // as modify_score: kept keys
#endif
#endif
  scratch2[2u * e] = score;
  scratch2[2u * e + 1u] = kept;
}
