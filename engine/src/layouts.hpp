#pragma once
// The tile layouts' table (attention.hpp's TileLayoutInfo), constexpr like the variants' table,
// with what the planner asks of a layout besides: one row per layout, read by the planner, the
// kernel builds, the pipeline report and the front ends. How a layout is chosen and sized is
// tiling.cpp's; its kernels are the files the row names.
#include <iterator>

#include "flashvk/attention.hpp"

namespace flashvk::detail {

struct LayoutRow {
  TileLayoutInfo info;
  /// A K/V tile is one iteration of the kernel's key loop (llvmpipe's loop cap,
  /// Plan::loop_iterations); shared tiles also loop over its keys.
  bool whole_tiles;
  /// With an additive mask's or mask_mod's tile bitmap, the kernel tests each tile's bit
  /// (lanes) instead of walking the words with next_seen_tile.
  bool tests_each_tile;
  /// Query rows one workgroup covers, from its invocations, ROWS and LANES (Spec::block).
  uint32_t (*workgroup_rows)(uint32_t workgroup, uint32_t rows, uint32_t lanes);
};

/// The cooperative-matrix kernel's query rows a workgroup, whatever the matrices' shape (its
/// groups are 64 / m, of the shape's subgroup each), halved where LANES groups share a row block
/// (shaders/flash_cm.comp's WG_ROWS).
inline constexpr uint32_t kMatrixRows = 64;

inline constexpr LayoutRow kLayouts[] = {
    {{TileLayout::automatic, "automatic", "auto", "the engine's choice (tiling.cpp)", ""},
     false, false, [](uint32_t wg, uint32_t, uint32_t) { return wg; }},
    {{TileLayout::shared, "shared", "shared",
      "one query row an invocation, the K/V tile in shared memory; traces and naive",
      "tile_shared.glsl"},
     false, false, [](uint32_t wg, uint32_t, uint32_t) { return wg; }},
    {{TileLayout::registers, "registers", "registers",
      "ROWS rows an invocation, a tile one key a subgroup lane, read with shuffles; CPU drivers",
      "tile_registers.glsl"},
     true, false, [](uint32_t wg, uint32_t rows, uint32_t) { return wg * rows; }},
    {{TileLayout::cooperative_matrix, "cooperative_matrix", "coopmat",
      "Q K^T and P V on the matrix units, a matrix's rows (16; 8 on Intel) a subgroup (two "
      "past d = 128, 64 on Intel Arc)",
      "flash_cm.comp"},
     false, false, [](uint32_t, uint32_t, uint32_t lanes) { return kMatrixRows / lanes; }},
    {{TileLayout::lanes, "lanes", "lanes",
      "splitkv decoding: a KV head's rows in one workgroup, a key's row over a few lanes",
      "splitkv_lanes.comp"},
     true, true, [](uint32_t, uint32_t rows, uint32_t) { return rows; }},
    {{TileLayout::blocks, "blocks", "blocks",
      "register blocks: 4 rows a row group of LANES invocations, 16-byte shared-memory reads",
      "tile_blocks.glsl"},
     true, false, [](uint32_t wg, uint32_t rows, uint32_t lanes) { return wg / lanes * rows; }},
};

constexpr bool layouts_in_order() {
  for (size_t i = 0; i < std::size(kLayouts); ++i)
    if (static_cast<size_t>(kLayouts[i].info.layout) != i) return false;
  return true;
}
static_assert(layouts_in_order(), "kLayouts lists the layouts in TileLayout's order");

inline const LayoutRow& layout_row(TileLayout layout) {
  return kLayouts[static_cast<size_t>(layout)];
}

}  // namespace flashvk::detail
