// Storage types for K and V (bf16, q8_0, q4_0, or other than Q's): the host encodings against
// closed-form blocks and ggml's byte layout, and every variant and tile layout against the
// float64 reference computed on the values the device holds (stored_values), so that the
// comparison isolates the kernels from the storage's rounding.
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "test_util.hpp"

namespace flashvk::test {
namespace {

HostTensor block_of(std::vector<float> values) {
  int64_t n = int64_t(values.size());
  return HostTensor({1, n}, std::move(values));
}

TEST(StorageTest, Q8_0BlocksScaleByTheLargestMagnitudeOver127) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float(j - 16) * 0.5f;  // largest |x|: 8 -> d = 8/127
  std::vector<uint8_t> bytes = encode(x, DType::q8_0);
  ASSERT_EQ(bytes.size(), 34u);  // 32 quants, then the block's fp16 scale
  uint16_t d_bits;
  std::memcpy(&d_bits, bytes.data() + 32, 2);
  EXPECT_EQ(d_bits, float_to_half(8.0f / 127.0f));
  for (int j = 0; j < 32; ++j)
    EXPECT_EQ(int8_t(bytes[j]), int(std::lround(x[j] * 127.0f / 8.0f))) << j;
  HostTensor back = stored_values(block_of(x), DType::q8_0);
  for (int j = 0; j < 32; ++j)
    EXPECT_NEAR(back.data[j], x[j], 0.5 * 8.0 / 127.0 + 1e-3) << j;  // half a step (+ fp16 d)
}

TEST(StorageTest, Q4_0BlocksPackValuesJAndJPlus16IntoByteJ) {
  // Integers in [-8, 7] with -8 the largest magnitude: d = -8 / -8 = 1, so q = x + 8 exactly.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float((j * 5) % 16 - 8);
  x[3] = -8.0f;
  std::vector<uint8_t> bytes = encode(x, DType::q4_0);
  ASSERT_EQ(bytes.size(), 18u);  // 16 bytes of nibbles, then the scale
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(bytes[j] & 15, int(x[j]) + 8) << j;
    EXPECT_EQ(bytes[j] >> 4, int(x[j + 16]) + 8) << j;
  }
  uint16_t d_bits;
  std::memcpy(&d_bits, bytes.data() + 16, 2);
  EXPECT_EQ(half_to_float(d_bits), 1.0f);
  EXPECT_EQ(stored_values(block_of(x), DType::q4_0).data, x);
}

TEST(StorageTest, Bf16RoundsToNearestEven) {
  // bf16 keeps 8 significant bits: 1 + 2^-8 is halfway between 1 and 1 + 2^-7 (rounds to even,
  // 1); 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6 (rounds to even, 1 + 2^-6).
  HostTensor x = block_of({1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                           1.0f + std::ldexp(1.0f, -9), -2.5f});
  HostTensor b = stored_values(x, DType::bf16);
  EXPECT_EQ(b.data, (std::vector<float>{1.0f, 1.0f + std::ldexp(1.0f, -6), 1.0f, -2.5f}));
}

TEST(StorageTest, Q4_0ClampsThePositiveExtremeAndKeepsZeroBlocks) {
  // The largest magnitude positive: d = 4 / -8 = -0.5, so 4 maps to q = 4 / -0.5 + 8 = 0 and
  // -3.5 to 15; -4 would be 16 and is clamped to 15 (-3.5).
  std::vector<float> x(32, 0.0f);
  x[0] = 4.0f, x[1] = -3.5f, x[2] = -3.75f;
  HostTensor back = stored_values(block_of(x), DType::q4_0);
  EXPECT_EQ(back.data[0], 4.0f);
  EXPECT_EQ(back.data[1], -3.5f);
  EXPECT_EQ(back.data[2], -3.5f);  // -3.75 / -0.5 + 8.5 = 16.0: clamped to 15
  EXPECT_EQ(back.data[5], 0.0f);
  EXPECT_EQ(stored_values(HostTensor({1, 32}), DType::q4_0).data, std::vector<float>(32, 0.0f));
  EXPECT_EQ(stored_values(HostTensor({1, 32}), DType::q8_0).data, std::vector<float>(32, 0.0f));
  std::vector<float> bad(32, 1.0f);
  bad[7] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(encode(bad, DType::q8_0), Error);
}

