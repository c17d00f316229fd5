// Every variant x {fp32, fp16} x shapes that cross tile edges, against the float64 reference.
#include <limits>

#include "flashvk/pipelines.hpp"
#include "test_util.hpp"

namespace flashvk::test {
namespace {

// Ragged sizes: none is a multiple of any tile, and Nq < Nk, Nq = Nk, Nq > Nk all appear.
const Shape kShapes[] = {
    {1, 1, 1, 1, 1, 1, 1, false, "single_key_d1"},
    {1, 2, 2, 37, 53, 4, 4, false, "ragged_d4"},
    {2, 4, 2, 65, 129, 16, 16, true, "gqa_causal_nq_lt_nk"},
    {1, 4, 1, 33, 33, 64, 64, true, "mqa_causal_square"},
    {1, 2, 2, 70, 45, 80, 80, true, "causal_nq_gt_nk"},
    {1, 2, 1, 17, 100, 128, 64, false, "dv_differs_d128"},
    {1, 1, 1, 9, 77, 256, 256, false, "d256"},
    {1, 8, 2, 1, 300, 64, 64, true, "decode_gqa"},
};

class AttentionTest : public VulkanTest, public ::testing::WithParamInterface<Case> {};

void expect_matches_reference(Variant variant, DType dtype, const Shape& s, TileLayout layout,
                              Context& ctx = context()) {
  uint32_t seed = s.nq * 131 + s.nk * 7 + s.d;
  HostTensor q = random_tensor({s.b, s.h, s.nq, s.d}, seed);
  HostTensor k = random_tensor({s.b, s.hkv, s.nk, s.d}, seed + 1);
  HostTensor v = random_tensor({s.b, s.hkv, s.nk, s.dv}, seed + 2);
  if (dtype == DType::f16) {  // the reference sees exactly what the GPU stores
    q = round_to_half(q);
    k = round_to_half(k);
    v = round_to_half(v);
  }
  AttentionParams params;
  params.variant = variant;
  params.mods.causal = s.causal;
  params.hints.tile_layout = layout;
  HostAttentionResult gpu = attention(ctx, q, k, v, params, dtype);
  reference::Result ref = reference::direct(q, k, v, params);
  double tol = tolerance(q, k, v, params) + weight_rounding(gpu, v);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << "tolerance " << tol;
  EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5);
  EXPECT_EQ(gpu.out.shape, (std::vector<int64_t>{s.b, s.h, s.nq, s.dv}));
  if (layout != TileLayout::automatic) {
    EXPECT_EQ(gpu.tile_layout, layout);
  }
}

TEST_P(AttentionTest, MatchesFloat64Reference) {
  auto [variant, dtype, s] = GetParam();
  expect_matches_reference(variant, dtype, s, TileLayout::automatic);
}

// The fused kernels have two tile layouts (shared memory, registers) and a device runs one by
// default; this runs the other, so both are checked on every device (lavapipe included). Each
// variant and shape in one storage, fp32 and fp16 taking turns over the shapes (fp16 storage in
// every layout is also AttentionTest's, ModifierTest's and StorageVariantTest's; CI time).
class OtherTileLayoutTest : public AttentionTest {};

TEST_P(OtherTileLayoutTest, MatchesFloat64Reference) {
  auto [variant, dtype, s] = GetParam();
  const DeviceInfo& info = context().device();
  bool cpu = info.type == "cpu";
  bool registers = info.subgroup_shuffle && info.texel_buffers && s.d % 4 == 0 && s.dv % 4 == 0;
  if (!cpu && !registers)
    GTEST_SKIP() << "register tiles need subgroup shuffles, RGBA texel buffers and d, dv "
                    "multiples of 4: shared tiles only here";
  expect_matches_reference(variant, dtype, s, cpu ? TileLayout::shared : TileLayout::registers);
}

// Register blocks (TileLayout::blocks, the default on GPUs without cooperative matrices), forced
// on every device, lavapipe included: with the device's limits (rows reduced with subgroup
// shuffles where it has them), and with Vulkan's guaranteed minimums, where the tiles shrink to
// 16 KiB and the rows are reduced through shared memory. d and dv not multiples of 4 are refused.
// At the minimums each variant and shape runs in one storage, fp32 and fp16 taking turns over
// the shapes (their tilings are the same; each is another pipeline for llvmpipe to compile).
class BlocksLayoutTest : public AttentionTest {};

TEST_P(BlocksLayoutTest, MatchesFloat64ReferenceAtTheDevicesAndTheMinimumLimits) {
  auto [variant, dtype, s] = GetParam();
  for (Context* ctx : {&context(), &minimum_context()}) {
    bool turn = fp16_turn(index_of(kShapes, s.name), variant) == (dtype == DType::f16);
    if (ctx == &minimum_context() && !turn) continue;
    SCOPED_TRACE(ctx == &context() ? "device limits" : "Vulkan's minimum limits");
    if (s.d % 4 != 0 || s.dv % 4 != 0) {
      AttentionParams params;
      params.variant = variant;
      params.hints.tile_layout = TileLayout::blocks;
      HostTensor q({s.b, s.h, s.nq, s.d}), k({s.b, s.hkv, s.nk, s.d}), v({s.b, s.hkv, s.nk, s.dv});
      expect_refused([&] { attention(*ctx, q, k, v, params, dtype); }, "tile_layout blocks needs");
      continue;
    }
    expect_matches_reference(variant, dtype, s, TileLayout::blocks, *ctx);
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, AttentionTest,
                         ::testing::Combine(::testing::ValuesIn(all_variants()),
                                            ::testing::Values(DType::f32, DType::f16),
                                            ::testing::ValuesIn(kShapes)),
                         case_name);

// Every shape but d = 256, whose unrolled register blocks take llvmpipe up to two minutes a
// pipeline to compile: BlocksTakeLongHeadDims runs it once.
std::vector<Shape> block_shapes() {
  std::vector<Shape> shapes;
  for (const Shape& s : kShapes)
    if (s.d < 256) shapes.push_back(s);
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(FusedVariants, BlocksLayoutTest,
                         ::testing::Combine(::testing::ValuesIn(fused_variants()),
                                            ::testing::Values(DType::f32, DType::f16),
                                            ::testing::ValuesIn(block_shapes())),
                         case_name);

TEST_F(VulkanTest, BlocksTakeLongHeadDims) {
  expect_matches_reference(Variant::flash2, DType::f32, kShapes[6], TileLayout::blocks);
}
// Each fused variant and shape in the storage whose turn it is (fp16_turn).
std::vector<Case> other_layout_cases() {
  std::vector<Case> out;
  for (Variant v : fused_variants())
    for (size_t i = 0; i < std::size(kShapes); ++i)
      out.emplace_back(v, fp16_turn(i, v) ? DType::f16 : DType::f32, kShapes[i]);
  return out;
}
INSTANTIATE_TEST_SUITE_P(FusedVariants, OtherTileLayoutTest,
                         ::testing::ValuesIn(other_layout_cases()), case_name);

// The decoding kernel (TileLayout::lanes, the default for splitkv on GPUs when a KV head has at
// most 8 query rows), forced on every device: every ragged shape whose head dims are whole
// 16-byte loads, with chunk counts from the device and forced, several keys per step, causal and
// key masks, and KV heads with more rows than one workgroup takes (several row blocks). Shapes
// it cannot run are refused by name. One test case a (dtype, shape): each lanes pipeline takes
// llvmpipe seconds to build (minutes under sanitizers with a cold shader cache), so each case
// keeps its own time limit.
class LanesLayoutTest : public VulkanTest,
                        public ::testing::WithParamInterface<std::tuple<DType, Shape>> {};

TEST_P(LanesLayoutTest, MatchesTheReferenceOrIsRefused) {
  auto [dtype, s] = GetParam();
  if (!context().device().subgroup_shuffle)  // the clusters add their partial sums by shuffles
    GTEST_SKIP() << "no subgroup shuffles: LanesLayoutRefusesWhatItCannotDo checks the refusal";
  uint32_t vec = dtype == DType::f16 ? 8 : 4;
  uint32_t seed = s.nq * 17 + s.nk + s.d;
  HostTensor q = round_to_half(random_tensor({s.b, s.h, s.nq, s.d}, seed));
  HostTensor k = round_to_half(random_tensor({s.b, s.hkv, s.nk, s.d}, seed + 1));
  HostTensor v = round_to_half(random_tensor({s.b, s.hkv, s.nk, s.dv}, seed + 2));
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.mods.causal = s.causal;
  params.hints.tile_layout = TileLayout::lanes;
  if (s.d % vec || s.dv % vec) {
    try {
      attention(context(), q, k, v, params, dtype);
      ADD_FAILURE() << s.name << ": d=" << s.d << " with lanes was not refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("multiple of " + std::to_string(vec)), std::string::npos)
          << e.what();
    }
    return;
  }
  params.mods.key_mask.assign(size_t(s.b) * s.nk, 1);
  for (uint32_t j = 3; j < s.b * s.nk; j += 11) params.mods.key_mask[j] = 0;
  reference::Result ref = reference::direct(q, k, v, params);
  // (chunks, keys a step): the engine's, and in fp32 forced chunks with one key a step and 5 a
  // step (each a pipeline of its own); on CPU drivers the forced ones run on two shapes only.
  bool cpu = context().device().type == "cpu";
  bool forced_here = dtype == DType::f32 && (!cpu || std::string(s.name) == "decode_gqa" ||
                                             std::string(s.name) == "gqa_causal_nq_lt_nk");
  for (auto [splits, keys] : {std::pair{0u, 0u}, std::pair{3u, 1u}, std::pair{0u, 5u}}) {
    if ((splits || keys) && !forced_here) continue;
    params.hints.splits = splits;
    params.hints.block_keys = keys;
    HostAttentionResult gpu = attention(context(), q, k, v, params, dtype);
    std::string what = "splits " + std::to_string(splits) + " keys " + std::to_string(keys);
    EXPECT_EQ(gpu.tile_layout, TileLayout::lanes) << what;
    // All of a KV head's rows (at most 8) in a workgroup, or fewer where they would take more
    // registers than the budget (tiling.cpp's lane_tiles): the head's rows over several
    // workgroups, which this checks against the reference too.
    EXPECT_LE(gpu.block_rows, std::min(s.h / s.hkv * s.nq, 8u)) << what;
    EXPECT_GE(gpu.block_rows, 1u) << what;
    if (splits) {
      EXPECT_EQ(gpu.splits, splits) << what;
    }
    double tol = tolerance(q, k, v, params);
    EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << what;
    EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5) << what;
  }
}

// The lanes kernel is a decode step in one dispatch: the workgroup that finishes a row block's
// chunks last merges them (and the sink) into O and LSE, and leaves its counter at zero for the
// next run. Against float64 with the modifiers models combine (sinks, a window, softcap, ALiBi and
// an additive mask with hidden keys), GQA over two workgroups' rows, in f32, f16 and q8_0 K and
// V, with the engine's chunks and 7 forced ones; run twice on one recording, the second run
// finds its counters reset. describe_pipelines lists one pipeline and no merge.
TEST_F(VulkanTest, LanesMergesItsChunksInOneDispatch) {
  Context& ctx = context();
  if (!ctx.device().subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles: no lanes";
  const uint32_t heads = 8, kv_heads = 2, nk = 200, d = 64;
  HostTensor q = random_tensor({2, heads, 1, d}, 301), k = random_tensor({2, kv_heads, nk, d}, 302),
             v = random_tensor({2, kv_heads, nk, d}, 303);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.tile_layout = TileLayout::lanes;
  params.mods.window_left = 150;
  params.mods.softcap = 12.0f;
  params.mods.alibi_max_bias = 8.0f;
  params.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f, 3.0f, 0.25f};
  params.mods.mask = HostTensor({1, 1, 1, nk});
  for (uint32_t j = 0; j < nk; ++j)
    params.mods.mask.data[j] =
        j % 7 == 3 ? -std::numeric_limits<float>::infinity() : 0.01f * float(j);
  const Storage storages[] = {Storage(DType::f32), Storage(DType::f16),
                              Storage(DType::f16, DType::q8_0, DType::q8_0)};
  for (const Storage& storage : storages) {
    if (storage.q == DType::f16 && !ctx.device().fp16_storage) continue;
    HostTensor qs = stored_values(q, storage.q), ks = stored_values(k, storage.k),
               vs = stored_values(v, storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    for (uint32_t splits : {0u, 7u}) {
      params.hints.splits = splits;
      std::string what = storage_name(storage) + ", splits " + std::to_string(splits);
      PipelineCall call{2, heads, kv_heads, 1, nk, d, d, params, storage};
      std::vector<PipelineDescription> pipes = describe_pipelines(ctx, call);
      ASSERT_EQ(pipes.size(), 1u) << what << ": " << pipes.back().shader;
      EXPECT_EQ(pipes[0].program, "splitkv");
      auto [tq, tk, tv] = upload_qkv(ctx, q, k, v, storage);
      AttentionRecording rec(ctx, tq, tk, tv, params);
      EXPECT_EQ(rec.tile_layout(), TileLayout::lanes);
      ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
      for (int run = 0; run < 2; ++run) {
        frame.submit();
        EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(qs, ks, vs, params))
            << what << ", run " << run;
        EXPECT_LE(max_lse_error(rec.lse().download().data, ref.lse), 1e-5) << what;
      }
    }
  }
}

// The last workgroup merges its rows' chunks a batch of DV chunks at a time (chunk_merge.glsl's
// merge_rows): 70 chunks of 64 keys at d = 64 fill two batches, the second part-way.
TEST_F(VulkanTest, LanesMergesMoreChunksThanOneBatch) {
  Context& ctx = context();
  if (!ctx.device().subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles: no lanes";
  const uint32_t heads = 4, kv_heads = 1, nk = 70 * 64, d = 64;
  HostTensor q = random_tensor({1, heads, 1, d}, 311), k = random_tensor({1, kv_heads, nk, d}, 312),
             v = random_tensor({1, kv_heads, nk, d}, 313);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.tile_layout = TileLayout::lanes;
  params.hints.splits = 70;
  params.want_lse = true;
  params.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  reference::Result ref = reference::direct(q, k, v, params);
  HostAttentionResult r = attention(ctx, q, k, v, params);
  EXPECT_EQ(r.tile_layout, TileLayout::lanes);
  EXPECT_EQ(r.splits, 70u);
  EXPECT_LE(max_error(r.out.data, ref.out), tolerance(q, k, v, params));
  EXPECT_LE(max_lse_error(r.lse.data, ref.lse), 1e-5);
}

std::string lanes_case_name(const ::testing::TestParamInfo<std::tuple<DType, Shape>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(Splitkv, LanesLayoutTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16),
                                            ::testing::ValuesIn(kShapes)),
                         lanes_case_name);

TEST_F(VulkanTest, LanesLayoutRefusesWhatItCannotDo) {
  HostTensor q = random_tensor({1, 1, 8, 16}, 1), k = random_tensor({1, 1, 8, 16}, 2);
  AttentionParams params;
  params.hints.tile_layout = TileLayout::lanes;
  params.variant = Variant::splitkv;
  if (!context().device().subgroup_shuffle) {  // the clusters add their partial sums by shuffles
    EXPECT_THROW(attention(context(), q, k, k, params), Error);
    return;
  }
  params.variant = Variant::flash2;  // a splitkv kernel: refused for the other variants
  EXPECT_THROW(attention(context(), q, k, k, params), Error);
  params.variant = Variant::splitkv;
  params.hints.block_keys = 9;  // at most 8 keys a step
  EXPECT_THROW(attention(context(), q, k, k, params), Error);
}

TEST_F(VulkanTest, RegisterTilesRefuseWhatTheyCannotDo) {
  HostTensor q = random_tensor({1, 1, 8, 16}, 1), k = random_tensor({1, 1, 8, 16}, 2);
  AttentionParams params;
  params.hints.tile_layout = TileLayout::registers;
  params.variant = Variant::naive;
  EXPECT_THROW(attention(context(), q, k, k, params), Error);
  params.variant = Variant::flash2;
  params.hints.block_keys = context().device().subgroup_size + 1;
  EXPECT_THROW(attention(context(), q, k, k, params), Error);
  // K and V are read as RGBA texels: a head dim that is not a multiple of 4 is refused by name,
  // and the automatic layout falls back to shared tiles for it.
  params.hints.block_keys = 0;
  HostTensor q6 = random_tensor({1, 1, 8, 6}, 3), k6 = random_tensor({1, 1, 8, 6}, 4);
  try {
    attention(context(), q6, k6, k6, params);
    ADD_FAILURE() << "d = 6 with register tiles was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 4"), std::string::npos) << e.what();
  }
  params.hints.tile_layout = TileLayout::automatic;
  HostAttentionResult gpu = attention(context(), q6, k6, k6, params);
  reference::Result ref = reference::direct(q6, k6, k6, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q6, k6, k6, params));
}

