// FlashAttention-2 (flash2_step.glsl) in the fused kernels: flash2.comp, and splitkv.comp (seed
// 002, Flash-Decoding), which runs it over one chunk of keys per workgroup and stores each
// chunk's (o', m, l) for the log-sum-exp merge.
#include "common.glsl"
#include "tile.glsl"
#include "flash2_step.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

#include "max_trace.glsl"
#include "fused_step.glsl"

#include "fused_main.glsl"
