// The cooperative-matrix kernels (shaders/flash_cm.comp, through coopmat.glsl) against the
// float64 reference, asked for by name: on the device's matrix units where it has them, else
// emulated (a context's default, MatrixApi::emulated, where there are none), so that every
// machine, lavapipe included, runs their tiles, recurrences, modifiers and user-written
// functions. Shapes are small (d = 32): an emulated kernel takes llvmpipe seconds to build.
#include <cmath>
#include <initializer_list>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifdef FLASHVK_TEST_FLEX
#include "flashvk/flex.hpp"
#endif
#include "flashvk/pipelines.hpp"
#include "test_util.hpp"

namespace flashvk::test {
namespace {

class MatrixTest : public VulkanTest {};

const Variant kMatrixVariants[] = {Variant::flash1, Variant::flash2, Variant::flashd,
                                   Variant::splitkv};

// Runs `params` on fp16 copies of q, k and v in the cooperative-matrix layout and checks O and
// LSE against the reference on the stored values; returns the run.
HostAttentionResult expect_matches(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                   AttentionParams params, const std::string& what,
                                   Context& ctx = context()) {
  HostTensor qh = round_to_half(q), kh = round_to_half(k), vh = round_to_half(v);
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  reference::Result ref = reference::direct(qh, kh, vh, params);
  HostAttentionResult gpu = attention(ctx, qh, kh, vh, params, DType::f16);
  EXPECT_EQ(gpu.tile_layout, TileLayout::cooperative_matrix) << what;
  EXPECT_LE(max_error(gpu.out.data, ref.out),
            tolerance(qh, kh, vh, params) + weight_rounding(gpu, vh))
      << what;
  EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 2e-5) << what;
  return gpu;
}

// Inputs (seeds seed, seed + 1, seed + 2) and what to run on them.
struct Case {
  HostTensor q, k, v;
  AttentionParams params;
};

// GQA, the causal mask, a key mask, ragged lengths (70 queries, 150 keys: partial tiles and
// workgroups) and dv != d.
Case ragged_case(uint32_t seed) {
  Case c{random_tensor({2, 4, 70, 32}, seed), random_tensor({2, 2, 150, 32}, seed + 1),
         random_tensor({2, 2, 150, 48}, seed + 2), {}};
  c.params.want_lse = true;
  c.params.mods.causal = true;
  c.params.mods.key_mask.assign(2 * 150, 1);
  for (int j = 0; j < 150; j += 7) c.params.mods.key_mask[size_t(j)] = 0;
  return c;
}

// The modifiers current models use, together: a sliding window, ALiBi, softcapping and
// attention sinks (GQA, 40 queries, 130 keys).
Case modifiers_case(uint32_t seed) {
  Case c{random_tensor({1, 4, 40, 32}, seed), random_tensor({1, 2, 130, 32}, seed + 1),
         random_tensor({1, 2, 130, 32}, seed + 2), {}};
  c.params.want_lse = true;
  c.params.mods.causal = true;
  c.params.mods.window_left = 70;
  c.params.mods.softcap = 20.0f;
  c.params.mods.alibi_max_bias = 8.0f;
  c.params.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  return c;
}

// Runs the modifiers case in each of `variants` (splitkv in 3 chunks).
void expect_modifiers_match(const Case& c, std::initializer_list<Variant> variants,
                            Context& ctx = context()) {
  AttentionParams params = c.params;
  for (Variant variant : variants) {
    params.variant = variant;
    params.hints.splits = variant == Variant::splitkv ? 3 : 0;
    expect_matches(c.q, c.k, c.v, params, std::string("modifiers, ") + variant_name(variant), ctx);
  }
}

#ifdef FLASHVK_TEST_FLEX
// A user-written score_mod (a relative-position bias and a head's offset) and its float64 twin.
AttentionParams with_score_mod(Variant variant) {
  AttentionParams params;
  params.want_lse = true;
  params.variant = variant;
  params.mods.score_mod = R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score - 0.03 * float(abs(q_idx - kv_idx)) + 0.5 * float(h);
})";
  params.mods.score_twin = [](double s, int, int h, int i, int j) {
    return s - double(0.03f) * double(std::abs(i - j)) + 0.5 * double(h);
  };
  return params;
}
#endif

// Every recurrence the matrix kernel has, with GQA, the causal mask, a key mask, ragged lengths
// (70 queries, 150 keys: partial tiles and workgroups) and dv != d; what it does not run is
// refused by name, and a context without matrix units refuses the layout.
TEST_F(MatrixTest, EachRecurrenceMatchesTheReference) {
  Case ragged = ragged_case(21);
  const HostTensor &q = ragged.q, &k = ragged.k, &v = ragged.v;
  AttentionParams& params = ragged.params;
  for (Variant variant : kMatrixVariants) {
    params.variant = variant;
    expect_matches(q, k, v, params, variant_name(variant));
  }
  HostTensor qh = round_to_half(q), kh = round_to_half(k), vh = round_to_half(v);
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  params.variant = Variant::online;  // not a matrix recurrence
  expect_refused([&] { attention(context(), qh, kh, vh, params, DType::f16); },
                 "tile_layout cooperative_matrix runs flash1, flash2, flashd and splitkv");
  params.variant = Variant::flash2;  // fp32 storage
  expect_refused([&] { attention(context(), q, k, v, params, DType::f32); }, "on fp16");
  ContextOptions without = test_options();
  without.matrix_api = MatrixApi::none;
  Context none = Context::create(without);
  expect_refused([&] { attention(none, qh, kh, vh, params, DType::f16); },
                 "tile_layout cooperative_matrix needs matrix units");
  EXPECT_TRUE(none.take_validation_messages().empty());
}

// The modifiers current models use, together, in FLASH-D's recurrence and in splitkv's chunks:
// a sliding window, ALiBi, softcapping and attention sinks.
TEST_F(MatrixTest, ModifiersMatchTheReference) {
  expect_modifiers_match(modifiers_case(31), {Variant::flashd, Variant::splitkv});
}