// The head of block b of `blocks`: its 16-bit halves (d, m, qh's two halves), which follow every
// block's quants.
std::vector<uint16_t> head_of(const std::vector<uint8_t>& bytes, uint64_t blocks, uint64_t b,
                              uint32_t halves) {
  std::vector<uint16_t> h(halves);
  std::memcpy(h.data(), bytes.data() + bytes.size() - 2 * halves * (blocks - b), 2 * halves);
  return h;
}

TEST(StorageTest, Q4_1BlocksStoreTheirMinimumAndSteps) {
  // 1 + 0.5 k, k = j % 16: the minimum 1, the range 7.5 over 15 steps: d = 0.5 and q = k exactly.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = 1.0f + 0.5f * float((j * 7) % 16);
  std::vector<uint8_t> bytes = encode(x, DType::q4_1);
  ASSERT_EQ(bytes.size(), 16u + 4u);  // 16 bytes of nibbles, then d and m
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(bytes[j] & 15, (j * 7) % 16) << j;
    EXPECT_EQ(bytes[j] >> 4, ((j + 16) * 7) % 16) << j;
  }
  std::vector<uint16_t> h = head_of(bytes, 1, 0, 2);
  EXPECT_EQ(half_to_float(h[0]), 0.5f);
  EXPECT_EQ(half_to_float(h[1]), 1.0f);
  EXPECT_EQ(stored_values(block_of(x), DType::q4_1).data, x);
  // A block all one value: d = 0, every value is m.
  EXPECT_EQ(stored_values(block_of(std::vector<float>(32, -2.5f)), DType::q4_1).data,
            std::vector<float>(32, -2.5f));
}

TEST(StorageTest, Q5BlocksKeepTheirFifthBitsInQh) {
  // q5_0: integers in [-16, 15], -16 the largest magnitude: d = 1, q = x + 16, whose fifth bit
  // (x >= 0) goes to bit j of qh.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = float((j * 11) % 32 - 16);
  std::vector<uint8_t> bytes = encode(x, DType::q5_0);
  ASSERT_EQ(bytes.size(), 16u + 8u);  // nibbles, then d, m (0) and qh
  uint32_t want_qh = 0;
  for (int j = 0; j < 32; ++j) {
    int q = int(x[j]) + 16;
    EXPECT_EQ(j < 16 ? bytes[j] & 15 : bytes[j - 16] >> 4, q & 15) << j;
    want_qh |= uint32_t(q >> 4) << j;
  }
  std::vector<uint16_t> h = head_of(bytes, 1, 0, 4);
  EXPECT_EQ(half_to_float(h[0]), 1.0f);
  EXPECT_EQ(h[1], 0u);
  EXPECT_EQ(uint32_t(h[2]) | uint32_t(h[3]) << 16, want_qh);
  EXPECT_EQ(stored_values(block_of(x), DType::q5_0).data, x);
  // q5_1: -2 + 0.25 j: m = -2, d = 7.75 / 31 = 0.25, q = j: qh holds the upper 16 values' bits.
  for (int j = 0; j < 32; ++j) x[j] = -2.0f + 0.25f * float(j);
  bytes = encode(x, DType::q5_1);
  h = head_of(bytes, 1, 0, 4);
  EXPECT_EQ(half_to_float(h[0]), 0.25f);
  EXPECT_EQ(half_to_float(h[1]), -2.0f);
  EXPECT_EQ(uint32_t(h[2]) | uint32_t(h[3]) << 16, 0xffff0000u);
  EXPECT_EQ(stored_values(block_of(x), DType::q5_1).data, x);
}

TEST(StorageTest, Iq4NlPicksTheNearestOfItsSixteenLevels) {
  // 0.01 times ggml's levels, -1.27 the largest magnitude: x / (-1.27 / -127) is each level
  // exactly, so the indices are k, and the least-squares scale is 0.01 (in fp16).
  const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = 0.01f * float(levels[(j * 5) % 16]);
  std::vector<uint8_t> bytes = encode(x, DType::iq4_nl);
  ASSERT_EQ(bytes.size(), 16u + 2u);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(bytes[j] & 15, (j * 5) % 16) << j;
    EXPECT_EQ(bytes[j] >> 4, ((j + 16) * 5) % 16) << j;
  }
  float d = half_to_float(head_of(bytes, 1, 0, 1)[0]);
  EXPECT_EQ(d, half_to_float(float_to_half(0.01f)));
  std::vector<float> back = stored_values(block_of(x), DType::iq4_nl).data;
  for (int j = 0; j < 32; ++j) EXPECT_EQ(back[j], d * float(levels[(j * 5) % 16])) << j;
  // Between two levels, the nearer: 0.5 of the way from 1 to 13 and past it.
  x.assign(32, 0.0f);
  x[0] = -1.27f, x[1] = 0.0699f, x[2] = 0.0701f;  // levels 1 and 13: halfway is 0.07
  bytes = encode(x, DType::iq4_nl);
  EXPECT_EQ(bytes[1] & 15, 8);
  EXPECT_EQ(bytes[2] & 15, 9);
}

