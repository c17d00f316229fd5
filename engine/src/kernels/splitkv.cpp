// Host side of Flash-Decoding: shaders/splitkv.comp runs FlashAttention-2 over one chunk of keys
// per workgroup (z), then shaders/splitkv_merge.comp merges each row's chunks with log-sum-exp.
#include <algorithm>
#include <thread>

#include "../plan.hpp"

namespace flashvk::detail {

// Workgroups a lanes decode aims for: on an H100 (decode, 8 KV heads, 4096 to 65536 keys) 64
// chunks each, 512 workgroups of 64 invocations, were fastest of 16 to 256 chunks; more made
// the merge cost more than the extra parallelism gained.
constexpr uint64_t kLaneGroups = 512;

// Enough chunks that the device has about as many workgroups in flight as it can run at once:
// a CPU driver runs one per hardware thread, a GPU several per compute unit (`gpu_groups`).
uint32_t auto_splits(const DeviceInfo& info, uint64_t groups, uint32_t nk, uint32_t keys,
                     uint64_t gpu_groups) {
  uint64_t in_flight =
      info.type == "cpu" ? 2ull * std::max(1u, std::thread::hardware_concurrency()) : gpu_groups;
  uint64_t splits = (in_flight + groups - 1) / groups;
  uint64_t max_splits = (uint64_t(nk) + keys - 1) / keys;  // at least one tile per chunk
  return static_cast<uint32_t>(
      std::clamp<uint64_t>(splits, 1, std::min<uint64_t>(max_splits, 256)));
}

std::vector<PipelineChoice> splitkv_pipelines(const Spec& spec, DType q, const DeviceInfo& info,
                                              bool trace) {
  // The merge: a row per invocation on CPU drivers; on GPUs a row's elements spread over 32
  // lanes (keys = invocations per row), so that its reads of the chunks are wide.
  Spec merge;
  merge.workgroup = 64;
  merge.bc = info.type == "cpu" ? 1 : 32;
  merge.d = spec.d;
  merge.dv = spec.dv;
  merge.mods = spec.mods & kModSinks;  // the merge adds the sink
  PipelineChoice chunks{kernel_key("splitkv", spec, q, trace), spec};
  // The lanes kernel merges a row's chunks in its last workgroup: one dispatch.
  if (spec.layout == TileLayout::lanes) return {chunks};
  return {chunks, {{"splitkv_merge"}, merge}};
}

void plan_splitkv(Plan& plan) {
  const Dims& d = plan.dims;
  uint32_t group = d.heads / d.kv_heads;
  uint64_t rows = uint64_t(group) * d.nq;
  uint32_t blocks = static_cast<uint32_t>((rows + plan.spec.block() - 1) / plan.spec.block());
  // Keys a workgroup takes per step: a tile, or with lanes every cluster's keys.
  bool lanes = plan.spec.layout == TileLayout::lanes;
  uint32_t keys = lanes ? plan.spec.bc * (plan.spec.workgroup / plan.spec.lanes) : plan.spec.bc;
  uint32_t kps = plan.options.keys_per_split;
  if (kps == 0) {
    uint32_t splits = plan.params.hints.splits
                          ? plan.params.hints.splits
                          : auto_splits(plan.ctx.device(), uint64_t(blocks) * d.batch * d.kv_heads,
                                        plan.most_keys, keys, lanes ? kLaneGroups : 1024);
    uint32_t per = (plan.most_keys + splits - 1) / splits;
    kps = (per + keys - 1) / keys * keys;  // chunks start on tile boundaries
    while (!plan.params.hints.splits && plan.impl.loop_limited && kps > keys &&
           plan.loop_iterations(kps) > Plan::kLoopBudget)
      kps = (kps / 2 + keys - 1) / keys * keys;  // more, shorter chunks for llvmpipe
  }
  plan.check_loop_budget(kps);
  // A forced split count may leave trailing chunks empty; they still run and merge as (0, -inf, 0).
  plan.splits = plan.params.hints.splits ? plan.params.hints.splits
                                         : std::max(1u, (plan.most_keys + kps - 1) / kps);
  plan.keys_per_split = kps;
  plan.push.splits = plan.splits;
  plan.push.keys_per_split = kps;

  uint64_t parts = uint64_t(d.batch) * d.heads * d.nq * plan.splits;
  plan.scratch1 = plan.scratch(parts * d.dv * 4);
  plan.scratch2 = plan.scratch(parts * 2 * 4);
  Bindings b = plan.bindings;
  b[kScratch1] = plan.scratch1.handle();
  b[kScratch2] = plan.scratch2.handle();
  std::vector<PipelineChoice> choices =
      splitkv_pipelines(plan.spec, plan.dtype, plan.impl.info, plan.options.trace);
  if (choices.size() == 1) {
    // Lanes: one dispatch, whose last workgroup of each row block merges its chunks; a counter a
    // row block (in the trace slot, which lanes never traces), zeroed before every run.
    plan.trace = plan.scratch(uint64_t(blocks) * d.batch * d.kv_heads * 4);
    plan.add_fill(plan.trace, 0);
    b[kChunksDone] = plan.trace.handle();
    plan.add(plan.pipeline(choices[0]), plan.make_set(b),
             {blocks, d.batch * d.kv_heads, plan.splits});
    return;
  }
  VkDescriptorSet set = plan.make_set(b);
  plan.add(plan.pipeline(choices[0]), set, {blocks, d.batch * d.kv_heads, plan.splits});
  plan.add_barrier();
  const Spec& merge_spec = choices[1].spec;
  uint64_t total_rows = uint64_t(d.batch) * d.heads * d.nq;
  uint64_t merge_groups = (total_rows + 64 / merge_spec.bc - 1) / (64 / merge_spec.bc);
  VkPipeline merge = plan.pipeline(choices[1]);
  uint64_t across = std::min<uint64_t>(merge_groups, plan.ctx.device().max_workgroup_count[0]);
  plan.add(merge, set,
           {static_cast<uint32_t>(across),
            static_cast<uint32_t>((merge_groups + across - 1) / across), 1});
}

}  // namespace flashvk::detail