// An additive mask [1, heads, nq, nk]: values in [-2, 2] (from `seed`), -inf on a stripe and on
// a few rows' first keys.
HostTensor striped_mask(int64_t heads, int64_t nq, int64_t nk, uint32_t seed) {
  HostTensor mask({1, heads, nq, nk});
  HostTensor noise = random_tensor({1, heads, nq, nk}, seed);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < nq; ++i)
      for (int64_t j = 0; j < nk; ++j) {
        size_t at = size_t((h * nq + i) * nk + j);
        bool hidden = (j + 3 * h) % 11 == 0 || (i % 9 == 0 && j < 40);
        mask.data[at] = hidden ? -INFINITY : 2.0f * noise.data[at];
      }
  return mask;
}

// An additive mask, per head (GQA's packed rows each read their own head's), whose entries the
// kernel fetches 4 keys a load before each tile's scores (flash_cm.comp's fetch_mask): 150 keys,
// so rows of 152 words whose last tile reads past them (clamped to the row's last 4); finite
// values in [-2, 2], -inf on a stripe and on a few rows' first keys; every recurrence, 16-key
// tiles (8 keys a softmax lane) and the engine's, unsplit (d = 32, dv = 48) and split (d = 160,
// dv = 96). An entry of another key, row or head would move the output past the tolerance.
TEST_F(MatrixTest, AdditiveMaskEntriesFetchedWithEachTileMatchTheReference) {
  const int64_t heads = 4, nq = 70, nk = 150;
  AttentionParams params;
  params.want_lse = true;
  params.mods.mask = striped_mask(heads, nq, nk, 41);
  for (int64_t d : {32, 160}) {
    HostTensor q = random_tensor({1, heads, nq, d}, 42), k = random_tensor({1, 2, nk, d}, 43),
               v = random_tensor({1, 2, nk, d == 32 ? 48 : 96}, 44);
    for (Variant variant : kMatrixVariants)
      for (uint32_t keys : {16u, 0u}) {
        params.variant = variant;
        params.hints.block_keys = keys;
        params.hints.splits = variant == Variant::splitkv ? 3 : 0;
        expect_matches(q, k, v, params,
                       std::string("mask, ") + variant_name(variant) + ", d = " +
                           std::to_string(d) + ", block_keys " + std::to_string(keys));
      }
  }
}

// FlashAttention-2's matrix kernel scales O only in tiles where some row of a block of 16 moves
// its max (flash_cm.comp's vote, coopmat.glsl's cm_any). Key 0 gives every row its largest
// score, so that most tiles move no row's max and skip the scaling; key 70 then beats it for one
// row of each block, the 14th (packed rows: GQA's heads one after the other), and key 200 for its
// 3rd, so that one row, in either half of the block's lanes, decides its block's vote. (Tiles of
// 64 keys or 32: each of the three in a tile of its own, tiles between and after them with
// none.) In flash2 (every row walks every tile) and splitkv (causal, three chunks: the second
// starts without key 0 and meets key 200 in a later tile).
TEST_F(MatrixTest, FlashAttention2RescalesOnlyWhereARowsMaxMoves) {
  HostTensor q = random_tensor({1, 2, 40, 32}, 71), k = random_tensor({1, 1, 300, 32}, 72),
             v = random_tensor({1, 1, 300, 48}, 73);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 40; ++i) {
      int64_t in_block = (h * 40 + i) % 16;
      q.at({0, h, i, 0}) = 1.0f + 0.2f * std::abs(q.at({0, h, i, 0}));
      q.at({0, h, i, 1}) = in_block == 13 ? 2.0f : 0.0f;
      q.at({0, h, i, 2}) = in_block == 2 ? 2.0f : 0.0f;
    }
  auto only = [&](int64_t j, int64_t dim, float x) {
    for (int64_t c = 0; c < 32; ++c) k.at({0, 0, j, c}) = c == dim ? x : 0.0f;
  };
  only(0, 0, 30.0f);
  only(70, 1, 50.0f);
  only(200, 2, 50.0f);
  AttentionParams params;
  params.want_lse = true;
  params.hints.max_shared_memory = 32 * 1024;  // the same tiles on every device
  params.variant = Variant::flash2;
  expect_matches(q, k, v, params, "flash2");
  params.variant = Variant::splitkv;
  params.hints.splits = 3;
  params.mods.causal = true;
  expect_matches(q, k, v, params, "splitkv, causal");
}

// Past d = 128 a block of 16 rows is two groups', each with half of the head dims of Q, K and
// V: their scores are added before the softmax, which each group runs for half of the rows, and
// each keeps half of the output. Every recurrence at d = 160 and dv = 96 (GQA, causal, partial
// tiles and row blocks; 32 keys a tile in 32 KiB, 8 a softmax lane), then d = 256 with dv = 192
// in 16-key tiles (4 keys a lane; as on RDNA), and unsplit d = 128 over dv = 32, where the staged
// queries take more space than the K and V^T tiles. (Small shapes: llvmpipe builds these
// emulated kernels slowly.)
TEST_F(MatrixTest, LongHeadDimsSplitEachRowBlockOverTwoGroups) {
  HostTensor q = random_tensor({1, 4, 24, 160}, 61), k = random_tensor({1, 2, 70, 160}, 62),
             v = random_tensor({1, 2, 70, 96}, 63);
  AttentionParams params;
  params.want_lse = true;
  params.mods.causal = true;
  params.hints.max_shared_memory = 32 * 1024;  // the same tiles on every device
  for (Variant variant : kMatrixVariants) {
    params.variant = variant;
    HostAttentionResult run = expect_matches(q, k, v, params, variant_name(variant));
    EXPECT_EQ(run.block_rows, 32u);  // two row blocks of 16
    EXPECT_EQ(run.block_keys, 32u);
  }
  HostTensor q256 = random_tensor({1, 2, 36, 256}, 64), k256 = random_tensor({1, 1, 50, 256}, 65),
             v192 = random_tensor({1, 1, 50, 192}, 66);
  params.variant = Variant::flash2;
  params.mods.causal = false;
  HostAttentionResult run = expect_matches(q256, k256, v192, params, "d = 256, dv = 192");
  EXPECT_EQ(run.block_keys, 16u);
  // Unsplit, the staged queries outgrow the K/V tiles where d is well over dv: 64 rows of
  // d = 128 (8704 fp16 with padding) against 32 keys of 128 and V^T's 32 rows of 32 keys (5632).
  HostTensor q128 = random_tensor({1, 2, 70, 128}, 67), k128 = random_tensor({1, 2, 50, 128}, 68),
             v32 = random_tensor({1, 2, 50, 32}, 69);
  run = expect_matches(q128, k128, v32, params, "d = 128, dv = 32");
  EXPECT_EQ(run.block_rows, 64u);
  EXPECT_EQ(run.block_keys, 32u);
}

