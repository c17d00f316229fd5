#pragma once
// What the engine compiles for a call, and what the driver made of it: the pipeline report
// (`flashvk pipelines`, docs/performance.md's tables per GPU family). It runs on a compile-only
// context (ContextOptions::compile_only), so on any device that compiles, Mesa's null devices
// included (RADV_FORCE_FAMILY: AMD's shader compiler on a machine without an AMD GPU).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "flashvk/tensor.hpp"

namespace flashvk {

struct PipelineDescription;

/// An attention call described by its shapes, as `flashvk bench` describes one.
struct PipelineCall {
  uint32_t batch = 1, heads = 1, kv_heads = 0, nq = 1, nk = 1, d = 64, dv = 0;  // 0: heads, d
  AttentionParams params;  ///< variant, modifiers, RoPE, hints (layout, tiles, fp16 arithmetic)
  Storage storage;         ///< Q's, K's and V's
  /// K and V in a paged cache of pages of this many tokens (paged_attention); 0: dense.
  uint32_t page_size = 0;
  /// Which of the call's pipelines to build and describe: asked of each before it is compiled,
  /// everything but its `executables` filled in (and, with user functions, its `spirv`); false
  /// leaves it out. Empty: all of them.
  std::function<bool(const PipelineDescription&)> only;
};

/// One statistic of a compiled pipeline, by the driver's own name (RADV: "VGPRs", "Spilled
/// VGPRs", "Subgroups per SIMD", ...): VkPipelineExecutableStatisticKHR.
struct PipelineStatistic {
  std::string name, description;
  std::variant<bool, int64_t, uint64_t, double> value;
  double number() const;  ///< the value as a number (a bool as 0 or 1)
};

/// One executable the driver made of a pipeline (a compute pipeline has one).
struct PipelineExecutable {
  std::string name, description;
  uint32_t subgroup_size = 0;
  std::vector<PipelineStatistic> statistics;
  /// The driver's internal representations, by its names (RADV: "ACO IR", "Assembly"), as text.
  std::vector<std::pair<std::string, std::string>> representations;
  /// The statistic named `name`, if the driver gave it.
  const PipelineStatistic* statistic(const std::string& name) const;
  /// The text of the first representation whose name contains `part`, or "".
  std::string representation(const std::string& part) const;
};

/// One pipeline the engine builds for a call.
struct PipelineDescription {
  std::string program;  ///< the kernel ("flash2", "splitkv_merge")
  std::string shader;   ///< the build's name in builds.def's table, which names its SPIR-V
  std::string source;   ///< the GLSL file it is compiled from ("flash2.comp")
  TileLayout layout = TileLayout::shared;
  uint32_t block_rows = 0, block_keys = 0;  ///< query rows a workgroup covers, keys a tile
  /// The subgroup size the pipeline requires, every subgroup full (VK_EXT_subgroup_size_
  /// control), because its kernel uses subgroup operations built for it; 0: it assumes none.
  /// The size the driver compiled is each executable's subgroup_size.
  uint32_t required_subgroup = 0;
  /// The specialization constants exactly as the pipeline was created: (ID, value), and the
  /// constants' names in the shaders (shaders/spec_constants.glsl), in ID order.
  std::vector<std::pair<uint32_t, uint32_t>> spec_constants;
  std::vector<std::string> spec_names;
  std::vector<uint32_t> spirv;
  /// What the driver reports (VK_KHR_pipeline_executable_properties); empty where it has none.
  std::vector<PipelineExecutable> executables;
};

/// Every pipeline the engine builds for `call` (RoPE's, then the variant's kernels in dispatch
/// order), built on `ctx` with the tiling it would run. On a compile-only context of a device
/// with VK_KHR_pipeline_executable_properties each carries the driver's statistics and
/// disassembly; elsewhere `executables` is empty. Throws Error for a call the engine would
/// refuse.
std::vector<PipelineDescription> describe_pipelines(Context& ctx, const PipelineCall& call);

/// AMD's RDNA 2 and later, by what the driver tells (DeviceInfo::registers_per_simd: 512 or
/// more vector registers a SIMD; GCN has 256).
bool is_rdna(const DeviceInfo& info);
/// Subgroups of 32 lanes a SIMD (one of 64 counts twice, as RADV counts) that whole workgroups
/// of `invocations`, in subgroups of `subgroup` lanes, each using `lds_bytes` of LDS, leave on
/// RDNA: a WGP shares 128 KiB among 4 SIMDs, allocated in 1 KiB steps. At most `bound`, what
/// else limits it (the registers; RADV's "Subgroups per SIMD", which rounds the LDS bound up).
double rdna_subgroups_per_simd(uint64_t lds_bytes, uint32_t invocations, uint32_t subgroup,
                               double bound);

}  // namespace flashvk
