#pragma once
// What flashvk::flex compiles at run time (cmake/Shaders.cmake writes them from shaders/): the
// kernels' GLSL, and every build of shaders/builds.def with its source and defines.
#include <vector>

namespace flashvk::detail {

struct FlexSource {
  const char* name;  ///< "common.glsl"
  const char* text;
};
struct FlexBuild {
  const char* name;     ///< kernel_name(), as the engine's embedded SPIR-V is named
  const char* source;   ///< "flash2.comp"
  const char* defines;  ///< "BLOCK_TILE FP16", space-separated
};

const std::vector<FlexSource>& flex_sources();
const std::vector<FlexBuild>& flex_builds();

}  // namespace flashvk::detail
