// Host side of shaders/rope.comp: rotary embedding, and the append of new K/V rows into a KV cache
// (rotating K). cos/sin of p * theta_i are tabulated here in float64, one row per position, so
// long positions keep their angle exactly.
#include <cmath>
#include <memory>
#include <mutex>
#include <tuple>

#include "../plan.hpp"

namespace flashvk::detail {

namespace {

struct RopePush {
  uint32_t vectors, seq_len, dim, flags, out_rows, out_values;
};

}  // namespace

PipelineChoice rows_pipeline(DType x, DType dst) {
  Spec spec;
  spec.workgroup = 64;  // rope.comp: a pair (or a block) an invocation, 64 a workgroup
  spec.k_format = static_cast<uint32_t>(dst);  // QUANT_OUT's OUT_FORMAT
  // Into a block format, one invocation a block of 32 values; else one a pair.
  bool quantise = dtype_quantised(dst);
  return {{.program = "rope", .q = x, .quant = quantise}, spec};
}

VkBuffer plan_angles(Plan& plan, uint32_t positions, uint32_t dim, int64_t first) {
  if (!(plan.params.rope_base > 1.0) || !std::isfinite(plan.params.rope_base))
    throw Error("rope base must be a finite number greater than 1");
  // One table per context for each (base, positions, d, first): the recordings of one cache
  // (its prompt's, its decode step's) share theirs, kept while a plan holds it.
  auto key = std::make_tuple(plan.params.rope_base, positions, dim, first);
  std::lock_guard lock(plan.impl.table_mutex);
  std::shared_ptr<Buffer> shared = plan.impl.angle_tables[key].lock();
  if (shared) {
    plan.angle_tables.push_back(shared);
    return shared->handle();
  }
  uint32_t pairs = dim / 2;
  std::vector<float> table(size_t(positions) * pairs * 2);
  for (uint32_t p = 0; p < positions; ++p) {
    for (uint32_t i = 0; i < pairs; ++i) {
      double theta = std::pow(plan.params.rope_base, -2.0 * i / dim);
      double angle = double(first + p) * theta;
      table[(size_t(p) * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      table[(size_t(p) * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  shared = std::make_shared<Buffer>(plan.scratch(std::max<size_t>(table.size(), 1) * 4));
  shared->write(table.data(), table.size() * 4);
  plan.impl.angle_tables[key] = shared;
  plan.angle_tables.push_back(shared);
  return shared->handle();
}

void plan_rows(Plan& plan, const Tensor& x, const Tensor& dst, uint32_t flags, VkBuffer angles) {
  const auto& shape = x.shape();
  uint32_t dim = static_cast<uint32_t>(shape.back());
  uint32_t seq_len = static_cast<uint32_t>(shape[shape.size() - 2]);
  plan.check_binding(x, "the rows to rotate or append");
  plan.check_binding(dst, "the rotated rows or the KV cache appended to");
  if (plan.params.rope == RopeLayout::half) flags |= kRowsHalf;
  Bindings b;
  b.fill(plan.impl.dummy.handle());
  b[0] = binding(x);
  b[1] = binding(dst);
  if (flags & kRowsRotate) b[2] = angles;
  // Into a block format, one invocation a block of 32 values; else one a pair.
  bool quantise = dtype_quantised(dst.dtype());
  RopePush push{static_cast<uint32_t>(numel(shape) / dim),
                seq_len,
                dim,
                flags,
                static_cast<uint32_t>(dst.shape()[dst.shape().size() - 2]),
                static_cast<uint32_t>(numel(dst.shape()))};
  uint64_t invocations = uint64_t(push.vectors) * (quantise ? dim / 32 : dim / 2 + dim % 2);
  VkPipeline pipe = plan.pipeline(rows_pipeline(x.dtype(), dst.dtype()));
  plan.add(pipe, plan.make_set(b), {static_cast<uint32_t>((invocations + 63) / 64), 1, 1}, &push,
           sizeof(push));
}

void plan_rope(Plan& plan, const Tensor& x, Tensor& rotated, int64_t first_position) {
  const auto& shape = x.shape();
  uint32_t dim = static_cast<uint32_t>(shape.back());
  uint32_t seq_len = static_cast<uint32_t>(shape[shape.size() - 2]);
  VkBuffer angles = plan_angles(plan, seq_len, dim, first_position);
  rotated = Tensor(plan.ctx, shape, x.dtype());
  plan.device_bytes += rotated.bytes();
  plan_rows(plan, x, rotated, kRowsRotate, angles);
}

}  // namespace flashvk::detail
