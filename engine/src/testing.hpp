#pragma once
// Test tooling, in the engine of test builds only (FLASHVK_FAULT_INJECTION; not installed):
// failures injected into the engine's Vulkan calls, for tests of the error paths.
#include <string>

#include <vulkan/vulkan.h>

namespace flashvk::testing {

/// Makes the `skip`+1-th following call of the named Vulkan function ("vkAllocateMemory",
/// "vkQueueSubmit", ...) on any context fail with `result` without being made. `clear_failures()`
/// disarms it. "vkCmdDispatch" records that dispatch with half its workgroups along its last
/// axis of several (a submission the device lost part-way through), the run going on.
void inject_failure(const std::string& call, VkResult result, int skip = 0);
void clear_failures();

/// Whether contexts created from now on over llvmpipe (lavapipe) build their kernels with the
/// SPIR-V's Unroll loop hints cleared, leaving unrolling to the driver: the same programs, which
/// llvmpipe compiles about 3x faster (the suite's time is its compiles). Their loops then run
/// more iterations than the plans count against llvmpipe's loop cap, so long rows need the
/// kernels as shipped (false, the default). Other drivers always get the hints.
void clear_unroll_hints_on_llvmpipe(bool clear);

}  // namespace flashvk::testing
