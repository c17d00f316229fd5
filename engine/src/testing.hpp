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

}  // namespace flashvk::testing