// block_keys sizes the tiles where the call asks for the matrix layout (what a tuning sweep
// varies; elsewhere the engine chooses): the ragged case (the engine's choice there is 64 keys)
// in FlashAttention-2 at 16 keys a tile and FLASH-D at 32, then in the kernel that keeps the
// softmax in matrices at 16; 64 keys where only V^T in K's place fits them; another size is
// refused by name.
TEST_F(MatrixTest, TilesOfTheKeysACallAsksForMatchTheReference) {
  Case ragged = ragged_case(101);
  AttentionParams& params = ragged.params;
  params.variant = Variant::flash2;
  EXPECT_EQ(expect_matches(ragged.q, ragged.k, ragged.v, params, "engine's keys").block_keys, 64u);
  for (auto [variant, keys] : {std::pair{Variant::flash2, 16u}, std::pair{Variant::flashd, 32u}}) {
    params.variant = variant;
    params.hints.block_keys = keys;
    std::string what = std::string(variant_name(variant)) + ", " + std::to_string(keys) + " keys";
    EXPECT_EQ(expect_matches(ragged.q, ragged.k, ragged.v, params, what).block_keys, keys);
  }
  params.variant = Variant::flash2;
  params.hints.block_keys = 16;
  EXPECT_EQ(expect_matches(ragged.q, ragged.k, ragged.v, params, "softmax in matrices, 16 keys",
                           softmax_matrices_context())
                .block_keys,
            16u);
  // 64 keys at d = 64 in 32 KiB, which K and V^T beside each other would pass (35-36 KiB): V^T
  // in K's place (V_IN_K), causal and GQA; the nv2 kernel's in 24 KiB (beside each other 27-32
  // KiB). (FlashAttention-2 alone: each build takes llvmpipe half a minute.)
  HostTensor q64 = random_tensor({1, 4, 70, 64}, 104), k64 = random_tensor({1, 2, 150, 64}, 105),
             v64 = random_tensor({1, 2, 150, 64}, 106);
  AttentionParams over;
  over.want_lse = true;
  over.mods.causal = true;
  over.hints.block_keys = 64;
  for (auto [ctx, shared] : {std::pair{&context(), 32u}, std::pair{&softmax_matrices_context(), 24u}}) {
    over.hints.max_shared_memory = shared * 1024;
    std::string what = "V in K's place, " + std::to_string(shared) + " KiB";
    EXPECT_EQ(expect_matches(q64, k64, v64, over, what, *ctx).block_keys, 64u) << what;
    AttentionParams described = over;
    described.hints.tile_layout = TileLayout::cooperative_matrix;
    std::vector<PipelineDescription> pipes = describe_pipelines(
        *ctx, PipelineCall{1, 4, 2, 70, 150, 64, 64, described, DType::f16});
    ASSERT_FALSE(pipes.empty());
    EXPECT_EQ(pipes[0].spec_constants.at(18).second, 1u) << what << ": V_IN_K";
  }
  params.hints.block_keys = 24;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  HostTensor qh = round_to_half(ragged.q), kh = round_to_half(ragged.k),
             vh = round_to_half(ragged.v);
  expect_refused([&] { attention(context(), qh, kh, vh, params, DType::f16); },
                 "takes block_keys 16, 32 or 64");
}

// block_rows 32, where the call asks for the matrix layout, splits each block of rows over two
// groups, half the head dims each, at d <= 128 too (as d = 256 always is: a lane holds half the
// queries and output, a workgroup 32 rows): the modifiers' case in FlashAttention-2 and FLASH-D
// (each row's softmax over the two groups' parts of its scores). 64 where the head dims need the
// split, and other counts, are refused by name.
TEST_F(MatrixTest, SplitRowBlocksACallAsksForMatchTheReference) {
  Case c = modifiers_case(111);
  c.params.hints.block_rows = 32;
  for (Variant variant : {Variant::flash2, Variant::flashd}) {
    c.params.variant = variant;
    HostAttentionResult run = expect_matches(c.q, c.k, c.v, c.params, variant_name(variant));
    EXPECT_EQ(run.block_rows, 32u) << variant_name(variant);
  }
  AttentionParams params;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  HostTensor q = round_to_half(random_tensor({1, 1, 4, 256}, 112));
  for (auto [d, rows] : {std::pair{256, 64u}, std::pair{32, 48u}}) {
    HostTensor qd = d == 256 ? q : round_to_half(c.q);
    params.hints.block_rows = rows;
    expect_refused([&] { attention(context(), qd, qd, qd, params, DType::f16); },
                   "or 32 (each block of rows split over two groups");
  }
}

