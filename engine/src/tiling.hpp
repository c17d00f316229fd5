#pragma once
// The tiling policy: from what the device offers and what the call asks, the kernel layout and
// the tile sizes (Spec) a call runs with. A pure function of its inputs, so that the choice can be
// checked for devices the tests do not have (tests/tiling_test.cpp), and the one place that
// knows how the layouts are sized (docs/engine.md, "Tile layouts").
#include <cstdint>

#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "formats.hpp"
#include "vk.hpp"

namespace flashvk::detail {

// The texels of K or V in a storage format of its own (KV_QUANT kernels): Format::texel_words
// 32-bit words (tile.glsl's kv_fetch).
inline VkFormat word_texel_format(DType storage) {
  return format(storage).texel_words() == 4 ? VK_FORMAT_R32G32B32A32_UINT : VK_FORMAT_R32_UINT;
}
inline uint64_t word_texel_bytes(DType storage) {
  return 4 * format(storage).texel_words();
}

/// What the tiling depends on.
struct TilingRequest {
  const DeviceInfo& info;
  MatrixApi matrix_api = MatrixApi::none;  ///< the context's matrix API (never automatic)
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

/// Shared memory the cooperative-matrix kernel of `spec` takes as the tiling counts it (the
/// recurrence's factors at their most: two), for a check outside the tiling.
uint32_t matrix_kernel_bytes(const Spec& spec);

}  // namespace flashvk::detail
