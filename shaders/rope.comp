#version 460
#extension GL_GOOGLE_include_directive : require
// Rotary position embedding (docs/algorithms.md, RoPE), and the copy of new K/V rows into a KV cache, which is
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
#extension GL_EXT_control_flow_attributes : require
#ifdef FP16
#define ELEM float16_t
#else
#define ELEM float
#endif

// The workgroup size (64) and, for QUANT_OUT, K_FORMAT: the shared specialization constants.
#include "spec_constants.glsl"
layout(std430, binding = 0) readonly buffer In { ELEM x_in[]; };
#ifdef QUANT_OUT
// The output in the block format OUT_FORMAT (formats.glsl): all the tensor's quants first, then
// all its block heads. Each invocation quantises one block (quantise_block) and writes its quants
// and head as whole words, but for heads of one half (a scale), two a word.
#define OUT_FORMAT K_FORMAT
#include "formats.glsl"
layout(std430, binding = 1) buffer Out { uint out_words[]; };
#else
layout(std430, binding = 1) writeonly buffer Out { ELEM x_out[]; };
#endif
layout(std430, binding = 2) readonly buffer Table { float cos_sin[]; };  // [positions, d/2, 2]
#include "key_row.glsl"
#include "bindings.glsl"  // its own use of 0 to 2 above; Lengths as every kernel has it
#include "lengths.glsl"

const uint HALF_LAYOUT = 1u;  // pairs (x_i, x_i+d/2)
const uint ROTATE = 2u;       // rotate; else copy
const uint ROWS_AT_POSITION = 4u;    // output rows start at lengths.position
const uint ANGLES_AT_POSITION = 8u;  // angles start at table row lengths.position

layout(push_constant) uniform Params {
  uint vectors;     // number of vectors of length dim
  uint seq_len;     // vectors per matrix of the input; the row is the index within it
  uint dim;
  uint flags;
  uint out_rows;    // rows per matrix of the output: seq_len, or a KV cache's capacity
  uint out_values;  // QUANT_OUT: values in the whole output tensor (where its scales start)
}
pc;

// (x_a, x_b) rotated by the angle of pair p at table row `angle_row`.
vec2 rotate(float xa, float xb, uint angle_row, uint p) {
  uint t = (angle_row * (pc.dim / 2u) + p) * 2u;
  float c = cos_sin[t];
  float s = cos_sin[t + 1u];
  return vec2(xa * c - xb * s, xa * s + xb * c);
}

// The rows of the input vector `vec` goes to, and whose angles it takes.
void rows_of(uint vec, out uint out_row, out uint angle_row) {
  uint row = vec % pc.seq_len;
  out_row = row;
  angle_row = row;
  if ((pc.flags & ROWS_AT_POSITION) != 0u) out_row += lengths.position;
  if ((pc.flags & ANGLES_AT_POSITION) != 0u) angle_row += lengths.position;
}

#ifdef QUANT_OUT
// Element e of input vector `vec`, rotated (if asked) as the pair path below rotates it.
float element(uint vec, uint e, uint angle_row) {
  uint base = vec * pc.dim;
  float x = float(x_in[base + e]);
  if ((pc.flags & ROTATE) == 0u) return x;
  uint pairs = pc.dim / 2u;
  bool half_layout = (pc.flags & HALF_LAYOUT) != 0u;
  uint p = half_layout ? e % pairs : e / 2u;
  bool first = half_layout ? e < pairs : (e & 1u) == 0u;
  uint a = half_layout ? p : 2u * p;
  uint b = half_layout ? p + pairs : 2u * p + 1u;
  vec2 r = rotate(float(x_in[base + a]), float(x_in[base + b]), angle_row, p);
  return first ? r.x : r.y;
}

void main() {
  uint blocks = pc.dim / 32u;
  uint id = gl_GlobalInvocationID.x;
  if (id >= pc.vectors * blocks) return;
  uint vec = id / blocks, blk = id % blocks;
  uint out_row, angle_row;
  rows_of(vec, out_row, angle_row);
  float x[32];
  [[unroll]] for (uint j = 0u; j < 32u; ++j) x[j] = element(vec, blk * 32u + j, angle_row);
  uint out_vec = key_row((vec / pc.seq_len) * pc.out_rows, out_row);
  uint block = (out_vec * pc.dim) / 32u + blk;  // the block's index in the output tensor
  uint words[8];
  BlockHead h = quantise_block(OUT_FORMAT, x, words);
  uint n = fmt_bits(OUT_FORMAT);  // words of a block's quants: 32 values of n bits
  [[unroll]] for (uint w = 0u; w < 8u; ++w)
    if (w < n) out_words[block * n + w] = words[w];
  uint head = kv_head_word(OUT_FORMAT, block * 32u, pc.out_values);
  if (FMT_HEAD_HALVES(OUT_FORMAT) > 1u) {  // a word or two of the block's own
    out_words[head] = packHalf2x16(vec2(h.d, h.m));
    if (FMT_HEAD_HALVES(OUT_FORMAT) > 2u) out_words[head + 1u] = h.qh;
    return;
  }
  // Two blocks share a word of scales: each sets its half with atomics.
  uint shift = 16u * (block & 1u);
  uint half_bits = packHalf2x16(vec2(h.d, 0.0)) & 0xffffu;
  atomicAnd(out_words[head], ~(0xffffu << shift));
  atomicOr(out_words[head], half_bits << shift);
}
#else
void main() {
  uint pairs = pc.dim / 2u;
  uint slots = pairs + (pc.dim & 1u);
  uint id = gl_GlobalInvocationID.x;
  if (id >= pc.vectors * slots) return;
  uint vec = id / slots;
  uint p = id % slots;
  uint out_row, angle_row;
  rows_of(vec, out_row, angle_row);
  uint base = vec * pc.dim;
  uint out_base = key_row((vec / pc.seq_len) * pc.out_rows, out_row) * pc.dim;
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
  vec2 r = rotate(float(x_in[base + a]), float(x_in[base + b]), angle_row, p);
  x_out[out_base + a] = ELEM(r.x);
  x_out[out_base + b] = ELEM(r.y);
}
#endif
