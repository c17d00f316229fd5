#pragma once
// flashvk::flex: attention its user writes (FlexAttention's score_mod and mask_mod, in GLSL:
// Modifiers::score_mod, mask_mod and flex_table), compiled into the engine's kernels at run time
// with glslang. Link flashvk::flex (CMake option FLASHVK_FLEX, on where glslang's libraries are
// found) and call enable() once per context; docs/engine.md shows how to write the functions.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "flashvk/context.hpp"
#include "flashvk/modifiers.hpp"

namespace flashvk::flex {

/// Installs glslang's compiler in `ctx` (Context::set_kernel_compiler): calls whose Modifiers
/// hold score_mod or mask_mod then compile each kernel they run once per set of functions. With
/// a pipeline cache (ContextOptions::pipeline_cache_path) the SPIR-V is kept beside it
/// (flashvk-flex-<digest>.spv), so that a later process does not compile again.
void enable(Context& ctx);

/// The SPIR-V of kernel build `build` (a build name of shaders/builds.def) with `mods`'
/// functions in it. Throws Error in one line naming the file and the line where they do not
/// compile ("doc_mask.glsl:3: 'doc' : undeclared identifier").
std::vector<uint32_t> compile(const std::string& build, const Modifiers& mods);

/// Compiles `mods`' functions into one kernel, to refuse a bad file before anything runs.
void check(const Modifiers& mods);

/// C++ twins (Modifiers::score_twin, mask_twin) for functions the host has none of, from their
/// values on the device: for float64 code (reference::) that runs twice over the same inputs.
/// The first run takes noting(), whose twins note each point asked and answer as if there were
/// no function; answering() evaluates those points on `ctx`'s device in one dispatch (in fp32,
/// as the kernels do, with FLEX_NQ = nq and FLEX_NK = nk) and gives twins that answer from them
/// to the second run, which throws Error at a point the first did not ask. Twins `mods` already
/// has are kept. Its twins are for one thread at a time. The viewer's reference uses it for a
/// file of the user's.
class DeviceTwins {
 public:
  DeviceTwins(Context& ctx, Modifiers mods, uint32_t nq, uint32_t nk);
  Modifiers noting();
  Modifiers answering();

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace flashvk::flex
