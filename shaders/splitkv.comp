#version 460
#extension GL_GOOGLE_include_directive : require
// Flash-Decoding partial pass: FlashAttention-2 over one chunk of keys per workgroup (z).
#define SPLIT_KV
#include "flash2_state.glsl"