// Random blocks come back within half a quant step (and the fp16 rounding of d and m), or a whole
// step where the quants are capped (the end opposite the largest magnitude of q4_0 and q5_0) or
// the scale is fitted after the levels are chosen (iq4_nl).
TEST(StorageTest, EveryBlockFormatComesBackWithinItsStep) {
  HostTensor x = random_tensor({16, 64}, 17);
  for (DType dtype : dtypes()) {
    if (!dtype_quantised(dtype)) continue;
    HostTensor back = stored_values(x, dtype);
    ASSERT_EQ(back.data.size(), x.data.size()) << dtype_name(dtype);
    for (size_t b = 0; b < x.data.size() / 32; ++b) {
      float lo = x.data[b * 32], hi = lo, amax = 0;
      for (size_t j = b * 32; j < b * 32 + 32; ++j)
        lo = std::min(lo, x.data[j]), hi = std::max(hi, x.data[j]),
        amax = std::max(amax, std::abs(x.data[j]));
      float step = dtype == DType::q8_0   ? amax / 127
                   : dtype == DType::q4_0 ? amax / 8
                   : dtype == DType::q5_0 ? amax / 16
                   : dtype == DType::q4_1 ? (hi - lo) / 15
                   : dtype == DType::q5_1 ? (hi - lo) / 31
                                          : amax * 24 / 127;  // iq4_nl: its widest gap
      bool rounded = dtype == DType::q8_0 || dtype == DType::q4_1 || dtype == DType::q5_1;
      for (size_t j = b * 32; j < b * 32 + 32; ++j)
        EXPECT_LE(std::abs(back.data[j] - x.data[j]), (rounded ? 0.5f : 1.0f) * step + 2e-3f * amax)
            << dtype_name(dtype) << " value " << j;
    }
  }
}

TEST(StorageTest, BlockFormatsNeedALastDimensionOf32s) {
  EXPECT_THROW(stored_values(HostTensor({2, 48}), DType::q8_0), Error);
  EXPECT_EQ(storage_bytes(DType::q4_0, 64), 32u + 4u);
  EXPECT_EQ(buffer_bytes(DType::q4_0, 64), 48u);  // 16-byte texels
  EXPECT_EQ(buffer_bytes(DType::q8_0, 32), 48u);
  EXPECT_EQ(buffer_bytes(DType::f16, 3), 8u);  // whole words
  EXPECT_EQ(storage_bytes(DType::q4_1, 64), 32u + 8u);   // d and m a block
  EXPECT_EQ(storage_bytes(DType::q5_0, 64), 32u + 16u);  // d, m and qh a block
  EXPECT_EQ(storage_bytes(DType::q5_1, 64), 32u + 16u);
  EXPECT_EQ(storage_bytes(DType::iq4_nl, 64), 32u + 4u);
  EXPECT_EQ(buffer_bytes(DType::q5_1, 32), 32u);
  EXPECT_EQ(parse_dtype("q4_0"), DType::q4_0);
  EXPECT_EQ(parse_dtype("iq4_nl"), DType::iq4_nl);
  EXPECT_THROW(parse_dtype("q6_k"), Error);
}

// ggml's block structs, written out here from ggml's own definitions (ggml-common.h) rather
// than from the engine's table: each block its fp16 d, then m (q4_1, q5_1), then the fifth bits
// qh as 4 bytes (q5_0, q5_1), then its quants qs; and ggml's dequantize_row_* of them. Blocks of
// random fields (every bit pattern of the quants, scales of both signs) are a cache ggml could
// have written.
struct GgmlLayout {
  DType dtype;
  bool has_m, has_qh;
  uint32_t quant_bytes;
};
constexpr GgmlLayout kGgmlLayouts[] = {
    {DType::q8_0, false, false, 32}, {DType::q4_0, false, false, 16},
    {DType::q4_1, true, false, 16},  {DType::q5_0, false, true, 16},
    {DType::q5_1, true, true, 16},   {DType::iq4_nl, false, false, 16},
};
constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};  // kvalues_iq4nl

