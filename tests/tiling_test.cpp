// The tiling policy (engine/src/tiling.hpp) on devices the tests do not run on: an NVIDIA GPU
// with matrix units, a phone GPU, Vulkan's guaranteed minimums and a CPU driver. The layout each
// gets is the one docs/engine.md ("Tile layouts", `automatic`) promises, and every tiling it
// picks fits the device's shared memory and invocations, computed here from the tile's parts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "flashvk/pipelines.hpp"
#include "test_util.hpp"
#include "plan.hpp"
#include "tiling.hpp"

namespace flashvk {
namespace {

using detail::Spec;

DeviceInfo device(const char* name, const char* type, uint32_t shared, uint32_t invocations,
                  uint32_t subgroup, bool shuffle, bool coopmat) {
  DeviceInfo info;
  info.name = name;
  info.type = type;
  info.max_shared_memory = shared;
  info.max_workgroup_invocations = invocations;
  for (uint32_t& n : info.max_workgroup_count) n = 65535;
  info.subgroup_size = subgroup;
  info.subgroup_shuffle = shuffle;
  info.max_storage_buffer_range = 1u << 30;
  info.max_texel_buffer_elements = 1u << 27;
  info.min_storage_offset_alignment = info.min_texel_offset_alignment = 64;
  info.texel_buffers = true;
  info.fp16_storage = true;
  info.cooperative_matrix = info.nv_cooperative_matrix = coopmat;
  info.matrix_api = coopmat ? MatrixApi::khr : MatrixApi::none;
  info.fp16_arithmetic = true;
  return info;
}

const DeviceInfo kH100 = device("H100-like", "discrete", 227 * 1024, 1024, 32, true, true);
const DeviceInfo kPhone = device("phone-like", "integrated", 32 * 1024, 512, 16, true, false);
const DeviceInfo kMinimum = device("Vulkan minimums", "integrated", 16384, 128, 1, false, false);
const DeviceInfo kCpu = device("llvmpipe-like", "cpu", 32 * 1024, 1024, 8, true, false);

using test::dims;
using test::expect_refused;

Spec tiling(const DeviceInfo& info, const Dims& shape, Variant variant, DType dtype,
            TileLayout layout = TileLayout::automatic, bool fp16_arithmetic = false) {
  AttentionParams params;
  params.variant = variant;
  params.hints.tile_layout = layout;
  params.hints.fp16_arithmetic = fp16_arithmetic;
  return detail::choose_tiling({.info = info,
                                .matrix_api = info.matrix_api,
                                .fp16_arithmetic_enabled = info.fp16_arithmetic,
                                .dims = shape,
                                .params = params,
                                .dtype = dtype,
                                .kv = Storage(dtype)});
}

// Shared memory a register-block workgroup uses, from its tiles: the queries [d][Br] and P
// [Bc][Br] in fp32 (fp16 with fp16 arithmetic), the K/V tile (kv_vec4 vectors of 4 such),
// without subgroup operations a float per invocation for the row reductions, and the
// workgroup's key range.
uint64_t block_footprint(const Spec& s, uint32_t d) {
  uint64_t br = s.block(), bc = s.bc, element = s.block_f16 ? 2 : 4;
  return element * (d * br + bc * br + 4ull * s.kv_vec4) +
         (s.block_shuffle ? 0 : 4ull * s.workgroup) + 8;
}

TEST(TilingTest, GpuWithMatrixUnits) {
  Dims prefill64 = dims(8, 8, 4096, 4096, 64, 64), prefill128 = dims(8, 8, 4096, 4096, 128, 128);
  // fp16 prefill on the matrix units: 64 keys a tile at d = 64, 32 at d = 128 (48 KiB).
  Spec cm = tiling(kH100, prefill64, Variant::flash2, DType::f16);
  EXPECT_EQ(cm.layout, TileLayout::cooperative_matrix);
  EXPECT_EQ(cm.workgroup, 128u);
  EXPECT_EQ(cm.bc, 64u);
  EXPECT_EQ(tiling(kH100, prefill128, Variant::flashd, DType::f16).bc, 32u);
  // Past d = 128 two subgroups share a block of 16 rows (LANES 2): 32 rows a workgroup; at
  // d = 256, 32 keys: K 32 x 264 and V^T 256 x 40 fp16, and 64 rows of scratch, 36 floats each
  // where the factors are keep alone (FlashAttention-2: 45.6 KiB), 52 with coef (FLASH-D: 49.6
  // KiB, over 48: 16 keys).
  Spec cm256 = tiling(kH100, dims(8, 8, 4096, 4096, 256, 256), Variant::flash2, DType::f16);
  EXPECT_EQ(cm256.layout, TileLayout::cooperative_matrix);
  EXPECT_EQ(cm256.lanes, 2u);
  EXPECT_EQ(cm256.block(), 32u);
  EXPECT_EQ(cm256.bc, 32u);
  EXPECT_EQ(tiling(kH100, dims(8, 8, 4096, 4096, 256, 256), Variant::flashd, DType::f16).bc, 16u);
  EXPECT_EQ(cm.lanes, 1u);
  // Split, d and dv are multiples of 32: at d = 144 the matrix layout does not run.
  EXPECT_NE(tiling(kH100, dims(8, 8, 4096, 4096, 144, 144), Variant::flash2, DType::f16).layout,
            TileLayout::cooperative_matrix);
  // fp32 prefill: register blocks, the most rows, then the most keys within 48 KiB: 64 x 32 at
  // d = 64; at d = 128, 64 x 16 with V in K's place (64 x 8 with both would fit too).
  Spec b64 = tiling(kH100, prefill64, Variant::flash2, DType::f32);
  EXPECT_EQ(b64.layout, TileLayout::blocks);
  EXPECT_EQ(b64.block(), 64u);
  EXPECT_EQ(b64.bc, 32u);
  EXPECT_NE(b64.v_at, 0u);  // K and V apart
  Spec b128 = tiling(kH100, prefill128, Variant::flash2, DType::f32);
  EXPECT_EQ(b128.block(), 64u);
  EXPECT_EQ(b128.bc, 16u);
  EXPECT_EQ(b128.v_at, 0u);  // V in K's place
  EXPECT_LE(block_footprint(b128, 128), 48u * 1024);
  // Decoding (GQA: 4 query heads a KV head): the lanes kernel, all 4 rows in one workgroup.
  Spec decode = tiling(kH100, dims(32, 8, 1, 65536, 128, 128), Variant::splitkv, DType::f16);
  EXPECT_EQ(decode.layout, TileLayout::lanes);
  EXPECT_EQ(decode.block(), 4u);
  EXPECT_EQ(decode.lanes, 16u);  // 128 halves: 16 loads of 16 bytes
}

// K and V in a block format beside fp16 Q take the matrix units too (decoded to fp16 as their
// tiles are staged); fp32 Q, or K or V in bf16, keep the register blocks. A 5-bit format's V
// holds a third more words a key while the next tile is fetched: nv2 at d = 128, whose fp16
// tiles take 64 keys (KF = 8 uvec4 of K and 2 items of V, 32 words each: 64), takes 32 (80).
TEST(TilingTest, BlockFormatsTakeTheMatrixUnitsBesideFp16Queries) {
  Dims prefill = dims(8, 8, 4096, 4096, 128, 128);
  DeviceInfo nv2 = kH100;
  nv2.nv_cooperative_matrix2 = true;
  nv2.matrix_api = MatrixApi::nv2;
  auto tiled = [&](const DeviceInfo& info, Storage storage) {
    AttentionParams params;
    return detail::choose_tiling({.info = info,
                                  .matrix_api = info.matrix_api,
                                  .dims = prefill,
                                  .params = params,
                                  .dtype = storage.q,
                                  .kv = storage});
  };
  for (DType kv :
       {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::iq4_nl}) {
    Spec s = tiled(kH100, {DType::f16, kv, kv});
    EXPECT_EQ(s.layout, TileLayout::cooperative_matrix) << dtype_name(kv);
    EXPECT_EQ(s.bc, 32u) << dtype_name(kv);  // as fp16's
    EXPECT_EQ(s.k_format, uint32_t(kv));
  }
  EXPECT_EQ(tiled(kH100, {DType::f16, DType::f16, DType::q8_0}).layout,
            TileLayout::cooperative_matrix);
  EXPECT_EQ(tiled(kH100, {DType::f32, DType::q8_0, DType::q8_0}).layout, TileLayout::blocks);
  EXPECT_EQ(tiled(kH100, {DType::f16, DType::bf16, DType::q8_0}).layout, TileLayout::blocks);
  EXPECT_EQ(tiled(nv2, {DType::f16, DType::q8_0, DType::q8_0}).bc, 64u);
  EXPECT_EQ(tiled(nv2, {DType::f16, DType::q8_0, DType::q5_1}).bc, 32u);
  EXPECT_EQ(tiled(nv2, {DType::f16, DType::q5_0, DType::q4_1}).bc, 64u);  // K's words as fp16's
}

// Intel's matrix shapes: 8 rows a matrix, so 8 groups share a workgroup's 64 rows, of 8 lanes
// on Arc A-series (8x8x16, 64 invocations) or 16 on Xe2 (8x16x16, 128), each required. A lane
// holds what it does on NVIDIA: on Arc, where a lane holds a whole row of a matrix, two groups
// share a block past d = 64 (so d up to 128); its one softmax lane a row takes 32 keys (64 split);
// and 64 invocations prefetch fewer keys: at d = 96 (split), 64 keys (44 KiB, within 48) would
// be 64 * 96 / 8 uvec4 of K and 64 * 96 / 32 items of V (4 uvec4 each) over 64 lanes, 24 each:
// 32 keys, where 128 lanes take 64.
TEST(TilingTest, IntelShapesTakeEightRowMatrices) {
  Dims prefill96 = dims(8, 8, 4096, 4096, 96, 96);
  DeviceInfo arc = device("Arc-A-like", "discrete", 64 * 1024, 1024, 8, true, true);
  arc.nv_cooperative_matrix = false;
  arc.matrix_shape = kMatrixShapes[2];
  Spec a = tiling(arc, prefill96, Variant::flash2, DType::f16);
  EXPECT_EQ(a.layout, TileLayout::cooperative_matrix);
  EXPECT_EQ(a.workgroup, 64u);
  EXPECT_EQ(a.cm_m, 8u);
  EXPECT_EQ(a.cm_n, 8u);
  EXPECT_EQ(a.required_subgroup(arc.subgroup_size), 8u);
  EXPECT_EQ(a.lanes, 2u);
  EXPECT_EQ(a.block(), 32u);
  EXPECT_EQ(a.bc, 32u);
  Spec a64 = tiling(arc, dims(8, 8, 4096, 4096, 64, 64), Variant::flash2, DType::f16);
  EXPECT_EQ(a64.lanes, 1u);
  EXPECT_EQ(a64.block(), 64u);
  EXPECT_EQ(a64.bc, 32u);  // 64 keys would fit and prefetch, but give a lane 64 scores
  EXPECT_NE(tiling(arc, dims(8, 8, 4096, 4096, 256, 256), Variant::flash2, DType::f16).layout,
            TileLayout::cooperative_matrix);
  DeviceInfo xe2 = arc;
  xe2.matrix_shape = kMatrixShapes[1];
  Spec x = tiling(xe2, prefill96, Variant::flash2, DType::f16);
  EXPECT_EQ(x.workgroup, 128u);
  EXPECT_EQ(x.cm_m, 8u);
  EXPECT_EQ(x.cm_n, 16u);
  EXPECT_EQ(x.required_subgroup(xe2.subgroup_size), 16u);
  EXPECT_EQ(x.lanes, 1u);
  EXPECT_EQ(x.bc, 64u);
  Spec x256 = tiling(xe2, dims(8, 8, 4096, 4096, 256, 256), Variant::flash2, DType::f16);
  EXPECT_EQ(x256.lanes, 2u);
  EXPECT_EQ(x256.block(), 32u);
  EXPECT_EQ(x256.bc, 32u);
  // An integrated Intel GPU listing 8x8x16 (Gen12, Xe-LPG: the driver's products, no XMX)
  // keeps the register blocks unless the call asks for the matrix kernel.
  DeviceInfo igpu = arc;
  igpu.type = "integrated";
  EXPECT_EQ(tiling(igpu, prefill96, Variant::flash2, DType::f16).layout, TileLayout::blocks);
  EXPECT_EQ(tiling(igpu, prefill96, Variant::flash2, DType::f16, TileLayout::cooperative_matrix)
                .layout,
            TileLayout::cooperative_matrix);
  xe2.type = "integrated";  // Lunar Lake: XMX
  EXPECT_EQ(tiling(xe2, prefill96, Variant::flash2, DType::f16).layout,
            TileLayout::cooperative_matrix);
  // NVIDIA's: 16 x 16 by 32, 4 groups.
  Spec n = tiling(kH100, prefill96, Variant::flash2, DType::f16);
  EXPECT_EQ(n.cm_m, 16u);
  EXPECT_EQ(n.bc, 64u);
  EXPECT_EQ(n.required_subgroup(32), 32u);
}

// The shape a device gets is the first of kMatrixShapes it lists as fp16 into fp32 by a subgroup
// and whose subgroup size it can require: NVIDIA's many shapes give 16x16x16; Intel Arc A's
// 8x8x16 (fp16 into fp16 listed too) gives 8x8x16 where SIMD8 can be required, else none.
TEST(TilingTest, TheDevicesListPicksTheShape) {
  auto listed = [](uint32_t m, uint32_t n, uint32_t k, VkComponentTypeKHR c) {
    VkCooperativeMatrixPropertiesKHR p{VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR};
    p.MSize = m, p.NSize = n, p.KSize = k;
    p.AType = p.BType = VK_COMPONENT_TYPE_FLOAT16_KHR;
    p.CType = p.ResultType = c;
    p.scope = VK_SCOPE_SUBGROUP_KHR;
    return p;
  };
  const VkComponentTypeKHR f16 = VK_COMPONENT_TYPE_FLOAT16_KHR,
                           f32 = VK_COMPONENT_TYPE_FLOAT32_KHR;
  DeviceInfo info;
  info.subgroup_size_control = true;
  info.min_subgroup_size = 32, info.max_subgroup_size = 32;
  EXPECT_EQ(detail::pick_matrix_shape({listed(16, 8, 16, f32), listed(16, 8, 8, f32),
                                       listed(16, 16, 16, f16), listed(16, 16, 16, f32)},
                                      info),
            kMatrixShapes[0]);
  std::vector<VkCooperativeMatrixPropertiesKHR> arc = {listed(8, 8, 16, f16),
                                                       listed(8, 8, 16, f32)};
  EXPECT_EQ(detail::pick_matrix_shape(arc, info), MatrixShape{});  // SIMD8 cannot be required
  info.min_subgroup_size = 8;
  EXPECT_EQ(detail::pick_matrix_shape(arc, info), kMatrixShapes[2]);
  info.subgroup_size_control = false;
  EXPECT_EQ(detail::pick_matrix_shape(arc, info), MatrixShape{});
  info.subgroup_size_control = true;
  EXPECT_EQ(detail::pick_matrix_shape({listed(8, 8, 16, f16)}, info), MatrixShape{});  // fp16 C
}

// RDNA3 (AMD: the driver tells its register file): 64-key matrix tiles only where 4 whole
// workgroups of 4 subgroups share a WGP's 128 KiB of LDS; at d = 64 the 64-key tile's K and V^T
// (2 * (64 * 72 + 64 * 72) bytes) and scratch (64 rows of 68 floats) take 35 KiB: 32 keys. At
// d = 32 (2 * (64 * 40 + 32 * 72) bytes and the same scratch, 27 KiB) 64 keys.
TEST(TilingTest, AmdMatrixTilesLeaveFourSubgroupsASimd) {
  DeviceInfo navi31 = device("RDNA3-like", "discrete", 64 * 1024, 1024, 64, true, true);
  navi31.nv_cooperative_matrix = false;
  navi31.registers_per_simd = 768;
  Dims prefill64 = dims(8, 8, 4096, 4096, 64, 64);
  Spec amd = tiling(navi31, prefill64, Variant::flash2, DType::f16);
  EXPECT_EQ(amd.layout, TileLayout::cooperative_matrix);
  EXPECT_EQ(amd.bc, 32u);
  uint64_t k64 = 2 * (64 * 72 + 64 * 72) + 64 * 4 * 68;
  EXPECT_GT(k64, 32u * 1024);
  EXPECT_EQ(tiling(kH100, prefill64, Variant::flash2, DType::f16).bc, 64u);  // not AMD
  EXPECT_EQ(tiling(navi31, dims(8, 8, 4096, 4096, 32, 32), Variant::flash2, DType::f16).bc, 64u);
  // d = 256 (split: 32 rows a workgroup): 32 keys would take 46 KiB, 2 subgroups a SIMD; 16 keys
  // (K 16 x 264 and V^T 256 x 24 fp16, scratch 64 rows of 28 floats: keep alone) 27 KiB, 4.
  Spec amd256 = tiling(navi31, dims(8, 8, 4096, 4096, 256, 256), Variant::flash2, DType::f16);
  EXPECT_EQ(amd256.layout, TileLayout::cooperative_matrix);
  EXPECT_EQ(amd256.bc, 16u);
  EXPECT_EQ(rdna_subgroups_per_simd(2 * (16 * 264 + 256 * 24) + 64 * 4 * 28 + 64, 128, 32, 8),
            4.0);
  EXPECT_LT(rdna_subgroups_per_simd(2 * (32 * 264 + 256 * 40) + 64 * 4 * 36 + 64, 128, 32, 8),
            4.0);
}

// block_keys sizes the matrix kernel's tiles where the call asks for that layout: 16, 32 or 64
// keys within the shared memory, the engine's caps aside (a tuning sweep's). At d = 128 on 48
// KiB, 64 keys (K 64 x 136 and V^T 128 x 72 fp16, 64 rows of 68 floats of scratch: 52 KiB) fit
// the kernel whose softmax runs on lanes only with V^T in K's place; nv2's, whose scratch is
// only the output's pieces and out_scale (64 rows of 20 floats) beside the workgroup's rows (64
// x 16 words), takes them by itself (44 KiB). Asked for without the layout, block_keys asks for
// shared tiles.
TEST(TilingTest, MatrixTilesTakeTheKeysACallAsksFor) {
  Dims prefill128 = dims(8, 8, 4096, 4096, 128, 128);
  auto asked = [&](const DeviceInfo& info, uint32_t keys, uint32_t shared = 0) {
    AttentionParams params;
    params.variant = Variant::flash2;
    params.hints.tile_layout = TileLayout::cooperative_matrix;
    params.hints.block_keys = keys;
    params.hints.max_shared_memory = shared;
    return detail::choose_tiling({.info = info,
                                  .matrix_api = info.matrix_api,
                                  .dims = prefill128,
                                  .params = params,
                                  .dtype = DType::f16,
                                  .kv = Storage(DType::f16)});
  };
  EXPECT_EQ(asked(kH100, 0).bc, 32u);
  EXPECT_EQ(asked(kH100, 16).bc, 16u);
  EXPECT_EQ(asked(kH100, 32).bc, 32u);
  EXPECT_FALSE(asked(kH100, 32).v_in_k);
  // 64 keys beside each other would take 52 KiB; V^T in K's place (the larger of K's 64 x 136
  // and V^T's 128 x 72) 35 KiB: asked for, the kernel takes them so.
  uint32_t k64 = 2 * (64 * 136 + 128 * 72) + 64 * 4 * 68 + 64,
           v_in_k = 2 * (128 * 72) + 64 * 4 * 68 + 64;
  EXPECT_GT(k64, 48u * 1024);
  Spec over = asked(kH100, 64);
  EXPECT_EQ(over.bc, 64u);
  EXPECT_TRUE(over.v_in_k);
  EXPECT_FALSE(tiling(kH100, prefill128, Variant::flash2, DType::f16).v_in_k);  // not unasked
  expect_refused(
      [&] { asked(kH100, 64, 32 * 1024); },
      ("needs " + std::to_string(v_in_k) + " bytes of shared memory with 64 keys").c_str());
  expect_refused([&] { asked(kH100, 48); }, "takes block_keys 16, 32 or 64");
  // 16 keys with V^T in K's place, the queries staged 32 head dims at a time: 13 KiB
  expect_refused([&] { asked(kH100, 16, 12288); }, "the kernels may take 12288 (the least of");
  DeviceInfo nv2 = kH100;
  nv2.nv_cooperative_matrix2 = true;
  nv2.matrix_api = MatrixApi::nv2;
  uint32_t nv2_64 = 2 * (64 * 136 + 128 * 72) + 64 * 4 * 20 + 64 * 64 + 64;
  EXPECT_LE(nv2_64, 48u * 1024);
  EXPECT_EQ(asked(nv2, 0).bc, 64u);
  EXPECT_EQ(tiling(nv2, prefill128, Variant::flash2, DType::f16).bc, 64u);
  EXPECT_EQ(asked(nv2, 32).bc, 32u);
  // Past d = 128 the block is split, which nv2's kernel leaves to khr's: its scratch again.
  EXPECT_EQ(tiling(nv2, dims(8, 8, 4096, 4096, 256, 256), Variant::flash2, DType::f16).bc, 32u);
  // block_keys without the layout: shared tiles, as before.
  AttentionParams keys_only;
  keys_only.hints.block_keys = 32;
  Spec shared = detail::choose_tiling({.info = kH100,
                                       .matrix_api = MatrixApi::khr,
                                       .dims = prefill128,
                                       .params = keys_only,
                                       .dtype = DType::f16,
                                       .kv = Storage(DType::f16)});
  EXPECT_EQ(shared.layout, TileLayout::shared);
  EXPECT_EQ(shared.bc, 32u);
}

TEST(TilingTest, PhoneGpuTakesRegisterBlocksWithSubgroupShuffles) {
  Spec s = tiling(kPhone, dims(8, 2, 1000, 1000, 64, 64), Variant::flashd, DType::f16);
  EXPECT_EQ(s.layout, TileLayout::blocks);
  EXPECT_TRUE(s.block_shuffle);
  EXPECT_LE(s.workgroup, kPhone.max_workgroup_invocations);
  EXPECT_LE(block_footprint(s, 64), kPhone.max_shared_memory);
  EXPECT_EQ(tiling(kPhone, dims(32, 8, 1, 4096, 128, 128), Variant::splitkv, DType::f16).layout,
            TileLayout::lanes);
  // The matrix layout asked for where there is none: refused by name.
  try {
    tiling(kPhone, dims(8, 8, 64, 64, 64, 64), Variant::flash2, DType::f16,
           TileLayout::cooperative_matrix);
    ADD_FAILURE() << "cooperative_matrix without matrix units was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("VK_NV_cooperative_matrix"), std::string::npos)
        << e.what();
  }
}

// fp16 arithmetic runs where fp16 products are: the register blocks (chosen on any device,
// the CPU driver's and the decoding shapes included, in place of registers and lanes), or the
// matrix units where they take the call.
TEST(TilingTest, Fp16ArithmeticTakesRegisterBlocksOrTheMatrixUnits) {
  Dims prefill = dims(8, 2, 1000, 1000, 64, 64), decode = dims(32, 8, 1, 4096, 128, 128);
  for (const DeviceInfo* info : {&kPhone, &kMinimum, &kCpu}) {
    SCOPED_TRACE(info->name);
    for (const Dims& shape : {prefill, decode}) {
      Spec s = tiling(*info, shape, Variant::splitkv, DType::f16, TileLayout::automatic, true);
      EXPECT_EQ(s.layout, TileLayout::blocks);
      EXPECT_TRUE(s.block_f16);
      EXPECT_EQ(s.block_shuffle, info->subgroup_shuffle);
    }
    EXPECT_FALSE(tiling(*info, prefill, Variant::flash2, DType::f16).block_f16);
  }
  EXPECT_EQ(tiling(kH100, prefill, Variant::flash2, DType::f16, TileLayout::automatic, true).layout,
            TileLayout::cooperative_matrix);
  Spec fp32 = tiling(kH100, prefill, Variant::flash2, DType::f32, TileLayout::automatic, true);
  EXPECT_EQ(fp32.layout, TileLayout::blocks);
  EXPECT_TRUE(fp32.block_f16);
  // fp16 tiles take half the shared memory: at Vulkan's minimums with d = 128, at least twice
  // the rows x keys of fp32's (32 x 16 against 16 x 8).
  Dims long_head = dims(8, 8, 4096, 4096, 128, 128);
  Spec small = tiling(kMinimum, long_head, Variant::flash2, DType::f32, TileLayout::blocks);
  Spec half = tiling(kMinimum, long_head, Variant::flash2, DType::f32, TileLayout::blocks, true);
  EXPECT_GE(half.block() * half.bc, 2 * small.block() * small.bc);
  EXPECT_LE(block_footprint(half, 128), 16384u);
  DeviceInfo without = kPhone;
  without.fp16_arithmetic = false;
  try {
    tiling(without, prefill, Variant::flash2, DType::f16, TileLayout::automatic, true);
    ADD_FAILURE() << "fp16 arithmetic without shaderFloat16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shaderFloat16"), std::string::npos) << e.what();
  }
}

