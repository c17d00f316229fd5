// The seeds' own examples and the algebra that ties their recurrences together.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

using reference::Vec;

std::vector<Vec> random_rows(size_t n, size_t width, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<Vec> rows(n, Vec(width));
  for (auto& r : rows)
    for (double& x : r) x = dist(rng);
  return rows;
}

// Seed 000's Python functions on the same random rows: every recurrence is exact in float64.
TEST(SeedRecurrences, AllAgreeWithTheDirectFormulaInFloat64) {
  std::vector<Vec> v = random_rows(97, 5, 1);
  Vec s(97);
  std::mt19937 rng(2);
  std::normal_distribution<double> dist(0.0, 3.0);
  for (double& x : s) x = dist(rng);
  s[10] = s[50] = -std::numeric_limits<double>::infinity();  // masked keys mid-row
  reference::RowTrace direct = reference::direct_row(s, v);
  const std::pair<const char*, reference::RowTrace> rows[] = {
      {"naive", reference::naive_row(s, v)},
      {"online", reference::online_row(s, v)},
      {"flash1", reference::flash1_row(s, v)},
      {"flash2", reference::flash2_row(s, v)},
      {"flashd", reference::flashd_row(s, v)},
      {"flashd_seed", reference::flashd_seed_row(s, v)},
      {"splitkv", reference::splitkv_row(s, v, 13)},
  };
  for (const auto& [name, row] : rows) {
    for (size_t k = 0; k < 5; ++k) EXPECT_NEAR(row.out[k], direct.out[k], 1e-12) << name;
    if (!std::isnan(row.final_lse)) {
      EXPECT_NEAR(row.final_lse, direct.final_lse, 1e-12) << name;
    }
  }
}

// The identities the viewer's derivation panel shows, step by step: FA2's o/l is FA1's o, and
// FLASH-D's w_i is e^(s_i - m_i) / l_i, the seed's sigmoid form equals the log-sum-exp form.
TEST(SeedRecurrences, StepwiseIdentitiesHold) {
  std::vector<Vec> v = random_rows(60, 3, 3);
  Vec s(60);
  for (size_t i = 0; i < 60; ++i) s[i] = std::sin(double(i)) * 4.0;
  auto fa1 = reference::flash1_row(s, v), fa2 = reference::flash2_row(s, v);
  auto fd = reference::flashd_row(s, v), seed = reference::flashd_seed_row(s, v);
  for (size_t i = 0; i < 60; ++i) {
    for (size_t k = 0; k < 3; ++k) EXPECT_NEAR(fa2.o[i][k] / fa2.l[i], fa1.o[i][k], 1e-12);
    EXPECT_NEAR(fd.w[i], std::exp(s[i] - fa1.m[i]) / fa1.l[i], 1e-12);
    EXPECT_NEAR(fd.w[i], seed.w[i], 1e-12);
    EXPECT_NEAR(fd.lse[i], fa1.m[i] + std::log(fa1.l[i]), 1e-12);
  }
}

// Seed 004's Triton puzzle: q, k, v of 200 scalars, z_i = sum_j softmax(q_i k_j)_j v_j.
TEST_F(VulkanTest, Seed004ScalarAttentionExample) {
  HostTensor q = random_tensor({200, 1}, 4), k = random_tensor({200, 1}, 5),
             v = random_tensor({200, 1}, 6);
  AttentionParams params;
  params.scale = 1.0f;  // the puzzle has no 1/sqrt(d)
  for (Variant variant : all_variants()) {
    params.variant = variant;
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    for (int i = 0; i < 200; ++i) {  // the puzzle's spec, written out in float64
      double m = -1e300, sum = 0.0, z = 0.0;
      for (int j = 0; j < 200; ++j) m = std::max(m, double(q.data[i]) * k.data[j]);
      for (int j = 0; j < 200; ++j) sum += std::exp(double(q.data[i]) * k.data[j] - m);
      for (int j = 0; j < 200; ++j)
        z += std::exp(double(q.data[i]) * k.data[j] - m) / sum * v.data[j];
      EXPECT_NEAR(gpu.out.data[i], z, 1e-5) << variant_name(variant) << " row " << i;
    }
  }
}

// Why flashd.comp does not use the seed's form as written: run in fp32, ln w underflows on a long
// fall and the recurrence can never give weight to a later, larger score.
TEST_F(VulkanTest, LiteralFlashDUnderflowsInFp32ButTheKernelDoesNot) {
  std::vector<float> s;
  for (int j = 0; j < 100; ++j) s.push_back(-20.0f * float(j));  // falls to -1980
  s.push_back(10.0f);  // then one key that should take almost all the weight
  float weight = 1.0f, prev = s[0], o = 0.0f;
  std::vector<float> v(s.size(), 0.0f);
  v.back() = 1.0f;
  for (size_t i = 0; i < s.size(); ++i) {  // seed 000 §4 in float32
    if (i) weight = 1.0f / (1.0f + std::exp(-(s[i] - prev + std::log(weight))));
    o = o * (1.0f - weight) + v[i] * weight;
    prev = s[i];
  }
  EXPECT_LT(o, 0.5f) << "the literal fp32 recurrence was expected to lose the last key";
  HostTensor q({1, 1}, {1.0f}), k({101, 1}, s), vt({101, 1}, v);
  AttentionParams params;
  params.variant = Variant::flashd;
  params.scale = 1.0f;
  HostAttentionResult gpu = attention(context(), q, k, vt, params);
  double denominator = 0.0;  // closed form: the last key's softmax weight
  for (float x : s) denominator += std::exp(double(x));
  EXPECT_NEAR(gpu.out.data[0], std::exp(10.0) / denominator, 1e-6);
  EXPECT_GT(gpu.out.data[0], 0.99f);
}

}  // namespace
}  // namespace flashvk::test