// block_rows 128, where the call asks for the matrix layout: twice the groups a workgroup (256
// invocations on 16 x 16), each K/V tile staged once for 128 rows. The ragged case (GQA: 140
// packed rows a KV head, so a partial workgroup) in FlashAttention-2 at 16 keys a tile, whose
// queries pass through the K/V space 16 head dims at a time (flash_cm.comp's Q_DIMS: 2 passes),
// the modifiers' case in FLASH-D, 4 passes and none; the pipeline's workgroup says so. Past
// d = 128 it is refused.
TEST_F(MatrixTest, WorkgroupsOfTwiceTheRowsACallAsksForMatchTheReference) {
  Case ragged = ragged_case(121);
  ragged.params.variant = Variant::flash2;
  ragged.params.hints.block_rows = 128;
  ragged.params.hints.block_keys = 16;
  HostAttentionResult run =
      expect_matches(ragged.q, ragged.k, ragged.v, ragged.params, "flash2, 16 keys");
  EXPECT_EQ(run.block_rows, 128u);
  EXPECT_EQ(run.block_keys, 16u);
  AttentionParams described = ragged.params;
  described.hints.tile_layout = TileLayout::cooperative_matrix;
  std::vector<PipelineDescription> pipes =
      describe_pipelines(context(), PipelineCall{2, 4, 2, 70, 150, 32, 48, described, DType::f16});
  ASSERT_FALSE(pipes.empty());
  const uint32_t subgroup = pipes[0].spec_constants.at(13).second,
                 m = pipes[0].spec_constants.at(15).second;  // SUBGROUP, CM_M
  EXPECT_EQ(pipes[0].spec_constants.at(0).second, 128u / m * subgroup) << "128 / CM_M groups";
  Case c = modifiers_case(122);
  c.params.variant = Variant::flashd;
  c.params.hints.block_rows = 128;
  EXPECT_EQ(expect_matches(c.q, c.k, c.v, c.params, "flashd, modifiers").block_rows, 128u);
  // d = 64 at 32 keys: 16 head dims a pass (4 passes); d = 48, whose halves are no multiple of
  // 16: whole, the K/V space grown to hold them
  for (auto [d, keys] : {std::pair{64u, 32u}, std::pair{48u, 16u}}) {
    AttentionParams p;
    p.want_lse = true;
    p.mods.causal = true;
    p.hints.block_rows = 128;
    p.hints.block_keys = keys;
    std::string what = "d=" + std::to_string(d) + ", " + std::to_string(keys) + " keys";
    HostAttentionResult r = expect_matches(random_tensor({1, 4, 40, d}, 124),
                                           random_tensor({1, 2, 90, d}, 125),
                                           random_tensor({1, 2, 90, d}, 126), p, what);
    EXPECT_EQ(r.block_rows, 128u) << what;
  }
  AttentionParams params;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  params.hints.block_rows = 128;
  HostTensor q = round_to_half(random_tensor({1, 1, 4, 256}, 123));
  expect_refused([&] { attention(context(), q, q, q, params, DType::f16); },
                 "invocations a workgroup; this device takes");
}

// group_rows 32, where the call asks for the matrix layout: each group multiplies two row
// matrices (32 rows, one softmax lane a row), each K and V matrix read once for both; 128 rows
// a workgroup (4 groups), or 64 where block_rows asks. The ragged case (GQA, causal, a key mask,
// partial tiles and workgroups, dv != d) in FlashAttention-2 with an additive mask too (a lane's
// 16 or 32 entries) and in splitkv's chunks; the modifiers' case in FlashAttention (O blended by
// keep and coef) and FLASH-D at 64 rows; past d = 64 (d = 96), the queries read from shared
// memory at each tile (Q_SHARED). Split blocks (d = 256), a count other than 0, 16 and 32,
// another layout and the softmax in matrices (nv2's) are refused by name.
TEST_F(MatrixTest, TwoRowMatricesAGroupACallAsksForMatchTheReference) {
  Case ragged = ragged_case(131);
  ragged.params.hints.group_rows = 32;
  ragged.params.variant = Variant::flash2;
  ragged.params.mods.mask = striped_mask(4, 70, 150, 132);
  HostAttentionResult run =
      expect_matches(ragged.q, ragged.k, ragged.v, ragged.params, "flash2, mask");
  EXPECT_EQ(run.group_rows, 32u);
  EXPECT_EQ(run.block_rows, 128u);
  ragged.params.mods.mask = HostTensor();
  ragged.params.variant = Variant::splitkv;
  ragged.params.hints.splits = 3;
  EXPECT_EQ(expect_matches(ragged.q, ragged.k, ragged.v, ragged.params, "splitkv").group_rows, 32u);
  Case c = modifiers_case(133);
  c.params.hints.group_rows = 32;
  c.params.hints.block_rows = 64;
  for (Variant variant : {Variant::flash1, Variant::flashd}) {
    c.params.variant = variant;
    HostAttentionResult r = expect_matches(c.q, c.k, c.v, c.params, variant_name(variant));
    EXPECT_EQ(r.block_rows, 64u) << variant_name(variant);
    EXPECT_EQ(r.group_rows, 32u) << variant_name(variant);
  }
  AttentionParams shared_q = ragged.params;
  shared_q.variant = Variant::flash2;
  shared_q.hints.splits = 0;
  HostTensor q96 = random_tensor({1, 4, 40, 96}, 135), k96 = random_tensor({1, 2, 90, 96}, 136),
             v96 = random_tensor({1, 2, 90, 96}, 137);
  shared_q.mods.key_mask.resize(90);
  HostAttentionResult wide = expect_matches(q96, k96, v96, shared_q, "d = 96");
  EXPECT_EQ(wide.block_rows, 64u);
  AttentionParams described = shared_q;
  described.hints.tile_layout = TileLayout::cooperative_matrix;
  std::vector<PipelineDescription> pipes =
      describe_pipelines(context(), PipelineCall{1, 4, 2, 40, 90, 96, 96, described, DType::f16});
  ASSERT_FALSE(pipes.empty());
  EXPECT_EQ(pipes[0].spec_constants.at(20).second, 1u) << "Q_SHARED";
  AttentionParams params;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  params.hints.group_rows = 32;
  HostTensor q256 = round_to_half(random_tensor({1, 1, 4, 256}, 134));
  expect_refused([&] { attention(context(), q256, q256, q256, params, DType::f16); },
                 "takes group_rows 0, 16 or 32");
  HostTensor q = round_to_half(c.q);
  params.hints.group_rows = 24;
  expect_refused([&] { attention(context(), q, q, q, params, DType::f16); },
                 "takes group_rows 0, 16 or 32");
  params.hints.group_rows = 32;
  expect_refused([&] { attention(softmax_matrices_context(), q, q, q, params, DType::f16); },
                 "not matrix_api nv2");
  params.hints.tile_layout = TileLayout::automatic;
  expect_refused([&] { attention(context(), q, q, q, params, DType::f16); },
                 "group_rows (query rows a group of the matrix kernel multiplies) applies to "
                 "tile_layout cooperative_matrix");
}

