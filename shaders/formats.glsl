// The storage formats of K and V, the one place a kernel learns what a format is: every kernel
// that reads K or V in a format of its own (KV_QUANT builds, lanes) and rope.comp, which writes
// the block formats, decode and encode through the functions below. The host's twin is the table
// of formats in engine/src/formats.cpp (sizes, names, the quantisers on upload), which includes
// the list of IDs below with FORMAT_IDS_ONLY to check that DType numbers them alike.
//
// Element formats hold a value in `fmt_bits` bits. Block formats (fmt_block() = 32) hold ggml's
// blocks of 32 values: the tensor's quants first, a block after another, then every block's fp16
// scale, one a block (two a 32-bit word): kv_word() finds the word holding value x, kv_scale_word()
// the word holding its block's scale.
//
// A new block format: its ID here and in DType, a row in formats.cpp, and its cases in
// FMT_BLOCK, FMT_BITS, kv_word, kv_quant, fmt_vec4 and quantise_block.
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
#ifdef FORMAT_IDS_IN_GLSL
#undef FORMAT_ID
#undef FORMAT_IDS_IN_GLSL

// What a format is, as macros too, so that a kernel's specialization constants can be made from
// them (a function call is not a constant expression).
// Values a block holds along the last dimension (1: an element format).
#define FMT_BLOCK(fmt) ((fmt) == FMT_Q8_0 || (fmt) == FMT_Q4_0 ? 32u : 1u)
// Bits a value takes: a whole element, or a block format's quant.
#define FMT_BITS(fmt) \
  ((fmt) == FMT_F32 ? 32u : ((fmt) == FMT_F16 || (fmt) == FMT_BF16 ? 16u : ((fmt) == FMT_Q8_0 ? 8u : 4u)))
// Values in one 16-byte load (lanes): 4 floats, 8 halves, 16 q8_0 quants (half a block) or 32 q4_0
// quants (a whole block), so that load x / FMT_LOAD_VALUES holds value x.
#define FMT_LOAD_VALUES(fmt) (128u / FMT_BITS(fmt))
// Texels of 4 values that register tiles fetch at once (one 16-byte texel of 4 words): 4 for the
// block formats (sixteen values of a block, fetched with their block's scale), else 1.
#define FMT_TEXEL_GROUP(fmt) (FMT_BLOCK(fmt) > 1u ? 4u : 1u)

uint fmt_block(uint fmt) { return FMT_BLOCK(fmt); }
uint fmt_bits(uint fmt) { return FMT_BITS(fmt); }
// Whether values are stored as quants times their block's fp16 scale.
bool kv_scaled(uint fmt) { return FMT_BLOCK(fmt) > 1u; }

// Value x (a flat element index) of a tensor of `count` values in format fmt: the 32-bit word
// that holds it. The bits of x that kv_word() and kv_quant() look at below the block are those of
// x's offset in a 16-byte load that starts on a whole number of loads, so a kernel that loads 16
// bytes (lanes) passes that offset and indexes its load with kv_word().
uint kv_word(uint fmt, uint x) {
  if (fmt == FMT_F32) return x;
  if (fmt == FMT_F16 || fmt == FMT_BF16) return x >> 1u;
  if (fmt == FMT_Q8_0) return x >> 2u;
  return ((x >> 5u) * 16u + (x & 15u)) >> 2u;  // q4_0: byte j of a block holds j and j + 16
}

// The word of value x's block scale, in a tensor of `count` values (the scales follow the quants).
uint kv_scale_word(uint fmt, uint x, uint count) {
  return count / (32u / fmt_bits(fmt)) + (x >> 6u);
}

// The scale of value x's block, from its scale word (two blocks' fp16 scales a word).
float kv_scale(uint scale_word, uint x) { return unpackHalf2x16(scale_word)[(x >> 5u) & 1u]; }

// Of a block format, value x before its block's scale: q, or q - 8 for q4_0. Exact, and with no
// int-to-float conversion (GPUs convert at a fraction of their FMA rate): the quant's bits, made
// unsigned, go into the mantissa of 2^23, which is then subtracted with the offset.
float kv_quant(uint fmt, uint x, uint word) {
  uint shift = 8u * (x & 3u);
  if (fmt == FMT_Q8_0) return uintBitsToFloat(((word >> shift) & 0xffu) ^ 0x4b000080u) - 8388736.0;
  shift += (x & 16u) != 0u ? 4u : 0u;
  return uintBitsToFloat(((word >> shift) & 15u) | 0x4b000000u) - 8388616.0;
}

// Value x from the word that holds it (kv_word); d: its block's scale (kv_scale) for the block
// formats, unused for the others.
float kv_value(uint fmt, uint x, uint word, float d) {
  if (fmt == FMT_F32) return uintBitsToFloat(word);
  if (fmt == FMT_F16) return unpackHalf2x16(word)[x & 1u];
  if (fmt == FMT_BF16) return uintBitsToFloat((x & 1u) != 0u ? word & 0xffff0000u : word << 16u);
  return d * kv_quant(fmt, x, word);
}

// Of a block format, values x .. x + 3 (x a multiple of 4) from the word that holds them
// (kv_word(fmt, x)), times their block's scale d: the four at once, as register tiles take them.
vec4 fmt_vec4(uint fmt, uint word, float d, uint x) {
  if (fmt == FMT_Q8_0) return d * vec4(ivec4(int(word)) << ivec4(24, 16, 8, 0) >> 24);
  uint shift = (x & 16u) != 0u ? 4u : 0u;  // q4_0: byte j of a block holds j and j + 16
  return d * (vec4((uvec4(word >> shift) >> uvec4(0u, 8u, 16u, 24u)) & 15u) - 8.0);
}

// The 32 values x of a block in format fmt, quantised as ggml's quantize_row_*_ref does: its
// quants as words (fmt_bits(fmt) of them: q8_0 8, q4_0 4) and its scale, returned.
float round_half_away(float x) { return sign(x) * floor(abs(x) + 0.5); }  // C's lroundf

float quantise_block(uint fmt, float x[32], out uint words[8]) {
  float amax = 0.0, signed_max = 0.0;
  [[unroll]] for (uint j = 0u; j < 32u; ++j) {
    if (abs(x[j]) > amax) {
      amax = abs(x[j]);
      signed_max = x[j];
    }
  }
  [[unroll]] for (uint w = 0u; w < 8u; ++w) words[w] = 0u;
  if (fmt == FMT_Q8_0) {
    float d = amax / 127.0;
    float inv = d != 0.0 ? 1.0 / d : 0.0;
    [[unroll]] for (uint w = 0u; w < 8u; ++w)
      [[unroll]] for (uint k = 0u; k < 4u; ++k)
        words[w] |= (uint(int(round_half_away(x[4u * w + k] * inv))) & 0xffu) << (8u * k);
    return d;
  }
  float d = signed_max / -8.0;  // q4_0: byte j holds values j (low nibble) and j + 16 (high)
  float inv = d != 0.0 ? 1.0 / d : 0.0;
  [[unroll]] for (uint w = 0u; w < 4u; ++w)
    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
      uint j = 4u * w + k;
      uint lo = min(15u, uint(int(x[j] * inv + 8.5)));
      uint hi = min(15u, uint(int(x[j + 16u] * inv + 8.5)));
      words[w] |= (lo | (hi << 4u)) << (8u * k);
    }
  return d;
}
#endif