TEST_F(VulkanTest, Fp16StorageStaysWithinHalfPrecisionOfUnroundedInputs) {
  HostTensor q = random_tensor({1, 2, 40, 32}, 5), k = random_tensor({1, 2, 90, 32}, 6),
             v = random_tensor({1, 2, 90, 32}, 7);
  AttentionParams params;
  reference::Result ref = reference::direct(q, k, v, params);
  for (Variant variant : all_variants()) {
    params.variant = variant;
    HostAttentionResult gpu = attention(context(), q, k, v, params, DType::f16);
    // Rounding q, k, v to fp16 perturbs them by 2^-11 relative.
    double tol = tolerance(q, k, v, params, std::ldexp(1.0, -11));
    EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << variant_name(variant);
  }
}

TEST_F(VulkanTest, AllVariantsAgreeWithEachOther) {
  HostTensor q = random_tensor({2, 4, 50, 24}, 11), k = random_tensor({2, 2, 70, 24}, 12),
             v = random_tensor({2, 2, 70, 40}, 13);
  AttentionParams params;
  params.mods.causal = true;
  params.variant = Variant::naive;
  HostAttentionResult base = attention(context(), q, k, v, params);
  double tol = 2 * tolerance(q, k, v, params);
  for (Variant variant : all_variants()) {
    params.variant = variant;
    HostAttentionResult other = attention(context(), q, k, v, params);
    std::vector<double> as_double(base.out.data.begin(), base.out.data.end());
    EXPECT_LE(max_error(other.out.data, as_double), tol) << variant_name(variant);
  }
}