// ContextOptions::matrix_skip (FLASHVK_MATRIX_SKIP in bench), the timing diagnostic, leaves
// phases of the matrix kernel out, each to its closed form (flash_cm.comp, SKIP_*). In both
// kernels (the softmax on lanes, and in matrices: nv2's, or its stand-in), FlashAttention-2, 70
// keys: staging (K = V = 0): O = 0, LSE = log 70; scores (S = 0, every key weighed alike): O the
// mean of V's rows, LSE = log 70; softmax (the rows' state as it started): O = 0, LSE = -inf; pv:
// O = 0, LSE the true one. The softmax's P = 1 and factors 1 show in FLASH-D, whose output is not
// divided: in 16-key tiles O is the sum of every tile's 16 keys' V, the last tile's 6 keys and
// 10 more copies of key 69 (what a tile holds past its keys), unsplit (d = 16) and split (d =
// 160: 4 keys a softmax lane, two groups a block). prefetch (tiles fetched as they are stored)
// and queries (Q read from shared memory at each tile) keep the whole kernel's results, bit for
// bit. A phase it does not know is refused by name.
TEST_F(MatrixTest, SkippedPhasesGiveTheirClosedForms) {
  HostTensor q = round_to_half(random_tensor({1, 2, 20, 16}, 111)),
             k = round_to_half(random_tensor({1, 1, 70, 16}, 112)),
             v = round_to_half(random_tensor({1, 1, 70, 16}, 113));
  AttentionParams params;
  params.want_lse = true;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  reference::Result ref = reference::direct(q, k, v, params);
  // Per query row (2 heads of 20), each of V's columns summed with a weight per key.
  auto weighed = [](const HostTensor& values, auto weight) {
    int64_t dv = values.shape[3];
    std::vector<double> out(size_t(2 * 20 * dv), 0.0);
    for (size_t r = 0; r < 2 * 20; ++r)
      for (int64_t c = 0; c < dv; ++c)
        for (int64_t j = 0; j < 70; ++j)
          out[r * size_t(dv) + size_t(c)] += weight(j) * values.at({0, 0, j, c});
    return out;
  };
  const std::vector<double> zeros(ref.out.size(), 0.0),
      mean = weighed(v, [](int64_t) { return 1.0 / 70.0; });
  const double log70 = std::log(70.0);
  const bool nv2 = context().device().nv_cooperative_matrix2;
  auto run = [&](MatrixApi api, const char* phases, const HostTensor& qq, const HostTensor& kk,
                 const HostTensor& vv, const AttentionParams& p) {
    ContextOptions options = test_options();
    options.matrix_api = api;
    options.matrix_skip = phases;
    Context ctx = Context::create(options);
    HostAttentionResult gpu = attention(ctx, qq, kk, vv, p, DType::f16);
    EXPECT_EQ(gpu.tile_layout, TileLayout::cooperative_matrix);
    expect_no_validation_messages(ctx);
    return gpu;
  };
  for (MatrixApi api : {matrix_api_of(context().device()),
                        nv2 ? MatrixApi::nv2 : MatrixApi::emulated_nv2}) {
    std::string name = matrix_api_name(api);
    HostAttentionResult staging = run(api, "staging", q, k, v, params);
    EXPECT_EQ(max_error(staging.out.data, zeros), 0.0) << name;
    for (float lse : staging.lse.data) EXPECT_NEAR(lse, log70, 1e-5) << name;
    HostAttentionResult scores = run(api, "scores", q, k, v, params);
    EXPECT_LE(max_error(scores.out.data, mean), 1e-5) << name;
    for (float lse : scores.lse.data) EXPECT_NEAR(lse, log70, 1e-5) << name;
    HostAttentionResult softmax = run(api, "softmax", q, k, v, params);
    EXPECT_EQ(max_error(softmax.out.data, zeros), 0.0) << name;
    for (float lse : softmax.lse.data) EXPECT_EQ(lse, -INFINITY) << name;
    HostAttentionResult pv = run(api, "pv", q, k, v, params);
    EXPECT_EQ(max_error(pv.out.data, zeros), 0.0) << name;
    EXPECT_LE(max_lse_error(pv.lse.data, ref.lse), 2e-5) << name;
    // prefetch and queries leave out a way of holding data, not work: the whole kernel's
    // results, bit for bit.
    HostAttentionResult whole = run(api, "", q, k, v, params);
    EXPECT_LE(max_error(whole.out.data, ref.out),
              tolerance(q, k, v, params) + weight_rounding(whole, v))
        << name;
    for (const char* kept : {"prefetch", "queries", "prefetch,queries"}) {
      HostAttentionResult same = run(api, kept, q, k, v, params);
      EXPECT_EQ(same.out.data, whole.out.data) << name << ", " << kept;
      EXPECT_EQ(same.lse.data, whole.lse.data) << name << ", " << kept;
    }
  }
  AttentionParams flashd = params;
  flashd.variant = Variant::flashd;
  flashd.hints.block_keys = 16;
  auto ones = [](int64_t j) { return j == 69 ? 11.0 : 1.0; };  // key 69 and its 10 copies
  HostTensor q160 = round_to_half(random_tensor({1, 2, 20, 160}, 114)),
             k160 = round_to_half(random_tensor({1, 1, 70, 160}, 115)),
             v96 = round_to_half(random_tensor({1, 1, 70, 96}, 116));
  for (auto [qq, kk, vv] : {std::tie(q, k, v), std::tie(q160, k160, v96)}) {
    std::string what = "FLASH-D, d = " + std::to_string(qq.shape[3]);
    HostAttentionResult sums = run(matrix_api_of(context().device()), "softmax", qq, kk, vv, flashd);
    EXPECT_EQ(sums.block_keys, 16u) << what;
    EXPECT_LE(max_error(sums.out.data, weighed(vv, ones)), 1e-3) << what;
    for (float lse : sums.lse.data) EXPECT_EQ(lse, -INFINITY) << what;
  }
  {
    // The kept ones split (each group's half of Q's head dims from shared memory: d = 160, and
    // d = 64 in 32-row blocks), and without the prefetch where V^T takes K's place (64 keys at
    // d = 64 within 32 KiB: V_IN_K), bit for bit; queries where Q's array does not fit the
    // shared memory is refused.
    const MatrixApi api = matrix_api_of(context().device());
    AttentionParams split = params;
    split.hints.block_keys = 16;
    HostAttentionResult whole = run(api, "", q160, k160, v96, split);
    HostAttentionResult same = run(api, "prefetch", q160, k160, v96, split);
    EXPECT_EQ(same.out.data, whole.out.data) << "split, prefetch";
    EXPECT_EQ(same.lse.data, whole.lse.data) << "split, prefetch";
    HostTensor q64 = round_to_half(random_tensor({1, 2, 20, 64}, 117)),
               k64 = round_to_half(random_tensor({1, 1, 70, 64}, 118)),
               v64 = round_to_half(random_tensor({1, 1, 70, 64}, 119));
    AttentionParams rows32 = params;
    rows32.hints.block_rows = 32;
    HostAttentionResult halves = run(api, "", q64, k64, v64, rows32);
    for (const char* kept : {"queries", "prefetch,queries"}) {
      HostAttentionResult split_same = run(api, kept, q64, k64, v64, rows32);
      EXPECT_EQ(split_same.block_rows, 32u) << kept;
      EXPECT_EQ(split_same.out.data, halves.out.data) << "32 rows, " << kept;
      EXPECT_EQ(split_same.lse.data, halves.lse.data) << "32 rows, " << kept;
    }
    AttentionParams wide = params;
    wide.hints.block_keys = 64;
    wide.hints.max_shared_memory = 32 * 1024;
    HostAttentionResult in_k = run(api, "", q64, k64, v64, wide);
    EXPECT_EQ(in_k.block_keys, 64u);
    HostAttentionResult fetched_late = run(api, "prefetch", q64, k64, v64, wide);
    EXPECT_EQ(fetched_late.out.data, in_k.out.data);
    EXPECT_EQ(fetched_late.lse.data, in_k.lse.data);
    ContextOptions small = test_options();
    small.matrix_api = api;
    small.matrix_skip = "queries";
    small.limits.max_shared_memory = 32 * 1024;  // the engine's tiles fit, with Q's array not
    Context ctx = Context::create(small);
    HostTensor q256 = round_to_half(random_tensor({1, 2, 20, 256}, 120)),
               k256 = round_to_half(random_tensor({1, 1, 70, 256}, 121));
    expect_refused([&] { attention(ctx, q256, k256, k256, params, DType::f16); },
                   "matrix_skip (FLASHVK_MATRIX_SKIP) queries: the matrix kernel needs up to");
  }
  ContextOptions unknown = test_options();
  unknown.matrix_skip = "scores,exp";
  expect_refused([&] { Context::create(unknown); },
                 "matrix_skip (FLASHVK_MATRIX_SKIP): 'exp' is not a phase of the matrix kernel");
}