uint16_t half_bits(float x) {
  std::vector<uint8_t> b = encode({x}, DType::f16);
  return uint16_t(b[0] | b[1] << 8);
}
float half_value(uint16_t bits) {
  return decode({uint8_t(bits & 0xff), uint8_t(bits >> 8)}, DType::f16, 1)[0];
}

// `blocks` random blocks in ggml's layout, and ggml's dequantisation of them.
std::pair<std::vector<uint8_t>, std::vector<float>> ggml_blocks(const GgmlLayout& g, int blocks,
                                                                uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  std::vector<uint8_t> bytes;
  std::vector<float> values;
  for (int b = 0; b < blocks; ++b) {
    uint16_t d = half_bits(scale(rng)), m = half_bits(scale(rng) * 10.0f);
    uint32_t qh = uint32_t(rng());
    uint8_t qs[32];
    for (uint32_t j = 0; j < g.quant_bytes; ++j) qs[j] = uint8_t(rng());
    auto put16 = [&](uint16_t x) { bytes.push_back(uint8_t(x & 0xff)), bytes.push_back(uint8_t(x >> 8)); };
    put16(d);
    if (g.has_m) put16(m);
    if (g.has_qh)
      for (int i = 0; i < 4; ++i) bytes.push_back(uint8_t(qh >> (8 * i)));  // memcpy'd by ggml
    bytes.insert(bytes.end(), qs, qs + g.quant_bytes);
    float df = half_value(d), mf = half_value(m);
    float y[32];
    for (int j = 0; j < 16; ++j) {
      int lo = qs[j] & 0x0f, hi = qs[j] >> 4;
      int xh0 = int(((qh >> j) << 4) & 0x10), xh1 = int((qh >> (j + 12)) & 0x10);
      switch (g.dtype) {
        case DType::q8_0:
          y[j] = df * float(int8_t(qs[j]));
          y[j + 16] = df * float(int8_t(qs[j + 16]));
          break;
        case DType::q4_0: y[j] = float(lo - 8) * df, y[j + 16] = float(hi - 8) * df; break;
        case DType::q4_1: y[j] = float(lo) * df + mf, y[j + 16] = float(hi) * df + mf; break;
        case DType::q5_0:
          y[j] = float((lo | xh0) - 16) * df, y[j + 16] = float((hi | xh1) - 16) * df;
          break;
        case DType::q5_1:
          y[j] = float(lo | xh0) * df + mf, y[j + 16] = float(hi | xh1) * df + mf;
          break;
        default: y[j] = df * float(kIq4nl[lo]), y[j + 16] = df * float(kIq4nl[hi]); break;
      }
    }
    values.insert(values.end(), y, y + 32);
  }
  return {bytes, values};
}

// Issue 42: a cache ggml wrote reads the same. ggml's blocks converted into the engine's storage
// decode to ggml's own dequantisation, exactly, and convert back bit for bit; sizes that are not
// whole blocks are refused by name.
TEST(StorageTest, GgmlsBlocksReadAsGgmlDequantisesThem) {
  for (const GgmlLayout& g : kGgmlLayouts) {
    SCOPED_TRACE(dtype_name(g.dtype));
    auto [blocks, values] = ggml_blocks(g, 5, 40 + uint32_t(g.dtype));
    EXPECT_EQ(blocks.size(), ggml_bytes(g.dtype, 160));
    std::vector<uint8_t> ours = from_ggml_blocks(blocks, g.dtype, 160);
    std::vector<float> got = decode(ours, g.dtype, 160);
    for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(got[i], values[i]) << "value " << i;
    EXPECT_EQ(to_ggml_blocks(ours, g.dtype, 160), blocks);
    // The engine's own quantisation, in ggml's layout, reads back the same.
    HostTensor x = random_tensor({160}, 41);
    std::vector<uint8_t> encoded = encode(x.data, g.dtype);
    EXPECT_EQ(from_ggml_blocks(to_ggml_blocks(encoded, g.dtype, 160), g.dtype, 160), encoded);
    blocks.pop_back();
    expect_refused([&] { from_ggml_blocks(blocks, g.dtype, 160); }, "do not hold 160 values");
  }
  std::vector<uint8_t> halves = encode({1.0f, 2.0f}, DType::f16);
  EXPECT_EQ(from_ggml_blocks(halves, DType::f16, 2), halves);  // element formats as they are
}

