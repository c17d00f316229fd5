#pragma once
// Shared test helpers: one validation-enabled context per test binary, random inputs,
// dtype-derived tolerances and comparisons against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flashvk.hpp"
#include "flashvk/reference.hpp"
#include "flashvk/trace.hpp"

namespace flashvk::test {

/// The options every test's context starts from: the validation layers on unless
/// FLASHVK_VALIDATION=0 (a machine without them). Tests that make contexts of their own start
/// from these and add what they need.
ContextOptions test_options();
/// The context every test shares (test_options()).
Context& context();
/// A context of its own whose kernels are built as shipped on llvmpipe too (the shared ones
/// leave unrolling to llvmpipe to build faster; its loop cap then comes sooner): for long rows.
Context shipped_kernels_context();
/// The same device with Vulkan's guaranteed minimum limits for compute
/// (LimitOverrides::vulkan_minimums: 16 KiB shared memory, 128 invocations, no subgroup
/// operations), as the smallest device an app may meet.
Context& minimum_context();
/// The same device whose matrix kernels keep the softmax in matrices (MatrixApi::nv2 where the
/// device has it, else emulated_nv2, which any device with fp16 storage runs).
Context& softmax_matrices_context();

/// Fails the current test if the validation layers said anything since the last call.
void expect_no_validation_messages();
/// The same for a context the test made (VulkanTest checks the shared ones when it ends).
void expect_no_validation_messages(Context& ctx);

/// Each test checks the validation layers when it ends.
class VulkanTest : public ::testing::Test {
 protected:
  void TearDown() override { expect_no_validation_messages(); }
};

HostTensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float scale = 1.0f);
/// The values an fp16 tensor actually holds.
HostTensor round_to_half(const HostTensor& x);
float max_abs(const HostTensor& x);
/// Values a block format and fp16 both hold exactly: each block of 32 along the last dimension on
/// its format's grid, d0 n with n an integer in the format's range and d0 a power of two, one of
/// the two that keep |d0 n| within 1 .. 4 at the range's widest (block by block, so that blocks'
/// heads differ, and the softmax is not one key's), its extremes present so that the quantiser
/// finds d0 itself: q8_0 -127 .. 127; q4_0 and q5_0 down to -8 and -16 (the largest magnitude,
/// negative); q4_1 and q5_1 k + 0 .. k + 15 (31), -19 (-35) <= k <= -4 (a minimum k d0); iq4_nl
/// ggml's levels, -127 among them. fp16: random values, rounded.
HostTensor exact_blocks(std::vector<int64_t> shape, DType format, uint32_t seed);

/// Error bound for fp32 arithmetic on these inputs: score error grows with |scale| * sum|q||k|,
/// output error with max|v| and the log of the number of keys (ALiBi's bias counts in the
/// scores' size). `u` is the unit roundoff.
double tolerance(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params, double u = std::ldexp(1.0, -24));

/// What the cooperative-matrix kernels add to that: they round each softmax weight p (at most 1)
/// to fp16 for the P V product, which moves the output by at most 2^-11 max|v|. 0 for the
/// other layouts.
double weight_rounding(TileLayout layout, const HostTensor& v);
inline double weight_rounding(const HostAttentionResult& gpu, const HostTensor& v) {
  return weight_rounding(gpu.tile_layout, v);
}

/// What the cooperative-matrix kernels add where they decode K's and V's values (ks, vs: as
/// stored, the block formats' own) to fp16 as they stage tiles: each value fp16 does not hold
/// moves by at most 2^-10 of itself (any rounding mode; 2^-24 more below fp16's normals), so
/// each score by at most delta = |scale| max over a query's and its KV head's keys of
/// sum_c |q_c| |dk_c|, the LSE by delta, each weight by a factor within e^(+-2 delta) and the
/// output by max|v| (e^(2 delta) - 1) more, and by the most a value of V moved. 0 for the other
/// layouts, and for values fp16 holds (exact_blocks').
struct DecodeRounding {
  double out = 0.0, lse = 0.0;
};
DecodeRounding decode_rounding(TileLayout layout, const HostTensor& q, const HostTensor& ks,
                               const HostTensor& vs, const AttentionParams& params);

/// Largest |gpu - ref| over all elements; NaN in gpu counts as infinite.
double max_error(const std::vector<float>& gpu, const std::vector<double>& ref);
/// Same for LSE, where both may be -inf (rows that see no key).
double max_lse_error(const std::vector<float>& gpu, const std::vector<double>& ref);

/// Rows [begin, end) of every [.., N, d] matrix of a host tensor.
HostTensor rows_of(const HostTensor& x, int64_t begin, int64_t end);
/// The first n rows of every [.., N, d] matrix.
inline HostTensor first_rows(const HostTensor& x, int64_t n) {
  return rows_of(x, 0, n);
}

