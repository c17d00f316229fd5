// The tile layout a build runs, each a file of its own (docs/engine.md, "Tile layouts"): its
// tiles, scores and output updates (included by tile.glsl), and with LAYOUT_MAIN its key loop
// (included by fused_main.glsl). The lanes and cooperative-matrix layouts are kernels of their
// own (splitkv_lanes.comp, flash_cm.comp).
#if defined(REG_TILE)
#include "tile_registers.glsl"
#elif defined(BLOCK_TILE)
#include "tile_blocks.glsl"
#else
#include "tile_shared.glsl"
#endif
