// The glslang that flashvk::flex compiles with at run time, the one that also compiles the
// embedded SPIR-V (cmake/Glslang.cmake: 15 or later), knows GL_KHR_cooperative_matrix and
// GL_NV_cooperative_matrix2: tiny compute shaders declare the capabilities of what they use,
// compiled as flex.cpp compiles the kernels (Vulkan 1.1, SPIR-V 1.3) or, for the second
// extension, for Vulkan 1.3 and SPIR-V 1.6.
#include <glslang/Public/ResourceLimits.h>
#include <glslang/Public/ShaderLang.h>
#include <glslang/SPIRV/GlslangToSpv.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

namespace {

constexpr const char* kCoopmat = R"(#version 450
#pragma use_vulkan_memory_model
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer In { float16_t x[]; };
layout(std430, binding = 1) buffer Out { float o[]; };
void main() {
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b;
  coopMatLoad(a, x, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(b, x, 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
  coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> c =
      coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(0.0);
  c = coopMatMulAdd(a, b, c);
  coopMatStore(c, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
)";

// The operations a softmax kept in accumulator matrices would take from NVIDIA's second
// extension: a per-element function that sees each element's row and column (a causal mask),
// a row reduction (the row's max, in every element of the row), a per-element function of two
// matrices (e^(s - m)), and an accumulator made a left operand (P for P V). glslang takes the
// extension only for SPIR-V 1.6 (Vulkan 1.3), where the kernels are built for 1.3 (Vulkan 1.1).
constexpr const char* kCoopmat2 = R"(#version 450
#pragma use_vulkan_memory_model
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer In { float16_t x[]; };
layout(std430, binding = 1) buffer Out { float o[]; };
#define Acc coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MatA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
float max_of(const in float a, const in float b) { return max(a, b); }
float causal(const in uint row, const in uint col, const in float s) {
  return col > row ? -1.0 / 0.0 : s;
}
float exp_minus(const in uint row, const in uint col, const in float s, const in float m) {
  return exp(s - m);
}
void main() {
  MatA q;
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> kt;
  coopMatLoad(q, x, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatLoad(kt, x, 256, 16, gl_CooperativeMatrixLayoutColumnMajor);
  Acc s = coopMatMulAdd(q, kt, Acc(0.0));
  coopMatPerElementNV(s, s, causal);
  Acc m, p;
  coopMatReduceNV(m, s, gl_CooperativeMatrixReduceRowNV, max_of);
  coopMatPerElementNV(p, s, exp_minus, m);
  Acc pv = coopMatMulAdd(MatA(p), kt, Acc(0.0));
  coopMatStore(pv, o, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
}
)";

constexpr uint32_t kOpCapability = 17;
constexpr uint32_t kCapabilityCooperativeMatrixKHR = 6022;
constexpr uint32_t kCapabilityCooperativeMatrixReductionsNV = 5430;
constexpr uint32_t kCapabilityCooperativeMatrixConversionsNV = 5431;
constexpr uint32_t kCapabilityCooperativeMatrixPerElementOperationsNV = 5432;

// The capabilities `source` declares, compiled as flex.cpp compiles the kernels, for Vulkan 1.1
// and SPIR-V 1.3 unless told (fails the test where it does not compile).
std::set<uint32_t> compiled_capabilities(
    const char* source, glslang::EShTargetClientVersion vulkan = glslang::EShTargetVulkan_1_1,
    glslang::EShTargetLanguageVersion spirv_version = glslang::EShTargetSpv_1_3) {
  glslang::InitializeProcess();  // counted: flex.cpp's own call and this one may both happen
  glslang::TShader shader(EShLangCompute);
  shader.setStrings(&source, 1);
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  shader.setEnvClient(glslang::EShClientVulkan, vulkan);
  shader.setEnvTarget(glslang::EShTargetSpv, spirv_version);
  auto messages = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);
  std::set<uint32_t> capabilities;
  EXPECT_TRUE(shader.parse(GetDefaultResources(), 460, false, messages)) << shader.getInfoLog();
  glslang::TProgram program;
  program.addShader(&shader);
  EXPECT_TRUE(program.link(messages)) << program.getInfoLog();
  if (::testing::Test::HasFailure()) return capabilities;
  std::vector<uint32_t> spirv;
  glslang::SpvOptions options;
  glslang::GlslangToSpv(*program.getIntermediate(EShLangCompute), spirv, &options);
  EXPECT_GT(spirv.size(), 5u);
  EXPECT_EQ(spirv.empty() ? 0u : spirv[0], 0x07230203u);  // SPIR-V's magic number
  for (size_t i = 5; i < spirv.size();) {  // after the header: instructions, a count a word
    uint32_t count = spirv[i] >> 16;
    if (count == 0 || i + count > spirv.size()) {
      ADD_FAILURE() << "an instruction of " << count << " words at word " << i << " of "
                    << spirv.size();
      break;
    }
    if ((spirv[i] & 0xffffu) == kOpCapability && count == 2) capabilities.insert(spirv[i + 1]);
    i += count;
  }
  return capabilities;
}

TEST(FlexGlslang, CompilesKhrCooperativeMatrix) {
  EXPECT_EQ(FLASHVK_GLSLANG_KHR_COOPMAT, 1) << "cmake/Glslang.cmake's probe found no KHR coopmat";
  EXPECT_TRUE(compiled_capabilities(kCoopmat).count(kCapabilityCooperativeMatrixKHR));
}

TEST(FlexGlslang, CompilesNvCooperativeMatrix2) {
  std::set<uint32_t> capabilities =
      compiled_capabilities(kCoopmat2, glslang::EShTargetVulkan_1_3, glslang::EShTargetSpv_1_6);
  EXPECT_TRUE(capabilities.count(kCapabilityCooperativeMatrixKHR));
  EXPECT_TRUE(capabilities.count(kCapabilityCooperativeMatrixReductionsNV));
  EXPECT_TRUE(capabilities.count(kCapabilityCooperativeMatrixConversionsNV));
  EXPECT_TRUE(capabilities.count(kCapabilityCooperativeMatrixPerElementOperationsNV));
}

}  // namespace
