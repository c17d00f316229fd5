// The storage formats of K and V, the one place a kernel learns what a format is: every kernel
// that reads K or V in a format of its own (KV_QUANT builds, lanes) and rope.comp, which writes
// the block formats, decode and encode through the functions below. The host's twin is the table
// of formats in engine/src/formats.cpp (sizes, names, the quantisers on upload), which includes
// the list of IDs below to check that DType numbers them alike.
//
// Element formats hold a value in FMT_BITS bits. Block formats hold ggml's blocks of 32 values,
// each field as ggml's block has it, laid out as a struct of arrays: first every block's quants
// (ggml's qs, FMT_BITS a value: q8_0's int8, or the 4-bit formats' byte j holding values j and
// j + 16 in its low and high nibble), then every block's head of FMT_HEAD_HALVES 16-bit halves:
// its fp16 scale d (two blocks' a word), or d and the fp16 minimum m, or d, m (0 where the format
// has none) and the 5-bit formats' 32 fifth bits qh (bit j of value j). A value is d q + m, q its
// quant as kv_quant() reads it.
//
// A new block format: its ID here and in DType, its row in formats.cpp, and its cases in the
// FMT_* macros, kv_quant and quantise_block.
//   FORMAT_ID(GLSL name, DType name, number)
#ifndef FORMAT_ID
#define FORMAT_ID(NAME, dtype, id) const uint NAME = id;
#define FORMAT_IDS_IN_GLSL
#endif
FORMAT_ID(FMT_F32, f32, 0u)
FORMAT_ID(FMT_F16, f16, 1u)
FORMAT_ID(FMT_BF16, bf16, 2u)
FORMAT_ID(FMT_Q8_0, q8_0, 3u)
FORMAT_ID(FMT_Q4_0, q4_0, 4u)
FORMAT_ID(FMT_Q4_1, q4_1, 5u)
FORMAT_ID(FMT_Q5_0, q5_0, 6u)
FORMAT_ID(FMT_Q5_1, q5_1, 7u)
FORMAT_ID(FMT_IQ4_NL, iq4_nl, 8u)
#ifdef FORMAT_IDS_IN_GLSL
#undef FORMAT_ID
#undef FORMAT_IDS_IN_GLSL

// What a format is, as macros too, so that a kernel's specialization constants can be made from
// them (a function call is not a constant expression).
// Values a block holds along the last dimension (1: an element format).
#define FMT_BLOCK(fmt) ((fmt) >= FMT_Q8_0 ? 32u : 1u)
// Bits a value takes: a whole element, or a block format's quant in qs.
#define FMT_BITS(fmt) \
  ((fmt) == FMT_F32 ? 32u : ((fmt) == FMT_F16 || (fmt) == FMT_BF16 ? 16u : ((fmt) == FMT_Q8_0 ? 8u : 4u)))
// 16-bit halves of a block's head: d; d and m; d, m and qh.
#define FMT_HEAD_HALVES(fmt) \
  ((fmt) == FMT_Q4_1 ? 2u : ((fmt) == FMT_Q5_0 || (fmt) == FMT_Q5_1 ? 4u : 1u))
// Values in one 16-byte load (lanes): 4 floats, 8 halves, 16 q8_0 quants (half a block) or 32
// 4-bit quants (a whole block), so that load x / FMT_LOAD_VALUES holds value x.
#define FMT_LOAD_VALUES(fmt) (128u / FMT_BITS(fmt))
// Texels of 4 values that register tiles fetch at once (one 16-byte texel of 4 words): 4 for the
// block formats (sixteen values of a block, fetched with their block's head), else 1.
#define FMT_TEXEL_GROUP(fmt) (FMT_BLOCK(fmt) > 1u ? 4u : 1u)
// Whether a value adds its block's minimum m.
#define FMT_AFFINE(fmt) ((fmt) == FMT_Q4_1 || (fmt) == FMT_Q5_1)

uint fmt_block(uint fmt) { return FMT_BLOCK(fmt); }
uint fmt_bits(uint fmt) { return FMT_BITS(fmt); }
// Whether values are stored as quants of blocks with a head (d, and m and qh).
bool kv_scaled(uint fmt) { return FMT_BLOCK(fmt) > 1u; }

// A block's head, decoded.
struct BlockHead {
  float d;  // the scale
  float m;  // the minimum, added (0 where the format has none)
  uint qh;  // the 5-bit formats' fifth bits
};
BlockHead no_head() { return BlockHead(0.0, 0.0, 0u); }