TEST(TilingTest, VulkanMinimumsRunRegisterBlocksThroughSharedMemory) {
  for (Variant v :
       {Variant::online, Variant::flash1, Variant::flash2, Variant::flashd, Variant::splitkv})
    for (uint32_t d : {64u, 128u, 256u}) {
      SCOPED_TRACE(std::string(variant_name(v)) + " d=" + std::to_string(d));
      Spec s = tiling(kMinimum, dims(8, 8, 1, 4096, d, d), v, DType::f32);
      EXPECT_EQ(s.layout, TileLayout::blocks);
      EXPECT_FALSE(s.block_shuffle);
      EXPECT_LE(s.workgroup, 128u);
      EXPECT_LE(block_footprint(s, d), 16384u);
    }
  // No subgroup shuffles: lanes refused by name.
  try {
    tiling(kMinimum, dims(32, 8, 1, 4096, 128, 128), Variant::splitkv, DType::f16,
           TileLayout::lanes);
    ADD_FAILURE() << "lanes without subgroup shuffles was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("subgroup shuffles"), std::string::npos) << e.what();
  }
}

// An AMD-like GPU (64-lane subgroups, 64 KiB of shared memory, no matrix units), as the pipeline
// report sees RDNA2/3 (scripts/pipelines.sh checks the registers there): decoding in lanes in
// every storage, a KV head's rows in at most two workgroups, the clusters of a subgroup merged by
// shuffles (SUBGROUP); at d = 256 the register blocks spread a row's outputs over 16 lanes.
TEST(TilingTest, AmdLikeGpuKeepsEachInvocationsRegistersBounded) {
  const DeviceInfo amd = device("RDNA-like", "discrete", 64 * 1024, 1024, 64, true, false);
  for (DType kv : {DType::f32, DType::f16, DType::q8_0, DType::q4_0}) {
    SCOPED_TRACE(dtype_name(kv));
    AttentionParams params;
    params.variant = Variant::splitkv;
    Dims decode = dims(32, 8, 1, 16384, 128, 128);
    Spec s =
        detail::choose_tiling({.info = amd,
                               .dims = decode,
                               .params = params,
                               .dtype = kv == DType::f32 ? DType::f32 : DType::f16,
                               .kv = Storage(kv == DType::f32 ? DType::f32 : DType::f16, kv, kv)});
    EXPECT_EQ(s.layout, TileLayout::lanes);
    EXPECT_EQ(s.subgroup, 64u);
    EXPECT_GE(2 * s.rows, 4u);  // 4 query heads a KV head
    EXPECT_EQ(s.workgroup, 64u);
    EXPECT_GE(s.bc, 2u);
  }
  for (bool f16 : {false, true}) {
    Spec s = tiling(amd, dims(8, 8, 2048, 2048, 256, 256), Variant::flash2, DType::f16,
                    TileLayout::automatic, f16);
    EXPECT_EQ(s.layout, TileLayout::blocks);
    EXPECT_LE(256 / s.lanes, 32u) << f16;
  }
  Spec s = tiling(amd, dims(8, 8, 2048, 2048, 256, 256), Variant::flash2, DType::f16,
                  TileLayout::automatic, true);
  EXPECT_EQ(s.lanes, 16u);
}

