// The glslang that flashvk::flex compiles with at run time, the one that also compiles the
// embedded SPIR-V (cmake/Glslang.cmake: 15 or later), knows GL_KHR_cooperative_matrix: a tiny
// compute shader compiled as flex.cpp compiles the kernels (Vulkan 1.1, SPIR-V 1.3) declares
// the CooperativeMatrixKHR capability.
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

constexpr uint32_t kOpCapability = 17;
constexpr uint32_t kCapabilityCooperativeMatrixKHR = 6022;

TEST(FlexGlslang, CompilesKhrCooperativeMatrix) {
  EXPECT_EQ(FLASHVK_GLSLANG_KHR_COOPMAT, 1) << "cmake/Glslang.cmake's probe found no KHR coopmat";
  glslang::InitializeProcess();  // counted: flex.cpp's own call and this one may both happen
  glslang::TShader shader(EShLangCompute);
  shader.setStrings(&kCoopmat, 1);
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  shader.setEnvClient(glslang::EShClientVulkan, glslang::EShTargetVulkan_1_1);
  shader.setEnvTarget(glslang::EShTargetSpv, glslang::EShTargetSpv_1_3);
  auto messages = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);
  ASSERT_TRUE(shader.parse(GetDefaultResources(), 460, false, messages)) << shader.getInfoLog();
  glslang::TProgram program;
  program.addShader(&shader);
  ASSERT_TRUE(program.link(messages)) << program.getInfoLog();
  std::vector<uint32_t> spirv;
  glslang::SpvOptions options;
  glslang::GlslangToSpv(*program.getIntermediate(EShLangCompute), spirv, &options);
  ASSERT_GT(spirv.size(), 5u);
  EXPECT_EQ(spirv[0], 0x07230203u);  // SPIR-V's magic number
  std::set<uint32_t> capabilities;
  for (size_t i = 5; i < spirv.size();) {  // after the header: instructions, a count a word
    uint32_t count = spirv[i] >> 16;
    ASSERT_GT(count, 0u);
    if ((spirv[i] & 0xffffu) == kOpCapability && count == 2) capabilities.insert(spirv[i + 1]);
    i += count;
  }
  EXPECT_TRUE(capabilities.count(kCapabilityCooperativeMatrixKHR));
}

}  // namespace
