// fp16 arithmetic (ExecutionHints::fp16_arithmetic): the register blocks multiply in fp16 and
// sum at most kRun products in fp16 before adding them to fp32. Checked against the float64
// reference two ways:
// - on dyadic inputs (q, k, v multiples of 1/2 in [-1, 1]), where every fp16 product and every
//   run of kRun of them is exact, so the scores are; only P's rounding to fp16 and the P V runs
//   round, which bounds the error by (kRun + 1) u16 max|v| (u16 = 2^-11). A missing run of
//   products or keys shows as an error several times that bound (about 6x at Nk = 300);
// - on random inputs, within the first-order bound of docs/algorithms.md ("fp16 arithmetic").
// Every fused variant, fp32 and fp16 storage, a quantised K, at the device's limits and at
// Vulkan's minimums (rows reduced through shared memory, fp32 and fp16 storage taking turns);
// and the refusals.
#include <algorithm>
#include <tuple>

#include "test_util.hpp"

namespace flashvk::test {
namespace {

constexpr double kU16 = 1.0 / 2048.0;  // fp16's unit roundoff
constexpr int kRun = 8;                // products summed in fp16 (shaders/tile.glsl RUN)

const Shape kShapes[] = {
    {1, 2, 2, 37, 53, 4, 4, false, "ragged_d4"},
    {2, 4, 2, 65, 129, 16, 16, true, "gqa_causal"},
    {1, 2, 1, 17, 100, 128, 64, false, "dv_differs_d128"},
    {1, 8, 2, 1, 300, 64, 64, true, "decode_gqa"},
};

HostTensor dyadic_tensor(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-2, 2);
  for (float& x : t.data) x = 0.5f * float(dist(rng));
  return t;
}

// scale * max over query rows i and keys j of sum_c |q_ic k_jc|: the largest sum a score's
// products can round against.
double largest_product_sum(const HostTensor& q, const HostTensor& k, const AttentionParams& p) {
  Dims d = check_shapes(q.shape, k.shape, k.shape);
  double scale = p.scale ? std::abs(*p.scale) : 1.0 / std::sqrt(double(d.d));
  uint32_t group = d.heads / d.kv_heads;
  double most = 0.0;
  for (uint32_t b = 0; b < d.batch; ++b)
    for (uint32_t h = 0; h < d.heads; ++h)
      for (uint32_t i = 0; i < d.nq; ++i) {
        const float* qi = &q.data[((uint64_t(b) * d.heads + h) * d.nq + i) * d.d];
        for (uint32_t j = 0; j < d.nk; ++j) {
          const float* kj = &k.data[((uint64_t(b) * d.kv_heads + h / group) * d.nk + j) * d.d];
          double sum = 0.0;
          for (uint32_t c = 0; c < d.d; ++c) sum += std::abs(double(qi[c]) * kj[c]);
          most = std::max(most, scale * sum);
        }
      }
  return most;
}

// The first-order bound on fp16 arithmetic's error (docs/algorithms.md): Q and K rounded to fp16
// (2 u16 of each product) and runs of kRun products (kRun u16 of their absolute sum) move a
// score by at most delta, which moves the softmax weights by a factor within e^(+-2 delta);
// P's rounding (u16), V's (u16) and the P V runs (kRun u16) add (kRun + 2) u16 max|v|.
double fp16_bound(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                  const AttentionParams& params) {
  double delta = (kRun + 2) * kU16 * largest_product_sum(q, k, params);
  double vmax = max_abs(v);
  return tolerance(q, k, v, params) + vmax * (std::expm1(2.0 * delta) + (kRun + 2) * kU16);
}

class Fp16ArithmeticTest : public VulkanTest, public ::testing::WithParamInterface<Case> {};

// With the register blocks forced: `automatic` takes the matrix units where a device has them.
HostAttentionResult run(Context& ctx, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                        AttentionParams params, Storage storage) {
  params.hints.fp16_arithmetic = true;
  params.hints.tile_layout = TileLayout::blocks;
  HostAttentionResult gpu = attention(ctx, q, k, v, params, storage);
  EXPECT_EQ(gpu.tile_layout, TileLayout::blocks);
  return gpu;
}

#define SKIP_WITHOUT_FP16_ARITHMETIC()     \
  if (!context().device().fp16_arithmetic) \
  GTEST_SKIP() << context().device().name << " has no shaderFloat16"

TEST_P(Fp16ArithmeticTest, ExactScoresOnDyadicInputs) {
  SKIP_WITHOUT_FP16_ARITHMETIC();
  auto [variant, dtype, s] = GetParam();
  uint32_t seed = s.nq * 131 + s.nk * 7 + s.d;
  HostTensor q = dyadic_tensor({s.b, s.h, s.nq, s.d}, seed);
  HostTensor k = dyadic_tensor({s.b, s.hkv, s.nk, s.d}, seed + 1);
  HostTensor v = dyadic_tensor({s.b, s.hkv, s.nk, s.dv}, seed + 2);
  AttentionParams params;
  params.variant = variant;
  params.mods.causal = s.causal;
  reference::Result ref = reference::direct(q, k, v, params);
  double tol = tolerance(q, k, v, params) + (kRun + 1) * kU16 * max_abs(v);
  // At Vulkan's minimums each variant and shape in one storage, fp32 and fp16 taking turns over
  // the shapes (each is another pipeline for llvmpipe to compile).
  bool minimums_turn = fp16_turn(index_of(kShapes, s.name), variant) == (dtype == DType::f16);
  for (Context* ctx : {&context(), &minimum_context()}) {
    if (ctx == &minimum_context() && !minimums_turn) continue;
    SCOPED_TRACE(ctx == &context() ? "device limits" : "Vulkan's minimum limits");
    HostAttentionResult gpu = run(*ctx, q, k, v, params, Storage(dtype));
    double error = max_error(gpu.out.data, ref.out);
    EXPECT_LE(error, tol) << "tolerance " << tol;
    EXPECT_GT(error, 1e-6) << "P was not rounded to fp16: the kernel ran in fp32";
    EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5);
  }
}