// Intel's shapes, emulated (ContextOptions::emulated_matrix_shape): 8 rows a matrix, so twice the
// groups of half the rows; 8x8x16 by 8 lanes (Arc A-series: one lane a row's softmax, 8-column
// output pieces) and 8x16x16 by 16 (Xe2: two lanes a row). The ragged case of
// EachRecurrenceMatchesTheReference in two recurrences at each shape, and FlashAttention-2 split
// (past d = 64 on Arc, 128 on Xe2). Any other shape, or one set for another API, is refused.
TEST_F(MatrixTest, IntelShapesMatchTheReference) {
  HostTensor q = random_tensor({2, 4, 70, 32}, 71), k = random_tensor({2, 2, 150, 32}, 72),
             v = random_tensor({2, 2, 150, 48}, 73);
  HostTensor q160 = random_tensor({1, 4, 24, 160}, 74), k160 = random_tensor({1, 2, 70, 160}, 75),
             v96 = random_tensor({1, 2, 70, 96}, 76), q96 = random_tensor({1, 4, 24, 96}, 77),
             k96 = random_tensor({1, 2, 70, 96}, 78);
  AttentionParams params;
  params.want_lse = true;
  params.mods.causal = true;
  params.hints.max_shared_memory = 32 * 1024;
  for (MatrixShape shape : {kMatrixShapes[1], kMatrixShapes[2]}) {
    ContextOptions options = test_options();
    options.matrix_api = MatrixApi::emulated;
    options.emulated_matrix_shape = shape;
    Context ctx = Context::create(options);
    ASSERT_EQ(ctx.device().matrix_shape, shape);
    std::string name = matrix_shape_name(shape);
    bool arc = shape.n == 8;
    for (Variant variant : {arc ? Variant::flash2 : Variant::flash1,
                            arc ? Variant::flashd : Variant::splitkv}) {
      params.variant = variant;
      HostAttentionResult run =
          expect_matches(q, k, v, params, name + ", " + variant_name(variant), ctx);
      EXPECT_EQ(run.block_rows, 64u) << name;
    }
    params.variant = Variant::flash2;
    HostAttentionResult run = arc ? expect_matches(q96, k96, v96, params, name + ", d = 96", ctx)
                                  : expect_matches(q160, k160, v96, params, name + ", d = 160", ctx);
    EXPECT_EQ(run.block_rows, 32u) << name;
    EXPECT_TRUE(ctx.take_validation_messages().empty()) << name;
  }
  ContextOptions odd = test_options();
  odd.matrix_api = MatrixApi::emulated;
  odd.emulated_matrix_shape = {16, 8, 16, 16};
  expect_refused([&] { Context::create(odd); }, "is not one of the kernels' shapes");
  odd.matrix_api = MatrixApi::none;
  odd.emulated_matrix_shape = kMatrixShapes[2];
  expect_refused([&] { Context::create(odd); }, "emulated_matrix_shape is for matrix_api emulated");
}

