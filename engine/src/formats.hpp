#pragma once
// The storage formats' table, the one place the host learns what a format is (its twin for the
// kernels is shaders/formats.glsl): sizes, names, how a tensor lays it out, its quantiser and
// decoder. No Vulkan here, so the .npy reader and its fuzz target can use it alone.
#include <bit>
#include <cstdint>

#include "flashvk/tensor.hpp"

namespace flashvk::detail {

struct Format {
  DType dtype;
  const char* name;
  /// Values a block holds along the last dimension: 1 for an element format.
  uint32_t block;
  /// Bits a value takes: a whole element, or a block format's quant (shaders: fmt_bits).
  uint32_t bits;
  /// Q may be stored so (the kernels read Q as ELEM: f32 or f16).
  bool query;
  /// A KV cache of this format can be appended to on the device (rope.comp: the rows in Q's
  /// dtype copied, or quantised into a block format).
  bool appendable;
  /// One line for help texts.
  const char* about;
  /// Block formats: 16-bit halves of a block's head (d; d and m; d, m and qh: shaders'
  /// FMT_HEAD_HALVES).
  uint32_t head_halves;
  /// Block formats: quantises one block of `block` values into its quants (block * bits / 8
  /// bytes) and its head (head_halves); dequantises value j of a block.
  void (*quantise)(const float* x, uint8_t* quants, uint16_t* head);
  float (*dequantise)(const uint8_t* quants, const uint16_t* head, uint32_t j);
  /// Block formats: which of the head's halves ggml's block struct holds, in its order, before
  /// its quants (bit i: half i): d alone, or d and m, or d and qh (m is 0), or d, m and qh.
  uint32_t ggml_halves;

  bool blocked() const { return block > 1; }
  /// The matrix kernels read K or V so (shaders/flash_cm.comp): fp16, or a block format, whose
  /// values (an fp16 scale times a small integer, plus an fp16 minimum) they decode to fp16 as
  /// they stage a tile.
  bool matrix_kv() const { return dtype == DType::f16 || blocked(); }
  /// Bytes of a block's quants.
  uint32_t quant_bytes() const { return block * bits / 8; }
  /// Values in one 16-byte load (lanes; shaders: fmt_load_values).
  uint32_t load_values() const { return 128 / bits; }
  /// 32-bit words of one texel of K or V in this format (register tiles' KV_QUANT builds): the
  /// block formats' sixteen values of a block in four words, else one word.
  uint32_t texel_words() const { return blocked() ? 4 : 1; }
  /// Bytes of one of ggml's blocks: its head's halves, then its quants.
  uint32_t ggml_block_bytes() const {
    return 2 * static_cast<uint32_t>(std::popcount(ggml_halves)) + quant_bytes();
  }
  /// Bytes a tensor's buffer rounds its values to: whole texels.
  uint32_t buffer_align() const { return 4 * texel_words(); }
};

/// The format of `dtype`, from the table.
const Format& format(DType dtype);

}  // namespace flashvk::detail
