// GPU traces against the reference recurrences: per-key state from the kernels run with Bc = 1,
// per-tile state from the tiled kernels, on ordinary and extreme inputs.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

class TraceTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {};

void expect_series_near(const std::vector<float>& gpu, const reference::Vec& ref, double tol,
                        const char* what) {
  ASSERT_EQ(gpu.size(), ref.size()) << what;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::isnan(ref[i])) continue;  // the variant does not keep it
    if (std::isinf(ref[i])) {
      EXPECT_EQ(gpu[i], float(ref[i])) << what << " step " << i;
      continue;
    }
    EXPECT_NEAR(gpu[i], ref[i], tol * std::max(1.0, std::abs(ref[i]))) << what << " step " << i;
  }
}

void check_trace(Variant variant, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 AttentionParams params, uint32_t head, uint32_t row) {
  params.variant = variant;
  Trace t = trace(context(), q, k, v, params, 0, head, row);
  Dims d = check_shapes(q.shape, k.shape, v.shape);
  reference::Vec s = reference::row_scores(q, k, d, params, 0, head, row);
  uint32_t chunk =
      variant == Variant::splitkv ? t.splits.empty() ? 0 : t.splits[0].end - t.splits[0].begin : 0;
  reference::RowTrace ref =
      reference::variant_row(variant, s, reference::value_rows(v, d, 0, head), chunk);
  if (variant == Variant::splitkv)
    ref = reference::splitkv_row(s, reference::value_rows(v, d, 0, head), chunk);
  double tol = 1e-4;
  expect_series_near(t.steps.s, s, tol, "s");
  expect_series_near(t.steps.m, ref.m, tol, "m");
  expect_series_near(t.steps.l, ref.l, tol, "l");
  expect_series_near(t.steps.w, ref.w, tol, "w");
  if (variant != Variant::naive) expect_series_near(t.steps.lse, ref.lse, tol, "lse");
  for (size_t i = 0; i < t.steps.o.size(); ++i)
    for (size_t c = 0; c < d.dv; ++c)
      EXPECT_NEAR(t.steps.o[i][c], ref.o[i][c], tol * std::max(1.0, std::abs(ref.o[i][c])))
          << "o step " << i;
  reference::RowTrace direct = reference::direct_row(s, reference::value_rows(v, d, 0, head));
  for (size_t c = 0; c < d.dv; ++c) EXPECT_NEAR(t.out[c], direct.out[c], 1e-5);

  // Per tile: the state after tile t equals the per-key state after the tile's last key
  // (except naive, which has no tiles, and w, which is the tile's share).
  if (variant == Variant::naive) return;
  ASSERT_GT(t.tile_size, 0u);
  for (size_t tile = 0; tile < t.tiles.size(); ++tile) {
    size_t last = std::min<size_t>(d.nk, (tile + 1) * t.tile_size) - 1;
    if (!std::isnan(ref.m[last])) {
      if (std::isinf(ref.m[last])) continue;
      EXPECT_NEAR(t.tiles.m[tile], ref.m[last], tol * std::max(1.0, std::abs(ref.m[last])));
      EXPECT_NEAR(t.tiles.l[tile], ref.l[last], tol * std::max(1.0, std::abs(ref.l[last])));
    }
    if (!std::isinf(ref.lse[last])) {
      EXPECT_NEAR(t.tiles.lse[tile], ref.lse[last], tol * std::max(1.0, std::abs(ref.lse[last])));
    }
  }
}

TEST_P(TraceTest, OrdinaryInputFollowsTheReferenceRecurrence) {
  HostTensor q = random_tensor({1, 2, 7, 8}, 1), k = random_tensor({1, 1, 150, 8}, 2),
             v = random_tensor({1, 1, 150, 6}, 3);
  AttentionParams params;
  params.mods.causal = true;
  check_trace(GetParam(), q, k, v, params, 1, 5);
}

TEST_P(TraceTest, FallingThenRisingAndMaskedKeys) {
  std::vector<float> s;
  for (int j = 0; j < 90; ++j) s.push_back(-25.0f * float(j));
  for (int j = 0; j < 40; ++j) s.push_back(-2000.0f + 52.0f * float(j));
  HostTensor q({1, 1}, {1.0f}), k({130, 1}, s), v = random_tensor({130, 4}, 4);
  AttentionParams params;
  params.scale = 1.0f;
  params.mods.key_mask.assign(130, 1);
  for (int j = 40; j < 60; ++j) params.mods.key_mask[size_t(j)] = 0;
  check_trace(GetParam(), q, k, v, params, 0, 0);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, TraceTest, ::testing::ValuesIn(all_variants()),
                         variant_param_name);

TEST_F(VulkanTest, TraceRefusesOutOfRangeIndices) {
  HostTensor q = random_tensor({1, 2, 3, 4}, 1);
  EXPECT_THROW(trace(context(), q, q, q, {}, 0, 0, 3), Error);
  EXPECT_THROW(trace(context(), q, q, q, {}, 0, 2, 0), Error);
  EXPECT_THROW(trace(context(), q, q, q, {}, 1, 0, 0), Error);
}

}  // namespace
}  // namespace flashvk::test
