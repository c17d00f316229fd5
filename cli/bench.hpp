#pragma once
#include <string>
#include <vector>

#include "flashvk/attention.hpp"

namespace flashvk::cli {

/// `flashvk bench`: GPU time (timestamp queries, median of --repeat runs after a warm-up),
/// GFLOP/s and device memory per variant, printed as a table and optionally written as JSON.
int cmd_bench(const std::vector<std::string>& argv);

class Args;
/// The context every subcommand runs on: --device (default: Context::create's choice) and the
/// pipeline cache; with flashvk::flex built, user-written functions (--score-mod, --mask-mod)
/// enabled.
/// The context of --device and --matrix-api (and ContextOptions::matrix_skip: a timing
/// diagnostic, FLASHVK_MATRIX_SKIP, which bench passes; pipelines reads it too).
Context open_device(const Args& args, const std::string& matrix_skip = "");
/// `flashvk bench --decode-loop` (decode_loop.cpp): one token a step over a growing KV cache,
/// recorded once; host and GPU time per step and the objects created after the first. Exits 1
/// if a step after the first created a Vulkan object or changed the device memory.
int run_decode_loop(const Args& args);

/// "registers 48x8": a layout with its query rows per workgroup x keys per tile (none for naive),
/// ", 3 splits" for splitkv, and ", 32 rows a group" where group_rows (the matrix kernel's,
/// where a call asked) is not 0.
std::string tiling_text(Variant variant, TileLayout layout, uint32_t block_rows,
                        uint32_t block_keys, uint32_t splits, uint32_t group_rows = 0);

}  // namespace flashvk::cli
