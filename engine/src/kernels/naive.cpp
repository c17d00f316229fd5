// Host side of naive attention: shaders/naive_scores.comp -> naive_softmax.comp -> naive_pv.comp,
// with S (then P, in place) materialised in device memory. S is allocated for as many (b, h)
// slices as one storage-buffer binding can hold; larger problems run slice group by slice group.
#include <algorithm>

#include "../plan.hpp"

namespace flashvk::detail {

std::vector<PipelineChoice> naive_pipelines(const Spec& spec, DType q, bool trace) {
  Spec softmax_spec = spec;
  softmax_spec.workgroup = 64;  // threads per row in the reduction: a power of two
  // The softmax reads and writes only the fp32 scores, whatever Q, K and V are stored as.
  return {{kernel_key("naive_scores", spec, q, trace), spec},
          {{.program = "naive_softmax", .trace = trace}, softmax_spec},
          {kernel_key("naive_pv", spec, q, trace), spec}};
}

void plan_naive(Plan& plan) {
  const Dims& d = plan.dims;
  uint64_t slice = uint64_t(d.nq) * plan.most_keys * 4;
  uint64_t range = plan.ctx.device().max_storage_buffer_range;
  if (slice > range)
    throw Error("naive attention materialises S, and one head's Nq x Nk = " + std::to_string(d.nq) +
                " x " + std::to_string(plan.most_keys) + " scores (" + std::to_string(slice) +
                " bytes) exceed the device's maxStorageBufferRange (" + std::to_string(range) +
                " bytes); use a fused variant such as flash2");
  plan.check_loop_budget(plan.most_keys);
  uint32_t total = d.batch * d.heads;
  uint32_t per_chunk = static_cast<uint32_t>(std::min<uint64_t>(total, range / slice));
  plan.scratch1 = plan.scratch(slice * per_chunk);
  Bindings b = plan.bindings;
  b[kScratch1] = plan.scratch1.handle();
  VkDescriptorSet set = plan.make_set(b);

  std::vector<VkPipeline> pipes = plan.pipelines();
  VkPipeline scores = pipes[0], softmax = pipes[1], pv = pipes[2];
  uint32_t blocks = (d.nq + plan.spec.workgroup - 1) / plan.spec.workgroup;
  for (uint32_t bh0 = 0; bh0 < total; bh0 += per_chunk) {
    uint32_t n = std::min(per_chunk, total - bh0);
    Push push = plan.push;
    push.bh0 = bh0;
    if (bh0 > 0) plan.add_barrier();  // the previous chunk is done with S
    plan.add(scores, set, {blocks, n, 1}, &push, sizeof(push));
    plan.add_barrier();
    plan.add(softmax, set, {d.nq, n, 1}, &push, sizeof(push));
    plan.add_barrier();
    plan.add(pv, set, {blocks, n, 1}, &push, sizeof(push));
  }
}

}  // namespace flashvk::detail
