#pragma once
// The tile layouts' table (attention.hpp's TileLayoutInfo), constexpr like the variants' table,
// with what the planner asks of a layout besides: one row per layout, read by the planner, the
// kernel builds, the pipeline report and the front ends. How a layout is chosen and sized is
// tiling.cpp's; its kernels are the files the row names.
#include <iterator>

#include "flashvk/attention.hpp"

namespace flashvk::detail {

/// What a workgroup's query rows follow from (Spec's fields): its invocations, ROWS, LANES, and
/// for cooperative matrices the groups' lanes and rows, SUBGROUP, CM_M and CM_ROW_MATRICES.
struct WorkgroupShape {
  uint32_t workgroup, rows, lanes, subgroup, m, row_matrices = 1;
};

struct LayoutRow {
  TileLayoutInfo info;
  /// A K/V tile is one iteration of the kernel's key loop (llvmpipe's loop cap,
  /// Plan::loop_iterations); shared tiles also loop over its keys.
  bool whole_tiles;
  /// With an additive mask's or mask_mod's tile bitmap, the kernel tests each tile's bit
  /// (lanes) instead of walking the words with next_seen_tile.
  bool tests_each_tile;
  /// Query rows one workgroup covers (Spec::block).
  uint32_t (*workgroup_rows)(const WorkgroupShape&);
};

/// The cooperative-matrix kernel's rows of matrices a workgroup by default, whatever the
/// matrices' shape (its groups are 64 / m, of the shape's subgroup each): its query rows, halved
/// where LANES groups share a row block (shaders/flash_cm.comp's WG_ROWS). A call may ask for
/// twice as many (ExecutionHints::block_rows 128: twice the groups).
inline constexpr uint32_t kMatrixRows = 64;

// Each layout's workgroup_rows: one row an invocation; ROWS an invocation (register tiles);
// CM_ROW_MATRICES of CM_M rows a group of SUBGROUP invocations, a block over LANES groups
// (cooperative matrices); ROWS (lanes); ROWS a row group of LANES invocations (blocks).
constexpr uint32_t rows_an_invocation(const WorkgroupShape& w) { return w.workgroup; }
constexpr uint32_t rows_each(const WorkgroupShape& w) { return w.workgroup * w.rows; }
constexpr uint32_t rows_of_groups(const WorkgroupShape& w) {
  return w.workgroup / w.subgroup * w.m * w.row_matrices / w.lanes;
}
constexpr uint32_t rows_asked(const WorkgroupShape& w) { return w.rows; }
constexpr uint32_t rows_a_row_group(const WorkgroupShape& w) {
  return w.workgroup / w.lanes * w.rows;
}

inline constexpr LayoutRow kLayouts[] = {
    {{TileLayout::automatic, "automatic", "auto", "the engine's choice (tiling.cpp)", ""},
     false, false, rows_an_invocation},
    {{TileLayout::shared, "shared", "shared",
      "one query row an invocation, the K/V tile in shared memory; traces and naive",
      "tile_shared.glsl"},
     false, false, rows_an_invocation},
    {{TileLayout::registers, "registers", "registers",
      "ROWS rows an invocation, a tile one key a subgroup lane, read with shuffles; CPU drivers",
      "tile_registers.glsl"},
     true, false, rows_each},
    {{TileLayout::cooperative_matrix, "cooperative_matrix", "coopmat",
      "Q K^T and P V on the matrix units, a matrix's rows (16; 8 on Intel) a subgroup (two "
      "past d = 128, 64 on Intel Arc)",
      "flash_cm.comp"},
     false, false, rows_of_groups},
    {{TileLayout::lanes, "lanes", "lanes",
      "splitkv decoding: a KV head's rows in one workgroup, a key's row over a few lanes",
      "splitkv_lanes.comp"},
     true, true, rows_asked},
    {{TileLayout::blocks, "blocks", "blocks",
      "register blocks: 4 rows a row group of LANES invocations, 16-byte shared-memory reads",
      "tile_blocks.glsl"},
     true, false, rows_a_row_group},
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