// Value x (a flat element index) of a tensor of `count` values in format fmt: the 32-bit word
// that holds it. The bits of x that kv_word() and kv_quant() look at below the block are those of
// x's offset in a 16-byte load that starts on a whole number of loads, so a kernel that loads 16
// bytes (lanes) passes that offset and indexes its load with kv_word().
uint kv_word(uint fmt, uint x) {
  if (fmt == FMT_F32) return x;
  if (fmt == FMT_F16 || fmt == FMT_BF16) return x >> 1u;
  if (fmt == FMT_Q8_0) return x >> 2u;
  return ((x >> 5u) * 16u + (x & 15u)) >> 2u;  // 4-bit quants: byte j holds j and j + 16
}

// The first word of value x's block head, in a tensor of `count` values (the heads follow the
// quants); a head of 4 halves takes that word and the next. kv_head_half: its first half (16
// bits), for a kernel that reads a head of one half alone (it shares its word with the next
// block's). Two spellings of one place: each builds to fewer instructions where it is used
// (kv_head_word as kv_head_half >> 1 cost the register blocks 1.3% more on RDNA3).
uint kv_head_word(uint fmt, uint x, uint count) {
  return count / (32u / FMT_BITS(fmt)) + ((x >> 5u) * FMT_HEAD_HALVES(fmt) >> 1u);
}
uint kv_head_half(uint fmt, uint x, uint count) {
  return 2u * (count / (32u / FMT_BITS(fmt))) + (x >> 5u) * FMT_HEAD_HALVES(fmt);
}

// The head of value x's block from its first word w0 and, for heads of 4 halves, the next w1.
BlockHead fmt_head(uint fmt, uint x, uint w0, uint w1) {
  vec2 h = unpackHalf2x16(w0);
  if (FMT_HEAD_HALVES(fmt) == 1u) return BlockHead((x & 32u) != 0u ? h.y : h.x, 0.0, 0u);
  return BlockHead(h.x, FMT_AFFINE(fmt) ? h.y : 0.0, FMT_HEAD_HALVES(fmt) == 4u ? w1 : 0u);
}

// ggml's kvalues_iq4nl, the 16 levels of iq4_nl's quants (-127, -104, -83, -65, -49, -35, -22,
// -10, 1, 13, 25, 38, 53, 69, 89, 113), as signed bytes, four a word: level k is found with
// selects and a bit-field extract, not by indexing an array (which compilers may spill to memory:
// llvmpipe took 3x as long to build a kernel that did).
float iq4_nl_level(uint k) {
  uint word = k < 8u ? (k < 4u ? 0xbfad9881u : 0xf6eaddcfu) : (k < 12u ? 0x26190d01u : 0x71594535u);
  return float(bitfieldExtract(int(word), int(8u * (k & 3u)), 8));
}

// Of a block format, value x's quant q as a float (the value is d q + m), from the word that holds
// it and its block's qh. Exact, and with no int-to-float conversion (GPUs convert at a fraction of
// their FMA rate): the quant's bits, made unsigned, go into the mantissa of 2^23, which is then
// subtracted with the offset.
float kv_quant(uint fmt, uint x, uint word, uint qh) {
  uint shift = 8u * (x & 3u);
  if (fmt == FMT_Q8_0) return uintBitsToFloat(((word >> shift) & 0xffu) ^ 0x4b000080u) - 8388736.0;
  shift += (x & 16u) != 0u ? 4u : 0u;
  uint nibble = (word >> shift) & 15u;
  if (fmt == FMT_IQ4_NL) return iq4_nl_level(nibble);
  uint high = ((qh >> (x & 31u)) & 1u) << 4u;  // 0 but for the 5-bit formats
  float offset = fmt == FMT_Q4_0 ? 8.0 : (fmt == FMT_Q5_0 ? 16.0 : 0.0);
  return uintBitsToFloat((nibble | high) | 0x4b000000u) - (8388608.0 + offset);
}

// Value x from the word that holds it (kv_word) and, for the block formats, its block's head.
float kv_value(uint fmt, uint x, uint word, BlockHead h) {
  if (fmt == FMT_F32) return uintBitsToFloat(word);
  if (fmt == FMT_F16) return unpackHalf2x16(word)[x & 1u];
  if (fmt == FMT_BF16) return uintBitsToFloat((x & 1u) != 0u ? word & 0xffff0000u : word << 16u);
  return fma(h.d, kv_quant(fmt, x, word, h.qh), h.m);
}

// Of a block format, values x .. x + 3 (x a multiple of 4) from the word that holds them
// (kv_word(fmt, x)) and their block's head: the four at once, as register tiles take them.
vec4 fmt_vec4(uint fmt, uint word, BlockHead h, uint x) {
  if (fmt == FMT_Q8_0) return h.d * vec4(ivec4(int(word)) << ivec4(24, 16, 8, 0) >> 24);
  uint shift = (x & 16u) != 0u ? 4u : 0u;  // byte j of a block holds j and j + 16
  if (fmt == FMT_Q4_0) return h.d * (vec4((uvec4(word >> shift) >> uvec4(0u, 8u, 16u, 24u)) & 15u) - 8.0);
  vec4 v;
  [[unroll]] for (uint e = 0u; e < 4u; ++e) v[e] = kv_value(fmt, x + e, word, h);
  return v;
}