class StorageDeviceTest : public VulkanTest {};

// A KV cache ggml wrote, K and V in its block formats, uploaded as they are
// (Tensor::write_storage of from_ggml_blocks) and attended: the float64 reference on ggml's own
// dequantisation of them.
TEST_F(StorageDeviceTest, AttentionOverACacheGgmlWrote) {
  HostTensor q = random_tensor({1, 4, 3, 64}, 42);
  AttentionParams params;
  params.variant = Variant::flash2;
  params.mods.causal = true;
  for (const GgmlLayout& g : kGgmlLayouts) {
    SCOPED_TRACE(dtype_name(g.dtype));
    auto [k_blocks, k_values] = ggml_blocks(g, 2 * 40 * 2, 50 + uint32_t(g.dtype));
    auto [v_blocks, v_values] = ggml_blocks(g, 2 * 40 * 2, 60 + uint32_t(g.dtype));
    Tensor k(context(), {1, 2, 40, 64}, g.dtype), v(context(), {1, 2, 40, 64}, g.dtype);
    k.write_storage(from_ggml_blocks(k_blocks, g.dtype, 2 * 40 * 64));
    v.write_storage(from_ggml_blocks(v_blocks, g.dtype, 2 * 40 * 64));
    Tensor tq = Tensor::upload(context(), q, DType::f32);
    HostTensor kh({1, 2, 40, 64}, k_values), vh({1, 2, 40, 64}, v_values);
    EXPECT_EQ(k.download().data, k_values);
    AttentionResult r = attention(context(), tq, k, v, params);
    EXPECT_LE(max_error(r.out.download().data, reference::direct(q, kh, vh, params).out),
              tolerance(q, kh, vh, params));
  }
  Tensor k(context(), {1, 1, 2, 32}, DType::q4_0);
  expect_refused([&] { k.write_storage(std::vector<uint8_t>(10)); }, "which takes 36");
}

TEST_F(StorageDeviceTest, UploadThenDownloadGivesTheStoredValues) {
  HostTensor x = random_tensor({2, 3, 64}, 3);
  for (DType dtype : dtypes()) {
    HostTensor back = Tensor::upload(context(), x, dtype).download();
    EXPECT_EQ(back.data, stored_values(x, dtype).data) << dtype_name(dtype);
  }
  try {
    Tensor::upload(context(), random_tensor({4, 40}, 4), DType::q4_0);
    ADD_FAILURE() << "a last dimension of 40 was stored as q4_0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks of 32"), std::string::npos) << e.what();
  }
  // The host-tensor calls say which of Q, K and V could not be stored.
  HostTensor q = random_tensor({1, 1, 2, 40}, 5), k = random_tensor({1, 1, 3, 40}, 6);
  try {
    attention(context(), q, k, k, {}, {DType::f32, DType::f32, DType::q4_0});
    ADD_FAILURE() << "V of last dimension 40 was stored as q4_0";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("V: q4_0 stores blocks of 32", 0), 0u) << e.what();
  }
}

// Q, K and V storage as models keep them: bf16 or quantised K and V under fp32 or fp16 Q, and
// K and V in different types; every storage format in every variant (K and V decode alike).
const Storage kStorages[] = {
    {DType::f32, DType::bf16, DType::bf16}, {DType::f32, DType::q8_0, DType::q8_0},
    {DType::f32, DType::q4_1, DType::q5_0}, {DType::f16, DType::q5_1, DType::iq4_nl},
    {DType::f16, DType::q4_0, DType::bf16}, {DType::f32, DType::f16, DType::f32},
};

class StorageVariantTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {};

