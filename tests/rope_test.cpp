// Rotary embedding against the float64 reference, both layouts, offset positions, both dtypes.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

struct RopeCase {
  RopeLayout layout;
  DType dtype;
  int64_t offset;
  int64_t dim;
};

class RopeTest : public VulkanTest, public ::testing::WithParamInterface<RopeCase> {};

TEST_P(RopeTest, MatchesReference) {
  RopeCase c = GetParam();
  HostTensor x = random_tensor({2, 3, 17, c.dim}, 7);
  if (c.dtype == DType::f16) x = round_to_half(x);
  RopeParams params{c.layout, 10000.0, c.offset};
  Tensor gpu = rope(context(), Tensor::upload(context(), x, c.dtype), params);
  HostTensor got = gpu.download();
  HostTensor want = reference::rope(x, params);
  double tol = (c.dtype == DType::f16 ? std::ldexp(1.0, -10) : 1e-6) * (1.0 + max_abs(x));
  std::vector<double> want_d(want.data.begin(), want.data.end());
  EXPECT_LE(max_error(got.data, want_d), tol);
}

std::vector<RopeCase> rope_cases() {
  std::vector<RopeCase> cases;
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half})
    for (DType dtype : {DType::f32, DType::f16})
      for (int64_t offset : {int64_t(0), int64_t(1000), int64_t(65000)})
        cases.push_back({layout, dtype, offset, 64});
  cases.push_back({RopeLayout::interleaved, DType::f32, 3, 7});  // odd d: last element kept
  cases.push_back({RopeLayout::half, DType::f32, 3, 2});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RopeTest, ::testing::ValuesIn(rope_cases()));

// Closed form: rotating (1, 0) by p * theta_0 = p radians gives (cos p, sin p).
TEST_F(VulkanTest, RopeClosedFormFirstPair) {
  HostTensor x({5, 2}, {1, 0, 1, 0, 1, 0, 1, 0, 1, 0});
  HostTensor got = rope(context(), Tensor::upload(context(), x, DType::f32),
                        {RopeLayout::interleaved, 10000.0, 10})
                       .download();
  for (int p = 0; p < 5; ++p) {
    EXPECT_NEAR(got.at({p, 0}), std::cos(10.0 + p), 1e-6);
    EXPECT_NEAR(got.at({p, 1}), std::sin(10.0 + p), 1e-6);
  }
}

TEST_F(VulkanTest, AttentionWithRopeMatchesReference) {
  HostTensor q = random_tensor({1, 4, 9, 32}, 1), k = random_tensor({1, 2, 40, 32}, 2),
             v = random_tensor({1, 2, 40, 32}, 3);
  for (RopeLayout layout : {RopeLayout::interleaved, RopeLayout::half}) {
    for (Variant variant : {Variant::flash2, Variant::splitkv}) {
      AttentionParams params;
      params.variant = variant;
      params.rope = layout;
      params.mods.causal = true;
      HostAttentionResult gpu = attention(context(), q, k, v, params);
      reference::Result ref = reference::direct(q, k, v, params);
      EXPECT_LE(max_error(gpu.out.data, ref.out), 2 * tolerance(q, k, v, params))
          << rope_name(layout) << " " << variant_name(variant);
      AttentionParams plain;
      plain.mods.causal = true;
      reference::Result unrotated = reference::direct(q, k, v, plain);
      EXPECT_GT(max_error(gpu.out.data, unrotated.out), 1e-3) << "RoPE had no effect";
    }
  }
}

}  // namespace
}  // namespace flashvk::test