TEST_F(VulkanTest, RanksTwoAndThreeGiveTheSameRowsAsRankFour) {
  HostTensor q4 = random_tensor({1, 3, 20, 8}, 21), k4 = random_tensor({1, 3, 30, 8}, 22),
             v4 = random_tensor({1, 3, 30, 8}, 23);
  HostTensor q3({3, 20, 8}, q4.data), k3({3, 30, 8}, k4.data), v3({3, 30, 8}, v4.data);
  HostAttentionResult r4 = attention(context(), q4, k4, v4);
  HostAttentionResult r3 = attention(context(), q3, k3, v3);
  EXPECT_EQ(r3.out.shape, (std::vector<int64_t>{3, 20, 8}));
  EXPECT_EQ(r3.lse.shape, (std::vector<int64_t>{3, 20}));
  EXPECT_EQ(r3.out.data, r4.out.data);
  HostTensor q2({20, 8}, std::vector<float>(q4.data.begin(), q4.data.begin() + 160));
  HostTensor k2({30, 8}, std::vector<float>(k4.data.begin(), k4.data.begin() + 240));
  HostTensor v2({30, 8}, std::vector<float>(v4.data.begin(), v4.data.begin() + 240));
  HostAttentionResult r2 = attention(context(), q2, k2, v2);
  EXPECT_EQ(r2.out.data, std::vector<float>(r4.out.data.begin(), r4.out.data.begin() + 160));
}