/// An attention shape for the parameterised tests: Q [b, h, nq, d], K [b, hkv, nk, d],
/// V [b, hkv, nk, dv], causal or not, and a name for the test's.
struct Shape {
  uint32_t b, h, hkv, nq, nk, d, dv;
  bool causal;
  const char* name;
};
/// The position of the row named `name` in a test's table of cases (its size if none is).
template <class Row, size_t N>
size_t index_of(const Row (&table)[N], const char* name) {
  size_t i = 0;
  while (i < N && std::string(table[i].name) != name) ++i;
  return i;
}
/// For a check run in one storage of two per case (CI time: each is another set of pipelines
/// for llvmpipe): whether case `index` of `variant` takes fp32 (false) or fp16 (true), the two
/// taking turns over the cases and the variants.
inline bool fp16_turn(size_t index, Variant variant) {
  return (index + size_t(variant)) % 2 == 1;
}

/// The variants with one fused kernel over K/V tiles (all but naive).
inline std::vector<Variant> fused_variants() {
  std::vector<Variant> fused;
  for (Variant v : all_variants())
    if (variant_info(v).fused) fused.push_back(v);
  return fused;
}
/// A variant, a storage type and a shape, named "flash2_f16_<shape>" in test names.
using Case = std::tuple<Variant, DType, Shape>;
inline std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  auto [variant, dtype, s] = info.param;
  return std::string(variant_name(variant)) + "_" + dtype_name(dtype) + "_" + s.name;
}

/// The shape of a call with B = 1 and dense K and V (the engine's tiling reads kv_rows and
/// kv_keys too).
Dims dims(uint32_t heads, uint32_t kv_heads, uint32_t nq, uint32_t nk, uint32_t d, uint32_t dv);
/// The matrix API a context made from test_options() picks on `info`: its units, else emulated
/// (where it has fp16 storage), else none.
MatrixApi matrix_api_of(const DeviceInfo& info);

/// Every layout a device runs for the variant at head dims d and dv: the default, shared
/// tiles, register tiles where they run, register blocks, lanes for splitkv, and cooperative
/// matrices for the variants that have them (fp16 only: callers skip them for fp32). The tests
/// ask for layouts by name from this list only; TilingTest checks it against made-up devices.
std::vector<TileLayout> device_layouts(const DeviceInfo& info, Variant v, uint32_t d, uint32_t dv);
/// The same for the shared context's device.
std::vector<TileLayout> device_layouts(Variant v, uint32_t d, uint32_t dv);

/// `params` in every layout the device runs (cooperative matrices in fp16, where NaN stays NaN;
/// the rest in fp32) with K and V NaN at keys [from, to) of every K/V head, against float64 with
/// those keys at 0: a kernel that read one would carry NaN into O. For the tests that tiles a mask
/// hides are never read.
void expect_keys_never_read(const HostTensor& q, HostTensor k, HostTensor v, AttentionParams params,
                            uint32_t from, uint32_t to);

/// `call` throws an Error whose message contains `words`.
inline void expect_refused(const std::function<void()>& call, const char* words) {
  try {
    call();
    ADD_FAILURE() << "not refused; expected an error saying \"" << words << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

/// An application's command buffer, recorded once (`fill`) and submitted and waited for as
/// often as it likes.
struct ReusedFrame {
  VkDevice device;
  VkQueue queue;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  ReusedFrame(const ExternalDevice& h, const std::function<void(VkCommandBuffer)>& fill)
      : device(h.device), queue(h.queue) {
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = h.queue_family;
    EXPECT_EQ(vkCreateCommandPool(device, &pi, nullptr, &pool), VK_SUCCESS);
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    EXPECT_EQ(vkAllocateCommandBuffers(device, &ai, &cmd), VK_SUCCESS);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cmd, &bi);
    fill(cmd);
    vkEndCommandBuffer(cmd);
  }
  void submit() {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    EXPECT_EQ(vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE), VK_SUCCESS);
    EXPECT_EQ(vkQueueWaitIdle(queue), VK_SUCCESS);
  }
  ~ReusedFrame() { vkDestroyCommandPool(device, pool, nullptr); }
  ReusedFrame(const ReusedFrame&) = delete;
  ReusedFrame& operator=(const ReusedFrame&) = delete;
};

}  // namespace flashvk::test

namespace flashvk::test {
/// "Q f32 K q8_0 V f16", for failure messages.
inline std::string storage_name(const Storage& s) {
  return std::string("Q ") + dtype_name(s.q) + " K " + dtype_name(s.k) + " V " + dtype_name(s.v);
}
/// Test-name suffix for a variant parameter.
inline std::string variant_param_name(const ::testing::TestParamInfo<Variant>& param) {
  return variant_name(param.param);
}
}  // namespace flashvk::test
