#version 460
#extension GL_GOOGLE_include_directive : require
// FlashAttention (flash1_step.glsl) in the fused kernels: one pass with the output kept
// normalised at every step.
#include "common.glsl"
#include "tile.glsl"
#include "flash1_step.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

#include "max_trace.glsl"
#include "fused_step.glsl"

#include "fused_main.glsl"
