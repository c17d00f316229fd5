// Host side of the fused one-kernel variants: shaders/online.comp, flash1.comp, flash2.comp and
// flashd.comp. They share the dispatch shape: x = blocks of Br packed (head-in-group, query)
// rows, y = batch * KV heads, so all query heads that share a KV head reuse its K/V tiles.
#include "../plan.hpp"

namespace flashvk::detail {

void plan_fused(Plan& plan) {
  const Dims& d = plan.dims;
  uint32_t group = d.heads / d.kv_heads;
  uint64_t rows = uint64_t(group) * d.nq;
  uint32_t blocks = static_cast<uint32_t>((rows + plan.spec.block() - 1) / plan.spec.block());
  plan.check_loop_budget(plan.most_keys);
  plan.add(plan.pipelines()[0], plan.make_set(plan.bindings), {blocks, d.batch * d.kv_heads, 1});
}

}  // namespace flashvk::detail