// Lanes asked for with block_keys (1 to 8 keys a step) take as many rows a workgroup as the
// register budget allows at those keys, and one where none fits: all of a KV head's rows (q4_1 K
// and q5_0 V at d = 32, one lane a key, 96 values of a row a lane) built 18,000 to 52,000
// instructions that spilled (RADV; on the H200 a test of two such builds ran past 165 s).
TEST(TilingTest, LanesAskedForKeepTheirRowsWithinTheRegisterBudget) {
  const DeviceInfo amd = device("RDNA-like", "discrete", 64 * 1024, 1024, 64, true, false);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.tile_layout = TileLayout::lanes;
  auto lanes = [&](const Dims& shape, const Storage& kv, uint32_t keys) {
    params.hints.block_keys = keys;
    Spec s = detail::choose_tiling(
        {.info = amd, .dims = shape, .params = params, .dtype = kv.q, .kv = kv});
    EXPECT_EQ(s.layout, TileLayout::lanes);
    EXPECT_EQ(s.bc, keys ? keys : 4u) << keys;
    return s.rows;
  };
  const Storage blocks(DType::f32, DType::q4_1, DType::q5_0);
  for (uint32_t keys : {0u, 1u, 2u, 8u})  // 6 rows of a KV head; 0: the engine's 4 keys
    EXPECT_EQ(lanes(dims(4, 2, 3, 70, 32, 64), blocks, keys), 1u) << keys;
  // fp16 at d = 128 (16 lanes a key, 8 values of a row a lane): all 4 of a KV head's rows.
  const Storage f16(DType::f16, DType::f16, DType::f16);
  EXPECT_EQ(lanes(dims(32, 8, 1, 16384, 128, 128), f16, 1), 4u);
}

