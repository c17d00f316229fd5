#pragma once
// The tiling policy: from what the device offers and what the call asks, the kernel layout and
// the tile sizes (Spec) a call runs with. A pure function of its inputs, so that the choice can be
// checked for devices the tests do not have (tests/tiling_test.cpp), and the one place that
// knows how the layouts are sized (docs/engine.md, "Tile layouts").
#include <cstdint>

#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "vk.hpp"

namespace flashvk::detail {

// The texels of K or V in a storage format of its own (KV_QUANT kernels): q8_0 and q4_0 as four
// 32-bit words (sixteen quants of a block, or all 32 of a q4_0 block, in one fetch: tile.glsl's
// kv_fetch), other formats a word a texel.
inline bool word_quad(DType storage) {
  return storage == DType::q8_0 || storage == DType::q4_0;
}
inline VkFormat word_texel_format(DType storage) {
  return word_quad(storage) ? VK_FORMAT_R32G32B32A32_UINT : VK_FORMAT_R32_UINT;
}
inline uint64_t word_texel_bytes(DType storage) {
  return word_quad(storage) ? 16 : 4;
}

/// What the tiling depends on.
struct TilingRequest {
  const DeviceInfo& info;
  bool coopmat_enabled = false;          ///< the context enabled the cooperative-matrix features
  bool fp16_arithmetic_enabled = false;  ///< the context enabled shaderFloat16
  const Dims& dims;
  const AttentionParams& params;
  DType dtype = DType::f32;  ///< Q's
  Storage kv;                ///< Q's, K's and V's storage
  bool kv_views = true;      ///< K's and V's buffers can have texel views (register tiles)
  uint32_t forced_keys = 0;  ///< a trace's fixed Bc (shared tiles), 0 for the engine's choice
  bool trace = false;
};

/// The layout and tile sizes for `request`; throws Error naming what is missing when the call
/// asks for a layout (ExecutionHints::tile_layout) the device or the shape cannot have.
Spec choose_tiling(const TilingRequest& request);

}  // namespace flashvk::detail