// The kernel that keeps the softmax in matrices (nv2's, emulated where the device lacks it: the
// scores, the rows' max and sum, and the recurrence's state in accumulators, the hooks run
// element by element): the ragged case of EachRecurrenceMatchesTheReference in every
// recurrence, ModifiersMatchTheReference's modifiers, a user-written score_mod, inner tiles
// (plain and softcapped: their scores read no row), and past d = 128, where a block is split
// over two groups, the scratch's kernel in its place. An emulated shape is for `emulated` alone.
TEST_F(MatrixTest, SoftmaxInMatricesMatchesTheReference) {
  Context& ctx = softmax_matrices_context();
  // The build a call's attention kernel comes from (its first pipeline past RoPE's).
  auto kernel_build = [&](uint32_t d, uint32_t dv, AttentionParams p) {
    p.hints.tile_layout = TileLayout::cooperative_matrix;
    std::vector<PipelineDescription> pipes =
        describe_pipelines(ctx, PipelineCall{1, 2, 1, 24, 50, d, dv, p, DType::f16});
    return pipes.empty() ? std::string() : pipes[0].shader;
  };
  const std::string rows_build =
      ctx.handles().matrix_api == MatrixApi::nv2 ? "flash2_cooperative_matrix_nv2"
                                                 : "flash2_cooperative_matrix_emunv2";
  AttentionParams plain;
  plain.variant = Variant::flash2;
  EXPECT_EQ(kernel_build(32, 48, plain), rows_build);
  Case ragged = ragged_case(81);
  const HostTensor &q = ragged.q, &k = ragged.k, &v = ragged.v;
  AttentionParams& params = ragged.params;
  for (Variant variant : kMatrixVariants) {
    params.variant = variant;
    expect_matches(q, k, v, params, variant_name(variant), ctx);
  }
  Case mods = modifiers_case(84);
  expect_modifiers_match(mods, {Variant::flash1, Variant::splitkv}, ctx);
#ifdef FLASHVK_TEST_FLEX
  flex::enable(ctx);
  expect_matches(mods.q, mods.k, mods.v, with_score_mod(Variant::flashd), "score_mod", ctx);
#endif
  // Inner tiles (every key inside every valid row's range), whose scores read no row where no
  // modifier needs one: all but the last, partial tile without a mask (plain, and softcapped in
  // FLASH-D); causal over 200 keys, where query i sees keys 0 .. 160 + i: the tiles wholly
  // before key 161 are inner, the later ones are not.
  HostTensor qi = random_tensor({1, 2, 40, 32}, 91), ki = random_tensor({1, 1, 200, 32}, 92),
             vi = random_tensor({1, 1, 200, 48}, 93);
  AttentionParams inner;
  inner.want_lse = true;
  inner.variant = Variant::flash2;
  expect_matches(qi, ki, vi, inner, "inner tiles", ctx);
  inner.mods.causal = true;
  expect_matches(qi, ki, vi, inner, "inner tiles, causal", ctx);
  inner.mods.causal = false;
  inner.variant = Variant::flashd;
  inner.mods.softcap = 4.0f;
  expect_matches(qi, ki, vi, inner, "inner tiles, softcap", ctx);
  HostTensor q160 = random_tensor({1, 2, 24, 160}, 87), k160 = random_tensor({1, 1, 50, 160}, 88),
             v96 = random_tensor({1, 1, 50, 96}, 89);
  params.variant = Variant::flash2;
  params.mods.key_mask.clear();
  params.hints.max_shared_memory = 32 * 1024;
  HostAttentionResult run = expect_matches(q160, k160, v96, params, "d = 160", ctx);
  EXPECT_EQ(run.block_rows, 32u);  // split: the scratch's kernel
  EXPECT_NE(kernel_build(160, 96, params).find("flash2_cooperative_matrix_"), std::string::npos);
  EXPECT_EQ(kernel_build(160, 96, params).find("nv2"), std::string::npos);
  ContextOptions shaped = test_options();
  shaped.matrix_api = MatrixApi::emulated_nv2;
  shaped.emulated_matrix_shape = kMatrixShapes[2];
  expect_refused([&] { Context::create(shaped); },
                 "emulated_matrix_shape is for matrix_api emulated");
}

#ifdef FLASHVK_TEST_FLEX
// A user-written score_mod compiled into the matrix kernel at run time.
TEST_F(MatrixTest, UserScoreModMatchesItsTwin) {
  flex::enable(context());
  HostTensor q = random_tensor({1, 2, 40, 32}, 41), k = random_tensor({1, 2, 90, 32}, 42),
             v = random_tensor({1, 2, 90, 32}, 43);
  expect_matches(q, k, v, with_score_mod(Variant::flash2), "score_mod");
}
#endif