TEST_P(StorageVariantTest, MatchesTheReferenceOnTheStoredValues) {
  Variant variant = GetParam();
  const DeviceInfo& info = context().device();
  HostTensor q = random_tensor({2, 4, 37, 64}, 31), k = random_tensor({2, 2, 75, 64}, 32),
             v = random_tensor({2, 2, 75, 32}, 33);
  AttentionParams params;
  params.variant = variant;
  params.mods.causal = true;
  params.mods.window_left = 40;
  std::vector<TileLayout> layouts = {TileLayout::automatic, TileLayout::shared};
  if (variant_info(variant).fused && info.subgroup_shuffle && info.texel_buffers)
    layouts.push_back(TileLayout::registers);
  for (const Storage& storage : kStorages) {
    bool f16 = storage.q == DType::f16 || storage.k == DType::f16 || storage.v == DType::f16;
    if (f16 && !info.fp16_storage) continue;
    HostTensor qs = stored_values(q, storage.q), ks = stored_values(k, storage.k),
               vs = stored_values(v, storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    for (TileLayout layout : layouts) {
      params.hints.tile_layout = layout;
      HostAttentionResult gpu = attention(context(), q, k, v, params, storage);
      std::string what = storage_name(storage) + ", " + tile_layout_name(gpu.tile_layout);
      if (layout != TileLayout::automatic) {
        EXPECT_EQ(gpu.tile_layout, layout) << what;
      }
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(qs, ks, vs, params)) << what;
      EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5) << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, StorageVariantTest, ::testing::ValuesIn(all_variants()),
                         variant_param_name);

// An odd number of q8_0 blocks (34 bytes each) or of halves ends a tensor mid-word: the kernels
// read K and V as 32-bit words (register tiles q8_0 and q4_0 as 16-byte texels), so tensors are
// whole words (16 bytes) and the last value reads right.
TEST_F(StorageDeviceTest, TensorsEndingMidWordReadTheirLastValue) {
  HostTensor q = random_tensor({1, 1, 3, 32}, 51), k = random_tensor({1, 1, 3, 32}, 52),
             v = random_tensor({1, 1, 3, 32}, 53);
  HostTensor q3 = random_tensor({1, 1, 2, 3}, 54), k3 = random_tensor({1, 1, 3, 3}, 55);
  AttentionParams params;
  std::vector<TileLayout> layouts = {TileLayout::shared};
  if (context().device().subgroup_shuffle && context().device().texel_buffers)
    layouts.push_back(TileLayout::registers);
  for (TileLayout layout : layouts) {
    params.hints.tile_layout = layout;
    for (DType dtype : {DType::q8_0, DType::q4_0}) {
      HostTensor ks = stored_values(k, dtype), vs = stored_values(v, dtype);
      reference::Result ref = reference::direct(q, ks, vs, params);
      HostAttentionResult gpu = attention(context(), q, k, v, params, {DType::f32, dtype, dtype});
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, ks, vs, params))
          << dtype_name(dtype) << " " << tile_layout_name(layout);
    }
  }
  if (!context().device().fp16_storage) return;
  params.hints.tile_layout = TileLayout::shared;  // d = 3: no register tiles
  HostTensor ks = stored_values(k3, DType::f16);
  reference::Result ref = reference::direct(q3, ks, ks, params);
  HostAttentionResult gpu =
      attention(context(), q3, k3, k3, params, {DType::f32, DType::f16, DType::f16});
  EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q3, ks, ks, params));
}

// Register tiles fetch a q8_0 or q4_0 block's sixteen values at once, the lanes holding runs of
// four texels: head dimensions whose rows the lanes cover exactly (d = 128 at 8 lanes), partly
// (lanes past the row read zeros) or over several runs each, K and V of different widths.
TEST_F(StorageDeviceTest, RegisterTilesFetchBlocksAtEveryHeadDimension) {
  const DeviceInfo& info = context().device();
  if (!info.subgroup_shuffle || !info.texel_buffers) GTEST_SKIP() << "no register tiles here";
  AttentionParams params;
  params.hints.tile_layout = TileLayout::registers;
  params.mods.causal = true;
  const std::pair<int64_t, int64_t> dims[] = {{32, 32}, {96, 160}, {128, 128}, {256, 64}};
  int seed = 60;
  for (auto [d, dv] : dims) {
    HostTensor q = random_tensor({1, 4, 9, d}, ++seed), k = random_tensor({1, 2, 19, d}, ++seed),
               v = random_tensor({1, 2, 19, dv}, ++seed);
    for (Storage storage : {Storage{DType::f32, DType::q8_0, DType::q4_0},
                            Storage{DType::f32, DType::q4_0, DType::q8_0}}) {
      HostTensor ks = stored_values(k, storage.k), vs = stored_values(v, storage.v);
      reference::Result ref = reference::direct(q, ks, vs, params);
      HostAttentionResult gpu = attention(context(), q, k, v, params, storage);
      std::string what =
          storage_name(storage) + " d=" + std::to_string(d) + " dv=" + std::to_string(dv);
      EXPECT_EQ(gpu.tile_layout, TileLayout::registers) << what;
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, ks, vs, params)) << what;
      EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5) << what;
    }
  }
}

