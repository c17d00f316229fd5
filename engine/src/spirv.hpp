#pragma once
// The engine's rewrites of a kernel's SPIR-V before the driver gets it (ContextImpl::driver_spirv,
// whose words the pipeline report holds too: `flashvk pipelines --spirv` writes what the driver
// compiled). Each leaves a module it cannot read whole as it was: the driver then says why.
#include <cstdint>
#include <vector>

namespace flashvk::detail {

/// Clears the Unroll bit of every OpLoopMerge's loop control
/// (testing::clear_unroll_hints_on_llvmpipe): a hint, whose bit takes no operands.
void clear_unroll_hints(std::vector<uint32_t>& words);

/// In a module on the Vulkan memory model (glslang builds every cooperative-matrix kernel so),
/// workgroup memory made coherent by its barriers instead of by each access. GLSL's shared
/// variables are implicitly coherent, so glslang gives every load and store of them (the matrix
/// loads and stores too) its own visibility or availability operation, which Mesa compiles to a
/// wait after each (RADV: a tile's eight LDS loads one pair at a time, and an s_waitcnt after
/// every store). Here those per-access operations go, the accesses stay non-private, and every
/// barrier that orders workgroup memory (acquire, release or both) makes it visible or available
/// (MakeVisible, MakeAvailable: the Vulkan memory model's barrier-based form). That is the same
/// program wherever workgroup memory passes between invocations only across such barriers, as
/// the kernels' shared tiles, scratch and exchanges do (their atomics there are relaxed). A
/// subgroup barrier whose semantics name buffer and image memory too makes those available and
/// visible as well: correct, if more than needed. Returns whether the module changed: not for
/// another memory model or nothing to rewrite, nor (left whole) where a barrier's semantics are
/// not a constant, an access has memory operands this does not know, an atomic on workgroup
/// memory acquires or releases, or OpCopyMemory touches it.
bool coherence_at_barriers(std::vector<uint32_t>& words);

/// Whether the driver gets every module as glslang built it, without coherence_at_barriers
/// (environment FLASHVK_SPIRV_AS_BUILT set and not 0): a diagnostic for a GPU machine, where
/// nothing can be rebuilt, to tell a driver's fault from a rewrite's (scripts/gpu_check.sh reruns
/// failed tests so) and to time what a rewrite is worth (scripts/gpu_bench.sh).
bool spirv_as_built();

}  // namespace flashvk::detail
