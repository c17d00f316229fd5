#pragma once
// The kernel builds of shaders/builds.def (the one table that cmake/Shaders.cmake compiles), and
// the name of the build a call runs, from what the planner knows: the program, the tile layout
// and the build options.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashvk/attention.hpp"
#include "vk.hpp"

namespace flashvk::detail {

/// A build option of builds.def, as a bit.
namespace build_option {
enum : uint32_t { NONE = 0, Q = 1, KVQ = 2, TRACE = 4, SG = 8, F16 = 16, QUANT = 32, MAT = 64,
                  MATHW = 128 };
}

/// One line of builds.def.
struct KernelBuilds {
  std::string_view program, source;
  TileLayout layout;
  uint32_t options;  ///< build_option bits: the options it is built for each value of
};

/// builds.def, line by line.
std::span<const KernelBuilds> kernel_table();

/// Which build of a program runs: its line's layout, and a value for each option.
struct KernelKey {
  std::string_view program;
  TileLayout layout = TileLayout::shared;
  DType q = DType::f32;   ///< Q: f32 or f16
  bool kv_quant = false;  ///< KVQ
  bool trace = false;     ///< TRACE
  bool shuffle = false;   ///< SG
  bool f16math = false;   ///< F16
  bool quant = false;     ///< QUANT
  MatrixApi matrix = MatrixApi::none;  ///< MAT and MATHW: khr, nv or emulated
};

/// The build's name in the embedded registry, as Shaders.cmake names it; an option its line lacks
/// is not looked at (that build serves every value of it). Throws Error ("internal: ...") when
/// builds.def has no line for the program and layout: every one the planner can ask for is
/// checked against the table at compile time (kernels.cpp), so this would be a planner's bug.
std::string kernel_name(const KernelKey& key);
/// The source file of a program's build in `layout` ("flash2.comp"), for reports.
std::string_view kernel_source(std::string_view program, TileLayout layout);

/// The build of `program` a call with tiling `spec` runs: the spec's layout and build options,
/// Q's storage, and whether it traces.
KernelKey kernel_key(std::string_view program, const Spec& spec, DType q, bool trace = false);

/// One pipeline a call builds: which build, with which constants.
struct PipelineChoice {
  KernelKey key;
  Spec spec;
};

/// The pipelines a variant's kernels build for tiling `spec`, in dispatch order: the one home of
/// that choice, read by the plans (kernels/*.cpp) and by describe_pipelines().
std::vector<PipelineChoice> attention_pipelines(Variant variant, const Spec& spec, DType q,
                                                const DeviceInfo& info, bool trace = false);
/// The kernel families' parts of it (kernels/naive.cpp, splitkv.cpp, rope.cpp).
std::vector<PipelineChoice> naive_pipelines(const Spec& spec, DType q, bool trace);
std::vector<PipelineChoice> splitkv_pipelines(const Spec& spec, DType q, const DeviceInfo& info,
                                              bool trace);
/// rope.comp rotating or copying rows stored as `x` into rows stored as `dst`.
PipelineChoice rows_pipeline(DType x, DType dst);

}  // namespace flashvk::detail