// flash2's tiling through khr at N = 4096, d = dv = d, fp16, with block_rows and group_rows.
Spec matrix_rows(uint32_t d, uint32_t rows, uint32_t group_rows, TileLayout layout,
                 const DeviceInfo& info = kH100) {
  AttentionParams params;
  params.variant = Variant::flash2;
  params.hints.tile_layout = layout;
  params.hints.block_rows = rows;
  params.hints.group_rows = group_rows;
  return detail::choose_tiling({.info = info,
                                .matrix_api = MatrixApi::khr,
                                .dims = dims(8, 8, 4096, 4096, d, d),
                                .params = params,
                                .dtype = DType::f16,
                                .kv = Storage(DType::f16)});
}

// block_rows on the matrix kernel asked for: 32 splits each block of rows over two groups (half
// the head dims each, LANES 2) at d = 128 too, 64 rows where d allows; 128 takes 8 groups (256
// invocations) up to d = 128, on a device that allows so many (Vulkan's minimum is 128); the
// engine's choice is unsplit 64 rows up to 128, and block_rows without the layout asked for
// keeps other tiles.
TEST(TilingTest, MatrixRowBlocksSplitWhereACallAsks) {
  auto matrix = [](uint32_t d, uint32_t rows, TileLayout layout, const DeviceInfo& info = kH100) {
    return matrix_rows(d, rows, 0, layout, info);
  };
  const TileLayout cm = TileLayout::cooperative_matrix;
  EXPECT_EQ(matrix(128, 0, cm).lanes, 1u);
  EXPECT_EQ(matrix(128, 64, cm).lanes, 1u);
  Spec split = matrix(128, 32, cm);
  EXPECT_EQ(split.layout, cm);
  EXPECT_EQ(split.lanes, 2u);
  EXPECT_GT(split.bc, 0u);
  EXPECT_EQ(matrix(256, 32, cm).lanes, 2u);
  EXPECT_NE(matrix(128, 32, TileLayout::automatic).layout, cm);
  EXPECT_EQ(matrix(128, 0, cm).block(), 64u);
  Spec wide = matrix(128, 128, cm);
  EXPECT_EQ(wide.lanes, 1u);
  EXPECT_EQ(wide.workgroup, 256u);
  EXPECT_EQ(wide.block(), 128u);
  // its queries through the K/V space 64 head dims at a time at 32 keys: K's 32 x 136 and V^T's
  // 128 x 40 fp16 (18.5 KiB), then 128 rows of scratch, FlashAttention's (two factors) 52 fp32
  EXPECT_EQ(wide.bc, 32u);
  EXPECT_EQ(detail::matrix_kernel_bytes(wide), 2u * (32 * 136 + 128 * 40) + 128 * 4 * 52 + 64);
  EXPECT_EQ(matrix(64, 128, cm).block(), 128u);
  DeviceInfo narrow = kH100;
  narrow.max_workgroup_invocations = 128;
  test::expect_refused([&] { matrix(128, 128, cm, narrow); },
                       "or 128 (256 invocations a workgroup; this device takes 128)");
  test::expect_refused([&] { matrix(256, 128, cm); }, "or 128 (256 invocations");
}