TEST_F(VulkanTest, SplitkvWithForcedSplitsIncludingEmptyOnes) {
  HostTensor q = random_tensor({1, 2, 3, 16}, 31), k = random_tensor({1, 2, 100, 16}, 32),
             v = random_tensor({1, 2, 100, 16}, 33);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.mods.causal = true;
  reference::Result ref = reference::direct(q, k, v, params);
  for (uint32_t splits : {1u, 2u, 3u, 7u, 40u}) {  // 40 splits of one 32-key tile: most empty
    params.hints.splits = splits;
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params)) << splits;
  }
}

TEST_F(VulkanTest, ExplicitTileSizesGiveTheSameAnswer) {
  HostTensor q = random_tensor({1, 2, 45, 32}, 41), k = random_tensor({1, 2, 61, 32}, 42),
             v = random_tensor({1, 2, 61, 32}, 43);
  AttentionParams params;
  reference::Result ref = reference::direct(q, k, v, params);
  for (Variant variant : {Variant::flash1, Variant::flash2, Variant::flashd}) {
    for (auto [rows, keys] : {std::pair{16u, 1u}, std::pair{32u, 7u}, std::pair{128u, 64u}}) {
      params.variant = variant;
      params.hints.block_rows = rows;
      params.hints.block_keys = keys;
      HostAttentionResult gpu = attention(context(), q, k, v, params);
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params))
          << variant_name(variant) << " Br=" << rows << " Bc=" << keys;
    }
  }
}

