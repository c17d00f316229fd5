// Inputs that break naive code: huge logits, the FLASH-D underflow trap, attention sinks, masked
// keys mid-row, uniform rows, rows that see nothing. Every variant must stay within fp32 accuracy.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

// d = 1 with q = 1 makes the scores exactly the keys: s_j = k_j (scale 1).
struct ScoreRow {
  HostTensor q, k, v;
};

ScoreRow from_scores(const std::vector<float>& scores, uint32_t dv, uint32_t seed) {
  uint32_t n = static_cast<uint32_t>(scores.size());
  ScoreRow r{HostTensor({1, 1, 1, 1}, {1.0f}), HostTensor({1, 1, n, 1}, scores),
             random_tensor({1, 1, n, dv}, seed)};
  return r;
}

class ExtremeTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {
 protected:
  void expect_exact(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                    AttentionParams params, const char* what) {
    params.variant = GetParam();
    reference::Result ref = reference::direct(q, k, v, params);
    double tol = tolerance(q, k, v, params);
    // The default layout, and register blocks (the GPUs' default) where the shape has them.
    std::vector<TileLayout> layouts = {TileLayout::automatic};
    if (variant_info(params.variant).fused && q.shape[3] % 4 == 0 && v.shape[3] % 4 == 0)
      layouts.push_back(TileLayout::blocks);
    for (TileLayout layout : layouts) {
      params.hints.tile_layout = layout;
      HostAttentionResult gpu = attention(context(), q, k, v, params);
      EXPECT_LE(max_error(gpu.out.data, ref.out), tol)
          << what << ", " << tile_layout_name(gpu.tile_layout) << ", tolerance " << tol;
      EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5) << what;
    }
  }
};

TEST_P(ExtremeTest, HugeLogits) {
  HostTensor q = random_tensor({1, 2, 20, 64}, 1, 12.0f),
             k = random_tensor({1, 2, 150, 64}, 2, 12.0f), v = random_tensor({1, 2, 150, 64}, 3);
  AttentionParams params;
  params.scale = 1.0f;  // scores of several thousand
  expect_exact(q, k, v, params, "huge logits");
}

TEST_P(ExtremeTest, FallingThenRisingScores) {
  // 200 keys falling to -3000, then rising to +50: the literal FLASH-D recurrence's ln w
  // underflows on the way down, and the rise must still take the weight.
  std::vector<float> s;
  for (int j = 0; j < 200; ++j) s.push_back(-15.0f * float(j));
  for (int j = 0; j < 100; ++j) s.push_back(-3000.0f + 30.5f * float(j));
  ScoreRow r = from_scores(s, 8, 4);
  AttentionParams params;
  params.scale = 1.0f;
  expect_exact(r.q, r.k, r.v, params, "falling then rising");
}

TEST_P(ExtremeTest, AttentionSink) {
  HostTensor q = random_tensor({1, 1, 30, 16}, 5), k = random_tensor({1, 1, 90, 16}, 6),
             v = random_tensor({1, 1, 90, 16}, 7);
  for (int i = 0; i < 30; ++i)
    for (int c = 0; c < 16; ++c) q.at({0, 0, i, c}) = std::abs(q.at({0, 0, i, c})) + 1.0f;
  for (int c = 0; c < 16; ++c) k.at({0, 0, 0, c}) = 40.0f;  // key 0 dominates every row
  expect_exact(q, k, v, {}, "attention sink");
}

TEST_P(ExtremeTest, MaskedKeysMidRow) {
  HostTensor q = random_tensor({2, 2, 12, 8}, 8), k = random_tensor({2, 2, 100, 8}, 9),
             v = random_tensor({2, 2, 100, 8}, 10);
  AttentionParams params;
  params.mods.key_mask.assign(200, 1);
  for (int j = 0; j < 100; ++j)
    if (j == 0 || (j >= 20 && j < 70) || j % 9 == 4) params.mods.key_mask[size_t(j)] = 0;
  for (int j = 33; j < 100; ++j) params.mods.key_mask[100 + size_t(j)] = 0;
  params.mods.causal = true;
  expect_exact(q, k, v, params, "masked keys mid-row");
}

TEST_P(ExtremeTest, UniformRows) {
  HostTensor q = random_tensor({1, 1, 5, 4}, 11), k({1, 1, 131, 4}),
             v = random_tensor({1, 1, 131, 6}, 12);
  for (float& x : k.data) x = 0.5f;  // every score in a row is equal: w_i = 1/i
  expect_exact(q, k, v, {}, "uniform rows");
}

TEST_P(ExtremeTest, RowsThatSeeNoKeyGiveZerosAndMinusInfinity) {
  HostTensor q = random_tensor({2, 1, 6, 8}, 13), k = random_tensor({2, 1, 40, 8}, 14),
             v = random_tensor({2, 1, 40, 8}, 15);
  AttentionParams params;
  params.variant = GetParam();
  params.mods.key_mask.assign(80, 1);
  for (int j = 0; j < 40; ++j) params.mods.key_mask[size_t(j)] = 0;  // batch 0 sees nothing
  HostAttentionResult gpu = attention(context(), q, k, v, params);
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(std::isinf(gpu.lse.at({0, 0, i})) && gpu.lse.at({0, 0, i}) < 0);
    for (int c = 0; c < 8; ++c) EXPECT_EQ(gpu.out.at({0, 0, i, c}), 0.0f);
  }
  reference::Result ref = reference::direct(q, k, v, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params));
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ExtremeTest, ::testing::ValuesIn(all_variants()),
                         variant_param_name);

}  // namespace
}  // namespace flashvk::test