// group_rows 32 (two row matrices a group) where the call asks for the matrix layout: 4 groups
// of 32 rows (128 invocations) by default, 2 with block_rows 64; a softmax lane a row, so at
// most 32 keys a tile. Past d = 64 the queries stay in shared memory, 64 rows a workgroup, and
// the next tile's registers are halved: 16 keys at d = 128. Split (past d = 128, or block_rows
// 32) and without the layout asked for, refused by name.
TEST(TilingTest, MatrixGroupsTakeTwoRowMatricesWhereACallAsks) {
  auto matrix = [](uint32_t d, uint32_t group_rows, uint32_t rows, TileLayout layout) {
    return matrix_rows(d, rows, group_rows, layout);
  };
  const TileLayout cm = TileLayout::cooperative_matrix;
  EXPECT_EQ(matrix(64, 0, 0, cm).cm_row_matrices, 1u);
  EXPECT_EQ(matrix(64, 16, 0, cm).cm_row_matrices, 1u);
  Spec two = matrix(64, 32, 0, cm);
  EXPECT_EQ(two.layout, cm);
  EXPECT_EQ(two.cm_row_matrices, 2u);
  EXPECT_EQ(two.workgroup, 128u);
  EXPECT_EQ(two.block(), 128u);
  EXPECT_EQ(two.bc, 32u);
  // K's 32 x 72 and V^T's 64 x 40 fp16 (the queries pass 16 head dims at a time), then 128 rows
  // of scratch, FlashAttention's (two factors) 52 fp32
  EXPECT_EQ(detail::matrix_kernel_bytes(two), 2u * (32 * 72 + 64 * 40) + 128 * 4 * 52 + 64);
  Spec half = matrix(64, 32, 64, cm);
  EXPECT_EQ(half.workgroup, 64u);
  EXPECT_EQ(half.block(), 64u);
  EXPECT_EQ(matrix(64, 32, 128, cm).workgroup, 128u);
  EXPECT_FALSE(two.q_shared);
  Spec wide = matrix(128, 32, 0, cm);
  EXPECT_TRUE(wide.q_shared);
  EXPECT_EQ(wide.cm_row_matrices, 2u);
  EXPECT_EQ(wide.workgroup, 64u);
  EXPECT_EQ(wide.block(), 64u);
  EXPECT_EQ(wide.bc, 16u);
  // K's 16 x 136, V^T's 128 x 24 and the queries' 64 x 136 fp16, then 64 rows of scratch of 44
  EXPECT_EQ(detail::matrix_kernel_bytes(wide),
            2u * (16 * 136 + 128 * 24 + 64 * 136) + 64 * 4 * 44 + 64);
  test::expect_refused([&] { matrix(256, 32, 0, cm); }, "32 where d and dv are at most 128");
  // 5-bit V (a key of a fetched item three words) at d = 128: even 16 keys' next tile passes
  // the halved bound; the least tile is taken
  AttentionParams five_bit;
  five_bit.variant = Variant::flash2;
  five_bit.hints.tile_layout = cm;
  five_bit.hints.group_rows = 32;
  Spec q5 = detail::choose_tiling({.info = kH100,
                                   .matrix_api = MatrixApi::khr,
                                   .dims = dims(8, 8, 4096, 4096, 128, 128),
                                   .params = five_bit,
                                   .dtype = DType::f16,
                                   .kv = Storage(DType::f16, DType::q8_0, DType::q5_0)});
  EXPECT_EQ(q5.layout, cm);
  EXPECT_EQ(q5.bc, 16u);
  test::expect_refused([&] { matrix(64, 32, 32, cm); }, "takes group_rows 0, 16 or 32");
  test::expect_refused([&] { matrix(64, 32, 0, TileLayout::automatic); },
                       "applies to tile_layout cooperative_matrix");
}