// K and V in ggml's block formats, decoded to fp16 as each tile is staged: every format as K or
// as V, heads of one, two and four halves in both, each run in another recurrence (two in the
// kernel that keeps the softmax in matrices, one with fp16 K beside a block format's V), with
// GQA, causal, ragged lengths, and d = 32, dv = 64 or the other way round, against float64 on
// the values stored. On a grid that
// fp16 holds exactly (exact_blocks), any slip in decoding (a quant, a head, a run's place in its
// block) shows at the fp16 products' tolerance. Then random values, whose decoding rounds each
// to fp16 (by at most 2^-10 of itself, in any rounding mode): within the bound that adds.
TEST_F(MatrixTest, BlockFormatsAreDecodedAsTilesAreStaged) {
  struct Run {
    Variant variant;
    DType k, v;
    bool in_matrices;
    uint32_t group_rows = 0;
  };
  const Run runs[] = {{Variant::flash2, DType::q8_0, DType::q5_0, false},
                      {Variant::flashd, DType::q4_1, DType::iq4_nl, false},
                      {Variant::splitkv, DType::q5_1, DType::q4_1, false},
                      {Variant::flash1, DType::q4_0, DType::q8_0, true},
                      {Variant::flashd, DType::f16, DType::q4_0, true},
                      {Variant::flash2, DType::q4_0, DType::q5_1, false, 32}};
  AttentionParams params;
  params.want_lse = true;
  params.mods.causal = true;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  params.hints.block_keys = 16;  // llvmpipe builds the emulated kernels faster
  uint32_t seed = 100;
  for (const Run& r : runs) {
    const int64_t d = seed % 2 ? 64 : 32, dv = 96 - d;  // (seed: 100, 103, ...)
    HostTensor q = round_to_half(random_tensor({1, 4, 40, d}, ++seed)),
               k = exact_blocks({1, 2, 150, d}, r.k, ++seed),
               v = exact_blocks({1, 2, 150, dv}, r.v, ++seed);
    std::string what = std::string(variant_name(r.variant)) + ", " +
                       storage_name({DType::f16, r.k, r.v}) + ", d = " + std::to_string(d) +
                       (r.in_matrices ? ", softmax in matrices" : "") +
                       (r.group_rows ? ", 32 rows a group" : "");
    ASSERT_EQ(stored_values(k, r.k).data, k.data) << what;  // the grid is what they store
    ASSERT_EQ(stored_values(v, r.v).data, v.data) << what;
    ASSERT_EQ(round_to_half(k).data, k.data) << what;
    ASSERT_EQ(round_to_half(v).data, v.data) << what;
    params.variant = r.variant;
    params.hints.splits = r.variant == Variant::splitkv ? 3 : 0;
    params.hints.group_rows = r.group_rows;
    reference::Result ref = reference::direct(q, k, v, params);
    Context& ctx = r.in_matrices ? softmax_matrices_context() : context();
    HostAttentionResult gpu = attention(ctx, q, k, v, params, {DType::f16, r.k, r.v});
    EXPECT_EQ(gpu.tile_layout, TileLayout::cooperative_matrix) << what;
    if (r.group_rows) {
      EXPECT_EQ(gpu.group_rows, r.group_rows) << what;
    }
    EXPECT_LE(max_error(gpu.out.data, ref.out),
              tolerance(q, k, v, params) + weight_rounding(gpu, v))
        << what;
    EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 2e-5) << what;
  }
  params.hints.group_rows = 0;
  // Off the grid (the first run's formats): within what decoding to fp16 may add
  // (decode_rounding: each value fp16 does not hold moves by at most 2^-10 of itself).
  const Run& r = runs[0];
  params.variant = r.variant;
  params.hints.splits = 0;
  HostTensor q = round_to_half(random_tensor({1, 4, 40, 32}, 120)),
             k = random_tensor({1, 2, 150, 32}, 121), v = random_tensor({1, 2, 150, 64}, 122);
  HostTensor ks = stored_values(k, r.k), vs = stored_values(v, r.v);
  ASSERT_NE(round_to_half(ks).data, ks.data);  // there is rounding to bound
  reference::Result ref = reference::direct(q, ks, vs, params);
  HostAttentionResult gpu = attention(context(), q, k, v, params, {DType::f16, r.k, r.v});
  DecodeRounding moved = decode_rounding(gpu.tile_layout, q, ks, vs, params);
  ASSERT_GT(moved.lse, 0.0);
  EXPECT_LE(max_error(gpu.out.data, ref.out),
            tolerance(q, ks, vs, params) + weight_rounding(gpu, vs) + moved.out);
  EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 2e-5 + moved.lse);
}

// Each API the device has for its matrix units (khr, nv, nv2), on a context of its own, runs the
// same kernel to the same answer; an API the device lacks is refused by name (on lavapipe all
// are: the refusals are this test's assertions there).
TEST_F(MatrixTest, EachMatrixApiOfTheDeviceMatchesTheReference) {
  const DeviceInfo& info = context().device();
  HostTensor q = round_to_half(random_tensor({1, 2, 40, 64}, 51)),
             k = round_to_half(random_tensor({1, 2, 100, 64}, 52)),
             v = round_to_half(random_tensor({1, 2, 100, 64}, 53));
  AttentionParams params;
  params.variant = Variant::flash2;
  params.mods.causal = true;
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  reference::Result ref = reference::direct(q, k, v, params);
  for (MatrixApi api : {MatrixApi::khr, MatrixApi::nv, MatrixApi::nv2}) {
    bool has = api == MatrixApi::khr ? info.matrix_api == MatrixApi::khr
               : api == MatrixApi::nv ? info.nv_cooperative_matrix
                                      : info.nv_cooperative_matrix2;
    ContextOptions options = test_options();
    options.matrix_api = api;
    if (!has) {
      expect_refused([&] { Context::create(options); },
                     (std::string("matrix_api ") + matrix_api_name(api)).c_str());
      continue;
    }
    Context ctx = Context::create(options);
    EXPECT_EQ(ctx.handles().matrix_api, api);
    HostAttentionResult gpu = attention(ctx, q, k, v, params, DType::f16);
    EXPECT_LE(max_error(gpu.out.data, ref.out),
              tolerance(q, k, v, params) + weight_rounding(gpu, v))
        << matrix_api_name(api);
    EXPECT_TRUE(ctx.take_validation_messages().empty()) << matrix_api_name(api);
  }
}

}  // namespace
}  // namespace flashvk::test