TEST_F(VulkanTest, BadShapesAreRefusedWithTheTensorNamed) {
  HostTensor q = random_tensor({1, 3, 4, 8}, 1), k = random_tensor({1, 2, 5, 8}, 2),
             v = random_tensor({1, 2, 5, 8}, 3);
  EXPECT_THROW(
      {
        try {
          attention(context(), q, k, v);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("multiple of K/V's heads"), std::string::npos);
          throw;
        }
      },
      Error);
  HostTensor k_bad_d = random_tensor({1, 3, 5, 7}, 4);
  EXPECT_THROW(attention(context(), q, k_bad_d, k_bad_d), Error);
  HostTensor q_big = random_tensor({1, 1, 2, 257}, 5);
  EXPECT_THROW(attention(context(), q_big, q_big, q_big), Error);
  AttentionParams bad_keys;
  bad_keys.hints.block_keys = 100000;
  EXPECT_THROW(attention(context(), q, q, q, bad_keys), Error);
}

}  // namespace
}  // namespace flashvk::test

namespace flashvk::test {
namespace {

// Long rows: every loop of an invocation counts against llvmpipe's cap of 65535 iterations,
// which once dropped outputs past ~450 keys. 5000 keys at d = 64 must be exact for every variant,
// in the kernels as shipped.
TEST_F(VulkanTest, LongKeySequencesStayExact) {
  Context ctx = shipped_kernels_context();
  HostTensor q = random_tensor({1, 2, 3, 64}, 51), k = random_tensor({1, 1, 5000, 64}, 52),
             v = random_tensor({1, 1, 5000, 64}, 53);
  AttentionParams params;
  reference::Result ref = reference::direct(q, k, v, params);
  for (Variant variant : all_variants()) {
    params.variant = variant;
    HostAttentionResult gpu = attention(ctx, q, k, v, params);
    EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params))
        << variant_name(variant);
  }
  expect_no_validation_messages(ctx);
}