TEST(TilingTest, CpuDriverTakesRegisterTiles) {
  Spec s = tiling(kCpu, dims(8, 8, 4096, 4096, 128, 128), Variant::flash2, DType::f32);
  EXPECT_EQ(s.layout, TileLayout::registers);
  EXPECT_EQ(s.bc, 8u);    // a key per lane
  EXPECT_EQ(s.rows, 4u);  // 512 / d rows an invocation, at most 4
  EXPECT_EQ(tiling(kCpu, dims(32, 8, 1, 16384, 128, 128), Variant::splitkv, DType::f16).layout,
            TileLayout::registers);  // lanes is a GPU layout
}

// Every register-block tiling the policy picks, over head dims, shared memory sizes, workgroup
// limits and with or without subgroup operations, fits the device; and none is refused that a
// smallest tile (4 rows, as few keys as the lanes allow) would fit.
TEST(TilingTest, RegisterBlocksAlwaysFitTheDevice) {
  int checked = 0;
  for (uint32_t shared : {16384u, 32768u, 49152u})
    for (uint32_t invocations : {128u, 256u, 1024u})
      for (bool shuffle : {false, true})
        for (uint32_t d = 4; d <= 256; d += 12)
          for (uint32_t dv : {d, 4u, 16u, 256u})
            for (bool f16 : {false, true}) {
              DeviceInfo info = device("sweep", "integrated", shared, invocations, shuffle ? 32 : 1,
                                       shuffle, false);
              SCOPED_TRACE(std::to_string(shared) + " bytes, " + std::to_string(invocations) +
                           " invocations, shuffle " + std::to_string(shuffle) +
                           ", d=" + std::to_string(d) + " dv=" + std::to_string(dv) +
                           (f16 ? ", fp16 arithmetic" : ""));
              Dims shape = dims(4, 2, 100, 100, d, dv);
              // The smallest tiling: 4 rows, and as few keys as the row group's lanes allow.
              uint64_t lanes = dv % 32 == 0 ? 8 : dv % 16 == 0 ? 4 : dv % 8 == 0 ? 2 : 1;
              uint64_t bc = std::max<uint64_t>(4, lanes);
              uint64_t element = f16 ? 2 : 4;
              uint64_t smallest =
                  // (a row group of at most 8 lanes is not a whole subgroup of 32: no shuffles)
                  element * (d * 4 + std::max(d, dv) * bc + bc * 4) + 8 + 4 * lanes;
              try {
                Spec s = tiling(info, shape, Variant::flash2, DType::f32, TileLayout::blocks, f16);
                EXPECT_EQ(s.block_f16, f16);
                ASSERT_TRUE(s.layout == TileLayout::blocks);
                EXPECT_LE(s.workgroup, invocations);
                EXPECT_EQ(s.block() % 4, 0u);
                EXPECT_EQ(s.bc % s.lanes, 0u);
                EXPECT_EQ(dv % (4 * s.lanes), 0u);  // whole float4s of output a lane
                uint64_t kv = s.v_at == 0 ? std::max(d, dv) : d + dv;
                EXPECT_EQ(4ull * s.kv_vec4, kv * s.bc);
                EXPECT_LE(block_footprint(s, d), shared);
                ++checked;
              } catch (const Error& e) {
                EXPECT_GT(smallest, shared)
                    << "refused although the smallest tile fits: " << e.what();
              }
            }
  EXPECT_GT(checked, 1000);
}

