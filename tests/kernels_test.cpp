// The kernel build table (shaders/builds.def): every build the engine can name is embedded, under
// the name CMake gave it, and its SPIR-V is a module.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "flashvk/error.hpp"
#include "kernels.hpp"
#include "shader_registry.hpp"

namespace flashvk::detail {
namespace {

TEST(KernelTable, EveryBuildTheTableNamesIsEmbedded) {
  // The engine's builds, the traces' and the calibrations', each embedded once.
  std::set<std::string> embedded;
  for (const auto* registry : {&shader_blobs(), &trace_shader_blobs(), &peak_shader_blobs()})
    for (const ShaderBlob& blob : *registry) {
      EXPECT_TRUE(embedded.insert(blob.name).second) << blob.name << " is embedded twice";
      ASSERT_GE(blob.bytes, 20u) << blob.name;
      EXPECT_EQ(blob.words[0], 0x07230203u) << blob.name << ": not SPIR-V";
    }
  // The engine embeds no trace build: traces are flashvk_trace's.
  for (const ShaderBlob& blob : shader_blobs())
    EXPECT_EQ(std::string(blob.name).find("_trace"), std::string::npos) << blob.name;
  size_t named = 0;
  for (const KernelBuilds& line : kernel_table())
    // Every value of every option; those the line lacks are not looked at.
    for (uint32_t bits = 0; bits < 64 * 3; ++bits) {
      // The matrix API: every one a MAT line is built for, those of the units for MATHW, none
      // where the line has neither.
      const MatrixApi apis[] = {MatrixApi::khr, MatrixApi::nv, MatrixApi::emulated};
      MatrixApi matrix = apis[bits / 64];
      if (!(line.options & (build_option::MAT | build_option::MATHW))) {
        if (bits >= 64) break;
        matrix = MatrixApi::none;
      } else if ((line.options & build_option::MATHW) && matrix == MatrixApi::emulated) {
        EXPECT_THROW(kernel_name({.program = line.program, .layout = line.layout,
                                  .matrix = matrix}),
                     Error);
        continue;
      }
      KernelKey key{.program = line.program,
                    .layout = line.layout,
                    .q = bits & 1 ? DType::f16 : DType::f32,
                    .kv_quant = (bits & 2) != 0,
                    .trace = (bits & 4) != 0,
                    .shuffle = (bits & 8) != 0,
                    .f16math = (bits & 16) != 0,
                    .quant = (bits & 32) != 0,
                    .matrix = matrix};
      std::string name = kernel_name(key);
      EXPECT_TRUE(embedded.count(name)) << name << " (" << line.source << ") is not embedded";
      ++named;
    }
  EXPECT_GT(named, 0u);
  // A matrix build without an API is the planner's bug.
  EXPECT_THROW(kernel_name({.program = "flash2", .layout = TileLayout::cooperative_matrix}),
               Error);
}

TEST(KernelTable, AProgramWithoutABuildInALayoutIsAnInternalError) {
  EXPECT_THROW(kernel_name({.program = "naive_scores", .layout = TileLayout::lanes}), Error);
  EXPECT_THROW(kernel_name({.program = "no_such_program"}), Error);
}

}  // namespace
}  // namespace flashvk::detail