TEST_P(Fp16ArithmeticTest, RandomInputsWithinTheFirstOrderBound) {
  SKIP_WITHOUT_FP16_ARITHMETIC();
  auto [variant, dtype, s] = GetParam();
  uint32_t seed = s.nq * 17 + s.nk + s.d;
  HostTensor q = round_to_half(random_tensor({s.b, s.h, s.nq, s.d}, seed));
  HostTensor k = round_to_half(random_tensor({s.b, s.hkv, s.nk, s.d}, seed + 1));
  HostTensor v = round_to_half(random_tensor({s.b, s.hkv, s.nk, s.dv}, seed + 2));
  AttentionParams params;
  params.variant = variant;
  params.mods.causal = s.causal;
  reference::Result ref = reference::direct(q, k, v, params);
  HostAttentionResult gpu = run(context(), q, k, v, params, Storage(dtype));
  double tol = fp16_bound(q, k, v, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << "tolerance " << tol;
}

INSTANTIATE_TEST_SUITE_P(FusedVariants, Fp16ArithmeticTest,
                         ::testing::Combine(::testing::ValuesIn(fused_variants()),
                                            ::testing::Values(DType::f32, DType::f16),
                                            ::testing::ValuesIn(kShapes)),
                         case_name);

// K in q8_0 and V in fp16 under fp32 Q, with a sliding window and sinks: the storage formats
// decode into the same fp16 tiles, and the modifiers act on the fp32 scores.
TEST_F(VulkanTest, Fp16ArithmeticWithQuantisedKeysAndModifiers) {
  SKIP_WITHOUT_FP16_ARITHMETIC();
  Storage storage{DType::f32, DType::q8_0, DType::f16};
  HostTensor q = random_tensor({1, 8, 40, 64}, 5);
  HostTensor k = stored_values(random_tensor({1, 2, 200, 64}, 6), storage.k);
  HostTensor v = stored_values(random_tensor({1, 2, 200, 64}, 7), storage.v);
  AttentionParams params;
  params.variant = Variant::flash2;
  params.mods.window_left = 63;
  params.mods.window_right = 0;
  params.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -2.0f, 0.25f, 3.0f};
  reference::Result ref = reference::direct(q, k, v, params);
  HostAttentionResult gpu = run(context(), q, k, v, params, storage);
  double tol = fp16_bound(q, k, v, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << "tolerance " << tol;
}

// Past 16384 keys, where weights normalised by l (flash1, online's second pass, flashd: 1/j for
// equal scores) fall below fp16's normal range: with Q = 0 every score is 0 and O is the mean
// of V's rows, in closed form. The kernels scale each row's P per tile into [1, 2) first.
TEST_F(VulkanTest, Fp16ArithmeticKeepsTheWeightsOfLongContexts) {
  SKIP_WITHOUT_FP16_ARITHMETIC();
  Context ctx = shipped_kernels_context();  // 20000 keys: llvmpipe's loop cap
  const int64_t nk = 20000;
  HostTensor q({1, 1, 4, 16});  // zeros
  HostTensor k = dyadic_tensor({1, 1, nk, 16}, 3), v = dyadic_tensor({1, 1, nk, 16}, 4);
  std::vector<double> mean(16, 0.0);
  for (int64_t j = 0; j < nk; ++j)
    for (int c = 0; c < 16; ++c) mean[c] += double(v.data[j * 16 + c]) / double(nk);
  for (Variant variant :
       {Variant::online, Variant::flash1, Variant::flash2, Variant::flashd, Variant::splitkv}) {
    SCOPED_TRACE(variant_name(variant));
    AttentionParams params;
    params.variant = variant;
    HostAttentionResult gpu = run(ctx, q, k, v, params, Storage(DType::f16));
    double error = 0.0;
    for (size_t i = 0; i < gpu.out.data.size(); ++i)
      error = std::max(error, std::abs(double(gpu.out.data[i]) - mean[i % 16]));
    EXPECT_LE(error, tolerance(q, k, v, params) + (kRun + 1) * kU16 * max_abs(v));
  }
  expect_no_validation_messages(ctx);
}

TEST_F(VulkanTest, Fp16ArithmeticIsRefusedWhereItDoesNotRun) {
  HostTensor q = random_tensor({1, 1, 8, 16}, 1), k = random_tensor({1, 1, 8, 16}, 2);
  AttentionParams params;
  params.hints.fp16_arithmetic = true;
  params.variant = Variant::naive;
  expect_refused([&] { attention(context(), q, k, k, params); }, "not naive");
  params.variant = Variant::flash2;
  for (TileLayout layout : {TileLayout::shared, TileLayout::registers, TileLayout::lanes}) {
    params.hints.tile_layout = layout;
    expect_refused([&] { attention(context(), q, k, k, params); },
                   "fp16_arithmetic runs in tile_layout blocks or cooperative_matrix");
  }
  params.hints.tile_layout = TileLayout::automatic;
  expect_refused([&] { trace(context(), q, k, k, params, 0, 0, 3); }, "traces");
  // An adopted device whose application did not enable shaderFloat16.
  ExternalDevice handles = context().handles();
  handles.fp16_arithmetic_enabled = false;
  handles.matrix_api = MatrixApi::none;
  Context adopted = Context::adopt(handles);
  expect_refused([&] { attention(adopted, q, k, k, params); },
                 context().device().fp16_arithmetic ? "ExternalDevice::fp16_arithmetic_enabled"
                                                    : "does not support");
  if (!context().device().fp16_arithmetic) GTEST_SKIP() << "the device has no shaderFloat16";
  handles.fp16_arithmetic_enabled = true;
  Context enabled = Context::adopt(handles);
  HostAttentionResult gpu = attention(enabled, q, k, k, params);
  EXPECT_EQ(gpu.tile_layout, TileLayout::blocks);
  reference::Result ref = reference::direct(q, k, k, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), fp16_bound(q, k, k, params));
}

}  // namespace
}  // namespace flashvk::test