// The layouts the tests ask for by name (test_util's device_layouts: PagedTest, the extremes
// tests) are ones the device runs for that variant: asked for, each is given, never refused. On a
// device with matrix units PagedTest asked for cooperative_matrix for online too, which has no
// matrix kernel and is refused (issue 44, on an H200); this is that mistake caught on any
// machine. `automatic` picks the matrix units only for the variants that have them, in fp16 (the
// tiling is the same for paged K and V).
TEST(TilingTest, TheLayoutsTheTestsAskForAreOnesTheDeviceRuns) {
  std::vector<TileLayout> h100_online = test::device_layouts(kH100, Variant::online, 32, 32),
                          h100_flash2 = test::device_layouts(kH100, Variant::flash2, 32, 32);
  auto has = [](const std::vector<TileLayout>& l, TileLayout x) {
    return std::find(l.begin(), l.end(), x) != l.end();
  };
  EXPECT_FALSE(has(h100_online, TileLayout::cooperative_matrix));
  EXPECT_TRUE(has(h100_flash2, TileLayout::cooperative_matrix));
  // Without matrix units the matrix kernel is emulated, so CPU drivers run its logic: at d = 32
  // and 128, not where d is no multiple of 16; in Vulkan's minimum of shared memory (16 KiB)
  // FlashAttention-2's (12.8 KiB at 16 keys, d = 64) but not FLASH-D's (16.8 KiB: its rows
  // keep a second factor).
  EXPECT_TRUE(has(test::device_layouts(kCpu, Variant::flashd, 32, 32),
                  TileLayout::cooperative_matrix));
  EXPECT_TRUE(has(test::device_layouts(kCpu, Variant::splitkv, 128, 128),
                  TileLayout::cooperative_matrix));
  EXPECT_FALSE(has(test::device_layouts(kCpu, Variant::flash2, 24, 24),
                   TileLayout::cooperative_matrix));
  EXPECT_TRUE(
      has(test::device_layouts(kMinimum, Variant::flash2, 64, 64), TileLayout::cooperative_matrix));
  EXPECT_FALSE(
      has(test::device_layouts(kMinimum, Variant::flashd, 64, 64), TileLayout::cooperative_matrix));
  int checked = 0;
  for (const DeviceInfo* info : {&kH100, &kPhone, &kMinimum, &kCpu})
    for (Variant variant : all_variants())
      for (uint32_t d : {32u, 64u})
        for (uint32_t nq : {1u, 3u}) {  // PagedTest's decoding and its three queries
          Dims shape = dims(4, 2, nq, 70, d, d);
          SCOPED_TRACE(info->name + ", " + variant_name(variant) + ", d=" + std::to_string(d) +
                       ", nq=" + std::to_string(nq));
          for (TileLayout layout : test::device_layouts(*info, variant, d, d)) {
            DType dtype = layout == TileLayout::cooperative_matrix ? DType::f16 : DType::f32;
            try {  // as a context asks: the matrix kernel emulated where there are no units
              AttentionParams params;
              params.variant = variant;
              params.hints.tile_layout = layout;
              Spec s = detail::choose_tiling(
                  {.info = *info,
                   .matrix_api = test::matrix_api_of(*info),
                   .dims = shape,
                   .params = params,
                   .dtype = dtype,
                   .kv = Storage(dtype)});
              if (layout != TileLayout::automatic) {
                EXPECT_EQ(s.layout, layout);
              }
              ++checked;
            } catch (const Error& e) {
              ADD_FAILURE() << tile_layout_name(layout) << " refused: " << e.what();
            }
          }
          for (DType dtype : {DType::f32, DType::f16}) {  // a layout of the variant's own
            Spec s = tiling(*info, shape, variant, dtype);
            if (s.layout == TileLayout::cooperative_matrix) {
              EXPECT_TRUE(variant_info(variant).matrix && dtype == DType::f16);
            }
          }
        }
  EXPECT_GT(checked, 100);
}

