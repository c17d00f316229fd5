#version 460
#extension GL_GOOGLE_include_directive : require
// Rotary position embedding (seed 001), and the copy of new K/V rows into a KV cache, which is
// the same walk over rows with the rotation optional. Each invocation handles one pair of one
// vector: it rotates it by the angle p * theta_i, with cos and sin precomputed on the host in
// float64 (an fp32 p * theta loses the angle at long positions), or copies it. Pairs are
// (x_2i, x_2i+1) ("interleaved", the seed's form) or (x_i, x_i+d/2) ("half"). An odd last element
// has no partner and is copied.
//
// Input [.., seq_len, dim], dense. Output [.., out_rows, dim]: row r of matrix m goes to row
// r (+ lengths.position with ROWS_AT_POSITION) of matrix m. The angle of row r is that of table
// row r (+ lengths.position with ANGLES_AT_POSITION): an appending recording is recorded once and
// told the position before each submit (lengths.glsl).
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
#include "lengths.glsl"

const uint HALF_LAYOUT = 1u;  // pairs (x_i, x_i+d/2)
const uint ROTATE = 2u;       // rotate; else copy
const uint ROWS_AT_POSITION = 4u;    // output rows start at lengths.position
const uint ANGLES_AT_POSITION = 8u;  // angles start at table row lengths.position

layout(push_constant) uniform Params {
  uint vectors;   // number of vectors of length dim
  uint seq_len;   // vectors per matrix of the input; the row is the index within it
  uint dim;
  uint flags;
  uint out_rows;  // rows per matrix of the output: seq_len, or a KV cache's capacity
}
pc;

void main() {
  uint pairs = pc.dim / 2u;
  uint slots = pairs + (pc.dim & 1u);
  uint id = gl_GlobalInvocationID.x;
  if (id >= pc.vectors * slots) return;
  uint vec = id / slots;
  uint p = id % slots;
  uint row = vec % pc.seq_len;
  uint out_row = row, angle_row = row;
  if ((pc.flags & ROWS_AT_POSITION) != 0u) out_row += lengths.position;
  if ((pc.flags & ANGLES_AT_POSITION) != 0u) angle_row += lengths.position;
  uint base = vec * pc.dim;
  uint out_base = ((vec / pc.seq_len) * pc.out_rows + out_row) * pc.dim;
  if (p == pairs) {  // odd dim: the unpaired last element
    x_out[out_base + pc.dim - 1u] = x_in[base + pc.dim - 1u];
    return;
  }
  bool half_layout = (pc.flags & HALF_LAYOUT) != 0u;
  uint a = half_layout ? p : 2u * p;
  uint b = half_layout ? p + pairs : 2u * p + 1u;
  if ((pc.flags & ROTATE) == 0u) {
    x_out[out_base + a] = x_in[base + a];
    x_out[out_base + b] = x_in[base + b];
    return;
  }
  uint t = (angle_row * pairs + p) * 2u;
  float c = cos_sin[t];
  float s = cos_sin[t + 1u];
  float xa = float(x_in[base + a]);
  float xb = float(x_in[base + b]);
  x_out[out_base + a] = ELEM(xa * c - xb * s);
  x_out[out_base + b] = ELEM(xa * s + xb * c);
}