// The decoding kernel for GPUs (TileLayout::lanes) reads K and V in every storage format, 16
// bytes a load (16 q8_0 or 32 q4_0 quants and their block's scale), forced here on every device
// with subgroup shuffles: GQA decode and a few rows, causal with a key mask, K and V of different
// formats and widths, against float64 on the stored values; a head dim that is not a whole
// number of loads is refused by name.
TEST_F(StorageDeviceTest, LanesReadEveryStorageFormat) {
  if (!context().device().subgroup_shuffle) GTEST_SKIP() << "no subgroup shuffles: no lanes";
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.tile_layout = TileLayout::lanes;
  params.mods.causal = true;
  const Storage storages[] = {{DType::f32, DType::q8_0, DType::q8_0},
                              {DType::f32, DType::q4_0, DType::q4_0},
                              {DType::f32, DType::bf16, DType::q4_0},
                              {DType::f16, DType::q8_0, DType::f16},
                              {DType::f16, DType::f32, DType::q8_0}};
  struct Case {
    uint32_t heads, kv_heads, nq, nk, d, dv;
  };
  // One key a step and two rows a workgroup: llvmpipe takes seconds to build each of these
  // unrolled pipelines (minutes under sanitizers).
  params.hints.block_keys = 1;
  struct Run {
    Case c;
    Storage storage;
    HostTensor q, k, v;
    AttentionParams params;
    HostAttentionResult gpu;
    std::vector<std::string> messages;
    std::string error;
  };
  std::vector<Run> runs;
  for (Case c : {Case{4, 2, 1, 150, 64, 96}, Case{2, 2, 2, 77, 128, 32}}) {
    HostTensor q = random_tensor({1, c.heads, c.nq, c.d}, 71 + c.d),
               k = random_tensor({1, c.kv_heads, c.nk, c.d}, 72 + c.d),
               v = random_tensor({1, c.kv_heads, c.nk, c.dv}, 73 + c.d);
    params.mods.key_mask.assign(c.nk, 1);
    for (uint32_t j = 2; j < c.nk; j += 9) params.mods.key_mask[j] = 0;
    for (const Storage& storage : storages) {
      if (storage.q == DType::f16 && !context().device().fp16_storage) continue;
      if (c.d == 128 && storage.k != DType::q4_0) continue;  // q4_0 K: a row of 128 in 4 loads
      runs.push_back({c, storage, q, k, v, params, {}, {}, {}});
    }
  }
  // Each call on a context of its own, all at once: building the six pipelines is most of this
  // test's time (about 5 s each in NVIDIA's compiler), and a context builds one at a time.
  std::vector<std::thread> threads;
  for (Run& r : runs)
    threads.emplace_back([&r] {
      try {
        Context ctx = Context::create(test_options());
        r.gpu = attention(ctx, r.q, r.k, r.v, r.params, r.storage);
        r.messages = ctx.take_validation_messages();
      } catch (const std::exception& e) {
        r.error = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const Run& r : runs) {
    std::string what = storage_name(r.storage) + " d=" + std::to_string(r.c.d) +
                       " dv=" + std::to_string(r.c.dv);
    ASSERT_EQ(r.error, "") << what;
    for (const std::string& m : r.messages) ADD_FAILURE() << what << ": " << m;
    HostTensor qs = stored_values(r.q, r.storage.q), ks = stored_values(r.k, r.storage.k),
               vs = stored_values(r.v, r.storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, r.params);
    EXPECT_EQ(r.gpu.tile_layout, TileLayout::lanes) << what;
    EXPECT_LE(max_error(r.gpu.out.data, ref.out), tolerance(qs, ks, vs, r.params)) << what;
    EXPECT_LE(max_lse_error(r.gpu.lse.data, ref.lse), 1e-5) << what;
  }
  params.mods.key_mask.clear();
  HostTensor q = random_tensor({1, 1, 1, 20}, 80), k = random_tensor({1, 1, 9, 20}, 81);
  try {  // bf16: 8 values a load
    attention(context(), q, k, k, params, {DType::f32, DType::bf16, DType::bf16});
    ADD_FAILURE() << "d = 20 in bf16 with lanes was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("d a multiple of 8"), std::string::npos) << e.what();
  }
}

// q4_1, q5_0, q5_1 and iq4_nl (a minimum, fifth bits, non-linear levels) in the layouts that
// StorageVariantTest does not run: register blocks, and splitkv's decoding lanes (32 quants a
// load, the head applied once a load). K and V in different formats and widths, GQA, causal,
// against float64 on the values stored.
TEST_F(StorageDeviceTest, BlockFormatsInRegisterBlocksAndLanes) {
  const DeviceInfo& info = context().device();
  const Storage a{DType::f32, DType::q4_1, DType::q5_0},
      b{info.fp16_storage ? DType::f16 : DType::f32, DType::q5_1, DType::iq4_nl};
  struct Run {
    Variant variant;
    TileLayout layout;
    Storage storage;
  };
  std::vector<Run> runs = {{Variant::flash2, TileLayout::blocks, a},
                           {Variant::flashd, TileLayout::blocks, b}};
  if (info.subgroup_shuffle)
    for (const Storage& s : {a, b}) runs.push_back({Variant::splitkv, TileLayout::lanes, s});
  HostTensor q = random_tensor({1, 4, 3, 32}, 91), k = random_tensor({1, 2, 70, 32}, 92),
             v = random_tensor({1, 2, 70, 64}, 93);
  for (const Run& r : runs) {
    AttentionParams params;
    params.variant = r.variant;
    params.mods.causal = true;
    params.hints.tile_layout = r.layout;
    // One key a step in the lanes: llvmpipe builds their unrolled pipelines faster.
    params.hints.block_keys = r.layout == TileLayout::lanes ? 1 : 0;
    HostTensor qs = stored_values(q, r.storage.q), ks = stored_values(k, r.storage.k),
               vs = stored_values(v, r.storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    HostAttentionResult gpu = attention(context(), q, k, v, params, r.storage);
    std::string what = std::string(variant_name(r.variant)) + ", " + storage_name(r.storage) +
                       ", " + tile_layout_name(r.layout);
    if (r.layout != TileLayout::automatic) {
      EXPECT_EQ(gpu.tile_layout, r.layout) << what;
    }
    EXPECT_LE(max_error(gpu.out.data, ref.out),
              tolerance(qs, ks, vs, params) + weight_rounding(gpu, vs))
        << what;
    EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 1e-5) << what;
  }
}

// The matrix-unit kernels read K and V in fp16 or a block format beside fp16 Q (decoded as their
// tiles are staged: MatrixTest.BlockFormatsAreDecodedAsTilesAreStaged); asked for with other
// storage they refuse by name (automatic picks another layout), as RoPE does for K.
TEST_F(StorageDeviceTest, MatrixUnitsAndRopeThatNeedQsStorageRefuseByName) {
  HostTensor q = random_tensor({1, 2, 1, 64}, 41), k = random_tensor({1, 2, 40, 64}, 42);
  AttentionParams params;
  params.variant = Variant::splitkv;
  Storage q8{DType::f32, DType::q8_0, DType::q8_0};
  auto refused = [&](const char* words) {
    try {
      attention(context(), q, k, k, params, q8);
      ADD_FAILURE() << "not refused: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  params.hints.tile_layout = TileLayout::cooperative_matrix;
  if (context().handles().matrix_api != MatrixApi::none) {  // (else: "needs matrix units")
    refused("on fp16 Q, K and V in fp16 or a block format");  // Q in f32
    q8 = {DType::f16, DType::q8_0, DType::bf16};              // V in bf16
    refused("on fp16 Q, K and V in fp16 or a block format");
    q8 = {DType::f32, DType::q8_0, DType::q8_0};
  }
  params.hints.tile_layout = TileLayout::automatic;
  params.rope = RopeLayout::half;
  refused("rotate K before storing it as q8_0");
  params.rope = RopeLayout::none;
  try {
    attention(context(), q, k, k, params, DType::q8_0);
    ADD_FAILURE() << "Q stored as q8_0 was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Q is stored as f32 or f16"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace flashvk::test