// Issue 46: a kernel that uses subgroup operations is built for a subgroup size and its
// pipeline requires it with every subgroup full (Spec::required_subgroup), so its workgroup is
// whole subgroups of that size, within the subgroups a workgroup may have; the others require
// none. Over devices whose subgroups are 8 (a CPU driver), 16 (a phone), 32 (NVIDIA), 64
// (AMD's wave64) and 128 lanes (a Qualcomm-like GPU), prefill and decoding, fp32 and fp16,
// every layout the policy picks on its own and fp16 arithmetic's blocks.
TEST(TilingTest, SubgroupKernelsAreWholeSubgroupsOfTheSizeTheyRequire) {
  DeviceInfo amd = device("RDNA-like", "discrete", 64 * 1024, 1024, 64, true, false);
  DeviceInfo qualcomm = device("Adreno-like", "integrated", 32 * 1024, 1024, 128, true, false);
  for (DeviceInfo* info : {&amd, &qualcomm}) info->max_workgroup_subgroups = 16;
  int subgroup_kernels = 0, others = 0;
  DeviceInfo arc = device("Arc-A-like", "discrete", 64 * 1024, 1024, 8, true, true);
  arc.matrix_shape = kMatrixShapes[2];
  arc.min_subgroup_size = 8, arc.max_subgroup_size = 32;
  const DeviceInfo* infos[] = {&kH100, &kPhone, &kMinimum, &kCpu, &amd, &qualcomm, &arc};
  for (const DeviceInfo* info : infos)
    for (const Dims& shape : {dims(8, 2, 1000, 1000, 64, 64), dims(32, 8, 1, 4096, 128, 128),
                              dims(4, 4, 20, 20, 16, 16)})
      for (Variant variant : all_variants())
        for (DType dtype : {DType::f32, DType::f16})
          for (bool f16 : {false, true}) {
            if (f16 && (dtype == DType::f32 || !variant_info(variant).fused)) continue;
            Spec s = tiling(*info, shape, variant, dtype, TileLayout::automatic, f16);
            SCOPED_TRACE(info->name + ", " + variant_name(variant) + ", " + dtype_name(dtype) +
                         ", " + tile_layout_name(s.layout) + ", Nq=" + std::to_string(shape.nq));
            bool units = s.matrix == MatrixApi::khr || s.matrix == MatrixApi::nv;
            bool shuffles = s.layout == TileLayout::registers || s.layout == TileLayout::lanes ||
                            (s.layout == TileLayout::blocks && s.block_shuffle);
            const uint32_t required = s.required_subgroup(info->subgroup_size);
            uint32_t matrix = info->matrix_shape.m ? info->matrix_shape.subgroup : 32u;
            EXPECT_EQ(required, units ? matrix : shuffles ? info->subgroup_size : 0u);
            if (required == 0) {
              ++others;
              continue;
            }
            ++subgroup_kernels;
            EXPECT_TRUE(info->subgroup_shuffle);
            EXPECT_EQ(s.workgroup % required, 0u) << s.workgroup;
            if (info->max_workgroup_subgroups) {
              EXPECT_LE(s.workgroup / required, info->max_workgroup_subgroups);
            }
            if (s.layout == TileLayout::lanes) {
              EXPECT_EQ(s.subgroup, info->subgroup_size);
            }
          }
  EXPECT_GT(subgroup_kernels, 50);
  EXPECT_GT(others, 50);
  // A pass derived from the kernel's Spec (mask_mod's tile bitmap, 32 invocations, no subgroup
  // operations) requires nothing of the kernel's subgroups: at wave64 32 invocations are not
  // whole subgroups (a validation error, found by a read of the diff).
  Spec blocks = tiling(amd, dims(8, 2, 1000, 1000, 64, 64), Variant::flash2, DType::f32);
  ASSERT_EQ(blocks.required_subgroup(64), 64u);
  EXPECT_EQ(detail::flex_tiles_spec(blocks).required_subgroup(64), 0u);
}

// A per-key trace (Bc = 1, shared tiles) of a few rows, as the viewer's one-row call, runs in a
// workgroup no larger than the rows or a subgroup, whichever is larger (llvmpipe ran 63 idle
// rows under a mask: 0.4 s a trace of 16384 keys); longer trace tiles and calls keep 64.
TEST(TilingTest, PerKeyTracesOfFewRowsRunSmallWorkgroups) {
  auto traced = [](const DeviceInfo& info, uint32_t heads, uint32_t nq, uint32_t keys) {
    AttentionParams params;
    params.variant = Variant::flash2;
    Dims shape = dims(heads, 1, nq, 16384, 64, 64);
    return detail::choose_tiling({.info = info,
                                  .dims = shape,
                                  .params = params,
                                  .kv = Storage(DType::f32),
                                  .forced_keys = keys,
                                  .trace = true});
  };
  Spec one = traced(kCpu, 1, 1, 1);
  EXPECT_EQ(one.layout, TileLayout::shared);
  EXPECT_EQ(one.bc, 1u);
  EXPECT_EQ(one.workgroup, 8u);                     // llvmpipe's subgroup
  EXPECT_EQ(traced(kH100, 1, 1, 1).workgroup, 32u);   // a warp
  EXPECT_EQ(traced(kCpu, 2, 5, 1).workgroup, 16u);    // 10 rows
  EXPECT_EQ(traced(kCpu, 1, 300, 1).workgroup, 64u);  // many rows
  EXPECT_EQ(traced(kCpu, 1, 1, 63).workgroup, 64u);   // a tile of 63 keys
}

}  // namespace
}  // namespace flashvk