// On llvmpipe a per-key trace (Bc = 1) of 70000 keys would pass the loop cap: it must be refused
// with the reason, never return a wrong trace. Elsewhere it runs.
TEST_F(VulkanTest, LoopCapIsRefusedNotSilentlyWrong) {
  HostTensor q = random_tensor({1, 4}, 54), k = random_tensor({70000, 4}, 55),
             v = random_tensor({70000, 2}, 56);
  AttentionParams params;
  params.variant = Variant::flash2;
  bool llvmpipe = context().device().name.rfind("llvmpipe", 0) == 0;
  try {
    Trace t = trace(context(), q, k, v, params, 0, 0, 0);
    EXPECT_FALSE(llvmpipe) << "expected a refusal on llvmpipe";
    EXPECT_EQ(t.steps.size(), 70000u);
  } catch (const Error& e) {
    EXPECT_TRUE(llvmpipe) << e.what();
    EXPECT_NE(std::string(e.what()).find("65535"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace flashvk::test

namespace flashvk::test {
namespace {

// Register tiles give each lane 4 query rows where a KV head has enough of them, and spread a
// decoding step's few rows one per lane, in workgroups no larger than they need. Asked for by
// name, so that every device with the subgroup operations runs it, not only CPU drivers.
TEST_F(VulkanTest, RegisterTilesSpreadFewRowsOverTheLanes) {
  const DeviceInfo& dev = context().device();
  if (!dev.subgroup_shuffle || !dev.texel_buffers || dev.subgroup_size < 4 ||
      64 % dev.subgroup_size != 0)
    GTEST_SKIP() << "register tiles need subgroup shuffles, RGBA texel buffers and a subgroup "
                    "size of 4 to 64; "
                 << dev.name << " lacks them";
  struct RowsCase {
    int64_t heads, nq;
    uint32_t rows_per_group;
  };
  for (RowsCase shape : {RowsCase{8, 1, dev.subgroup_size}, RowsCase{2, 300, 64 * 4}}) {
    HostTensor q = random_tensor({1, shape.heads, shape.nq, 16}, 64),
               k = random_tensor({1, 2, 100, 16}, 65), v = random_tensor({1, 2, 100, 16}, 66);
    AttentionParams params;
    params.variant = Variant::splitkv;
    params.hints.tile_layout = TileLayout::registers;
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    EXPECT_EQ(gpu.tile_layout, TileLayout::registers);
    EXPECT_EQ(gpu.block_rows, shape.rows_per_group) << "Nq=" << shape.nq;
    EXPECT_EQ(gpu.block_keys, dev.subgroup_size);
    reference::Result ref = reference::direct(q, k, v, params);
    EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params)) << "Nq=" << shape.nq;
  }
}

// Vulkan guarantees only 16 KiB of shared memory; the kernels must fit it at every head dim.
// Shared tiles within the 16 KiB Vulkan guarantees: at d = 256 a tile holds 7 keys. (Each
// pipeline here takes llvmpipe 5-30 s to compile, several times that under AddressSanitizer, so
// one fused variant stands for the four that share the tile code.)
TEST_F(VulkanTest, FitsVulkansGuaranteedSharedMemory) {
  for (int64_t d : {64, 256}) {
    HostTensor q = random_tensor({1, 2, 20, d}, 61), k = random_tensor({1, 2, 70, d}, 62),
               v = random_tensor({1, 2, 70, d}, 63);
    AttentionParams params;
    params.hints.max_shared_memory = 16384;
    params.hints.tile_layout = TileLayout::shared;  // the layout that stages tiles in shared memory
    params.mods.causal = true;
    reference::Result ref = reference::direct(q, k, v, params);
    for (Variant variant : {Variant::naive, Variant::flash2, Variant::splitkv}) {
      params.variant = variant;
      HostAttentionResult gpu = attention(context(), q, k, v, params);
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params))
          << variant_name(variant) << " d=" << d;
      // The tiling that ran is reported: a K and a V tile of fp32 rows within the 16 KiB.
      if (variant == Variant::naive) {
        EXPECT_EQ(gpu.block_keys, 0u);
        continue;
      }
      EXPECT_EQ(gpu.block_rows, 64u) << variant_name(variant);
      EXPECT_GE(gpu.block_keys, 1u);
      EXPECT_LE(gpu.block_keys * 4 * 2 * uint64_t(d), 16384u) << variant_name(variant);
      EXPECT_EQ(gpu.block_keys * 4 * 2 * uint64_t(d) > 8192, true)  // not needlessly small
          << gpu.block_keys << " keys at d=" << d;
      EXPECT_GE(gpu.splits, 1u);
    }
  }
}

}  // namespace
}  // namespace flashvk::test
