#pragma once
// Shared test helpers: one validation-enabled context per test binary, random inputs,
// dtype-derived tolerances and comparisons against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashvk.hpp"

namespace flashvk::test {

/// The context every test shares (validation layers on unless FLASHVK_VALIDATION=0).
Context& context();

/// Fails the current test if the validation layers said anything since the last call.
void expect_no_validation_messages();

/// Each test checks the validation layers when it ends.
class VulkanTest : public ::testing::Test {
 protected:
  void TearDown() override { expect_no_validation_messages(); }
};

HostTensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float scale = 1.0f);
/// The values an fp16 tensor actually holds.
HostTensor round_to_half(const HostTensor& x);
float max_abs(const HostTensor& x);

/// Error bound for fp32 arithmetic on these inputs: score error grows with |scale| * sum|q||k|,
/// output error with max|v| and the log of the number of keys (ALiBi's bias counts in the
/// scores' size). `u` is the unit roundoff.
double tolerance(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params, double u = std::ldexp(1.0, -24));

/// What the cooperative-matrix kernels add to that: they round each softmax weight p (at most 1)
/// to fp16 for the P V product, which moves the output by at most 2^-11 max|v|. 0 for the
/// other layouts.
double weight_rounding(const HostAttentionResult& gpu, const HostTensor& v);

/// Largest |gpu - ref| over all elements; NaN in gpu counts as infinite.
double max_error(const std::vector<float>& gpu, const std::vector<double>& ref);
/// Same for LSE, where both may be -inf (rows that see no key).
double max_lse_error(const std::vector<float>& gpu, const std::vector<double>& ref);

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