// Of a block format, values x .. x + 3 (x a multiple of 4) as fp16, two a word (packHalf2x16's
// rounding), from the word that holds them (kv_word(fmt, x)) and their block's head (fmt_head's
// w0 and w1): how the matrix kernels stage K and V. Only x's bits below 64 are read.
uvec2 fmt_halves4(uint fmt, uint x, uint word, uint w0, uint w1) {
  vec4 v = fmt_vec4(fmt, word, fmt_head(fmt, x, w0, w1), x);
  return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw));
}

// The 32 values x of a block in format fmt, quantised as ggml's quantize_row_*_ref does: its
// quants as words (FMT_BITS(fmt) of them: q8_0 8, the 4-bit formats 4) and its head. `precise`
// keeps the compiler from fusing what ggml rounds step by step.
float round_half_away(float x) { return sign(x) * floor(abs(x) + 0.5); }  // C's lroundf

// iq4_nl: the level nearest x (ggml's best_index_int8; a tie takes the upper level).
uint iq4_nl_index(float x) {
  uint lo = 0u;
  [[unroll]] for (uint i = 1u; i < 15u; ++i)
    if (x >= iq4_nl_level(i)) lo = i;
  if (x <= -127.0) return 0u;
  if (x >= 113.0) return 15u;
  return x - iq4_nl_level(lo) < iq4_nl_level(lo + 1u) - x ? lo : lo + 1u;
}

BlockHead quantise_block(uint fmt, float x[32], out uint words[8]) {
  precise float amax = 0.0, signed_max = 0.0, lo = x[0], hi = x[0];
  [[unroll]] for (uint j = 0u; j < 32u; ++j) {
    if (abs(x[j]) > amax) {
      amax = abs(x[j]);
      signed_max = x[j];
    }
    lo = min(lo, x[j]);
    hi = max(hi, x[j]);
  }
  [[unroll]] for (uint w = 0u; w < 8u; ++w) words[w] = 0u;
  BlockHead h = no_head();
  if (fmt == FMT_Q8_0) {
    h.d = amax / 127.0;
    precise float inv = h.d != 0.0 ? 1.0 / h.d : 0.0;
    [[unroll]] for (uint w = 0u; w < 8u; ++w)
      [[unroll]] for (uint k = 0u; k < 4u; ++k)
        words[w] |= (uint(int(round_half_away(x[4u * w + k] * inv))) & 0xffu) << (8u * k);
    return h;
  }
  // The others: quant q[j] of value j, 0 .. 15 (5-bit formats: 0 .. 31, the fifth bit into qh).
  uint q[32];
  if (fmt == FMT_IQ4_NL) {  // quantize_row_iq4_nl_ref: the nearest levels, then the best scale
    if (amax >= 1e-15) {
      precise float d = signed_max / -127.0, id = 1.0 / d, sum_qx = 0.0, sum_q2 = 0.0;
      [[unroll]] for (uint j = 0u; j < 32u; ++j) {
        q[j] = iq4_nl_index(id * x[j]);
        precise float level = iq4_nl_level(q[j]), w = x[j] * x[j];
        sum_qx += w * level * x[j];
        sum_q2 += w * level * level;
      }
      h.d = sum_q2 > 0.0 ? sum_qx / sum_q2 : 0.0;
    } else {
      [[unroll]] for (uint j = 0u; j < 32u; ++j) q[j] = 0u;
    }
  } else {
    bool affine = FMT_AFFINE(fmt);
    float levels = fmt == FMT_Q4_0 || fmt == FMT_Q4_1 ? 16.0 : 32.0;
    h.d = affine ? (hi - lo) / (levels - 1.0) : signed_max / -(levels / 2.0);
    h.m = affine ? lo : 0.0;
    precise float inv = h.d != 0.0 ? 1.0 / h.d : 0.0;
    [[unroll]] for (uint j = 0u; j < 32u; ++j) {
      precise float t = affine ? (x[j] - lo) * inv + 0.5 : x[j] * inv + (levels / 2.0 + 0.5);
      q[j] = min(uint(levels) - 1u, uint(int(t)));  // C's (int8_t) cast truncates
    }
  }
  [[unroll]] for (uint w = 0u; w < 4u; ++w)
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
      uint j = 4u * w + k;
      words[w] |= ((q[j] & 15u) | ((q[j + 16u] & 15u) << 4u)) << (8u * k);
    }
  [[unroll]] for (uint j = 0u; j < 32u; ++j) h.qh |= (q[j] >> 4u) << j;
  return h;
}
#endif
