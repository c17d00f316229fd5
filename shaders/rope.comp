#version 460
// Rotary position embedding (seed 001). Each invocation rotates one pair of one vector by the
// angle p * theta_i, with cos and sin precomputed on the host in float64 (an fp32 p * theta loses
// the angle at long positions). Pairs are (x_2i, x_2i+1) ("interleaved", the seed's form) or
// (x_i, x_i+d/2) ("half"). An odd last element has no partner and is copied.
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
#ifdef FP16
#define ELEM float16_t
#else
#define ELEM float
#endif

layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer In { ELEM x_in[]; };
layout(std430, binding = 1) writeonly buffer Out { ELEM x_out[]; };
layout(std430, binding = 2) readonly buffer Table { float cos_sin[]; };  // [positions, d/2, 2]

layout(push_constant) uniform Params {
  uint vectors;   // number of vectors of length dim
  uint seq_len;   // vectors per (b, h); the position is the index within it
  uint dim;
  uint half_layout;
}
pc;

void main() {
  uint pairs = pc.dim / 2u;
  uint slots = pairs + (pc.dim & 1u);
  uint id = gl_GlobalInvocationID.x;
  if (id >= pc.vectors * slots) return;
  uint vec = id / slots;
  uint p = id % slots;
  uint base = vec * pc.dim;
  if (p == pairs) {  // odd dim: the unpaired last element
    x_out[base + pc.dim - 1u] = x_in[base + pc.dim - 1u];
    return;
  }
  uint a = pc.half_layout != 0u ? p : 2u * p;
  uint b = pc.half_layout != 0u ? p + pairs : 2u * p + 1u;
  uint t = ((vec % pc.seq_len) * pairs + p) * 2u;
  float c = cos_sin[t];
  float s = cos_sin[t + 1u];
  float xa = float(x_in[base + a]);
  float xb = float(x_in[base + b]);
  x_out[base + a] = ELEM(xa * c - xb * s);
  x_out[base + b] = ELEM(xa * s + xb * c);
}
