// Host side of rotary embedding (shaders/rope.comp): cos/sin of p * theta_i are tabulated here in
// float64, one row per position, so long positions keep their angle exactly.
#include <cmath>

#include "../plan.hpp"

namespace flashvk::detail {

namespace {

struct RopePush {
  uint32_t vectors, seq_len, dim, half_layout;
};

std::vector<float> angle_table(uint32_t seq_len, uint32_t dim, double base, int64_t first) {
  uint32_t pairs = dim / 2;
  std::vector<float> table(size_t(seq_len) * pairs * 2);
  for (uint32_t p = 0; p < seq_len; ++p) {
    for (uint32_t i = 0; i < pairs; ++i) {
      double theta = std::pow(base, -2.0 * i / dim);
      double angle = double(first + p) * theta;
      table[(size_t(p) * pairs + i) * 2] = static_cast<float>(std::cos(angle));
      table[(size_t(p) * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

}  // namespace

void plan_rope(Plan& plan, const Tensor& x, Tensor& rotated, int64_t first_position) {
  const auto& shape = x.shape();
  uint32_t dim = static_cast<uint32_t>(shape.back());
  uint32_t seq_len = static_cast<uint32_t>(shape[shape.size() - 2]);
  if (!(plan.params.rope_base > 1.0) || !std::isfinite(plan.params.rope_base))
    throw Error("rope base must be a finite number greater than 1");
  plan.check_binding(x, "the RoPE input");
  rotated = Tensor(plan.ctx, shape, x.dtype());
  plan.device_bytes += rotated.bytes();
  std::vector<float> table = angle_table(seq_len, dim, plan.params.rope_base, first_position);
  plan.extra.push_back(plan.scratch(std::max<size_t>(table.size(), 1) * 4));
  plan.extra.back().write(table.data(), table.size() * 4);
  Bindings b;
  b.fill(plan.impl.dummy.handle());
  b[0] = binding(x);
  b[1] = binding(rotated);
  b[2] = plan.extra.back().handle();
  RopePush push{static_cast<uint32_t>(numel(shape) / dim), seq_len, dim,
                plan.params.rope == RopeLayout::half ? 1u : 0u};
  uint64_t invocations = uint64_t(push.vectors) * (dim / 2 + dim % 2);
  VkPipeline pipe = plan.impl.pipeline(
      std::string("rope") + (x.dtype() == DType::f16 ? "_f16" : "_f32"), Spec{64, 1, 1, 1});
  plan.add(pipe, plan.make_set(b), {static_cast<uint32_t>((invocations + 63) / 64), 1, 1}, &push,
           sizeof(push));
}

}  // namespace flashvk::detail
