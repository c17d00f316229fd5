#version 460
#extension GL_GOOGLE_include_directive : require
// FlashAttention-2: see flash2_state.glsl.
#include "flash2_state.glsl"
