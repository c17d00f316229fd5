// The engine's rewrite of the matrix kernels' SPIR-V (engine/src/spirv.hpp,
// coherence_at_barriers), read back here by a walk of its own: every build on the Vulkan memory
// model (the cooperative-matrix kernels on the matrix units) loses the per-access visibility and
// availability of workgroup memory that glslang gives GLSL's shared variables, keeps those
// accesses non-private, and has every barrier that orders workgroup memory make it available and
// visible instead; every other build is left as it is. (That the drivers take the result is
// RADV's part: scripts/pipelines.sh compiles every matrix kernel.) And how the matrix kernels
// index the matrices they keep across a tile's phases: by constants alone.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "shader_registry.hpp"
#include "spirv.hpp"

namespace flashvk::detail {
namespace {

struct Module {
  bool vulkan_memory_model = false;
  std::map<uint32_t, uint32_t> opcodes;  // opcode -> how many
  // Loads and stores of workgroup memory (matrix loads and stores among them): their masks.
  std::vector<uint32_t> shared_access_masks;
  // The semantics of every barrier whose semantics name workgroup memory.
  std::vector<uint32_t> shared_barrier_semantics;
};

Module read(const std::vector<uint32_t>& w) {
  Module m;
  std::set<uint32_t> pointer_types, pointers;
  std::map<uint32_t, uint32_t> constants;
  struct Access {
    uint32_t pointer, mask;
  };
  std::vector<Access> accesses;
  std::vector<uint32_t> barrier_constants;
  for (size_t i = 5; i < w.size();) {
    uint32_t op = w[i] & 0xffffu, n = w[i] >> 16;
    if (n == 0 || i + n > w.size()) {
      ADD_FAILURE() << "a malformed instruction at word " << i;
      return m;
    }
    const uint32_t* x = &w[i];
    ++m.opcodes[op];
    if (op == 14) m.vulkan_memory_model = x[2] == 3;        // OpMemoryModel
    if (op == 32 && x[2] == 4) pointer_types.insert(x[1]);  // OpTypePointer Workgroup
    if (op == 43 && n == 4) constants[x[2]] = x[3];         // OpConstant
    // variables, access chains, copies, selections, phis and parameters of such pointers
    bool typed = op == 59 || (op >= 65 && op <= 67) || op == 70 || op == 83 || op == 169 ||
                 op == 245 || op == 55;
    if (typed && n >= 3 && pointer_types.count(x[1])) pointers.insert(x[2]);
    if (op == 61 && n > 4) accesses.push_back({x[3], x[4]});                    // OpLoad
    if (op == 62 && n > 3) accesses.push_back({x[1], x[3]});                    // OpStore
    if ((op == 4457 || op == 5359) && n > 6) accesses.push_back({x[3], x[6]});  // matrix loads
    if ((op == 4458 || op == 5360) && n > 5) accesses.push_back({x[1], x[5]});  // matrix stores
    if (op == 224) barrier_constants.push_back(x[3]);                           // OpControlBarrier
    if (op == 225) barrier_constants.push_back(x[2]);                           // OpMemoryBarrier
    i += n;
  }
  for (const Access& a : accesses)
    if (pointers.count(a.pointer)) m.shared_access_masks.push_back(a.mask);
  for (uint32_t id : barrier_constants) {
    EXPECT_TRUE(constants.count(id)) << "a barrier's semantics are not a constant";
    if (constants[id] & 0x100) m.shared_barrier_semantics.push_back(constants[id]);
  }
  return m;
}

std::vector<uint32_t> words_of(const ShaderBlob& blob) {
  return std::vector<uint32_t>(blob.words, blob.words + blob.bytes / 4);
}

TEST(SpirvRewrite, MatrixKernelsMakeWorkgroupMemoryCoherentAtTheirBarriers) {
  const uint32_t kAvailable = 0x8, kVisible = 0x10, kNonPrivate = 0x20;  // memory operands
  const uint32_t kAcquireRelease = 0x8, kMakeAvailable = 0x2000, kMakeVisible = 0x4000;
  size_t rewritten = 0;
  for (const ShaderBlob& blob : shader_blobs()) {
    std::vector<uint32_t> words = words_of(blob);
    Module before = read(words);
    bool changed = coherence_at_barriers(words);
    Module after = read(words);
    if (!before.vulkan_memory_model) {  // every other build: untouched
      EXPECT_FALSE(changed) << blob.name;
      EXPECT_EQ(words, words_of(blob)) << blob.name;
      continue;
    }
    ASSERT_TRUE(changed) << blob.name;
    ++rewritten;
    EXPECT_NE(std::string(blob.name).find("_cooperative_matrix_"), std::string::npos) << blob.name;
    // Before: glslang's per-access operations on every access (shared is coherent in GLSL).
    ASSERT_FALSE(before.shared_access_masks.empty()) << blob.name;
    for (uint32_t mask : before.shared_access_masks)
      EXPECT_NE(mask & (kAvailable | kVisible), 0u) << blob.name;
    // After: the same accesses, non-private, without them.
    ASSERT_EQ(after.shared_access_masks.size(), before.shared_access_masks.size()) << blob.name;
    for (uint32_t mask : after.shared_access_masks) {
      EXPECT_EQ(mask & (kAvailable | kVisible), 0u) << blob.name;
      EXPECT_NE(mask & kNonPrivate, 0u) << blob.name;
    }
    // Every barrier on workgroup memory (each acquire-release, as glslang writes them) makes it
    // available and visible, where none did before.
    ASSERT_FALSE(before.shared_barrier_semantics.empty()) << blob.name;
    ASSERT_EQ(after.shared_barrier_semantics.size(), before.shared_barrier_semantics.size())
        << blob.name;
    for (size_t i = 0; i < before.shared_barrier_semantics.size(); ++i) {
      uint32_t was = before.shared_barrier_semantics[i], is = after.shared_barrier_semantics[i];
      EXPECT_EQ(was & (kMakeAvailable | kMakeVisible), 0u) << blob.name;
      EXPECT_NE(was & kAcquireRelease, 0u) << blob.name;
      EXPECT_EQ(is, was | kMakeAvailable | kMakeVisible) << blob.name;
    }
    // Nothing else: the same instructions, and at most a new constant per semantics.
    std::map<uint32_t, uint32_t> ops = after.opcodes;
    EXPECT_GE(ops[43], before.opcodes.at(43)) << blob.name;
    EXPECT_LE(ops[43], before.opcodes.at(43) + before.shared_barrier_semantics.size());
    ops[43] = before.opcodes.at(43);
    EXPECT_EQ(ops, before.opcodes) << blob.name;
    EXPECT_GT(words[3], blob.words[3]) << blob.name << ": the new constants' ids";
    // Once is enough.
    std::vector<uint32_t> again = words;
    EXPECT_FALSE(coherence_at_barriers(again)) << blob.name;
    EXPECT_EQ(again, words) << blob.name;
  }
  // flash1, flash2, flashd and splitkv, each through khr, nv and nv2.
  EXPECT_EQ(rewritten, 12u);
}

TEST(SpirvRewrite, LeavesWhatItCannotReadAsItWas) {
  const std::vector<uint32_t> whole =
      words_of(find_build(shader_blobs(), "flash2_cooperative_matrix_khr"));
  std::vector<std::vector<uint32_t>> broken(4, whole);
  broken[0].resize(3);  // a header cut short
  broken[1][0] = 0;     // not SPIR-V
  for (size_t i = 5; i < whole.size(); i += whole[i] >> 16)
    if ((whole[i] & 0xffffu) == 61) {  // an instruction of no words: the first OpLoad's
      broken[2][i] &= 0xffffu;
      break;
    }
  // An atomic on workgroup memory that synchronises (acquire-release, a barrier's semantics)
  // rather than the relaxed ones of workgroup_min_max (common.glsl).
  uint32_t ordering = 0;
  size_t atomic = 0;
  for (size_t i = 5; i < whole.size(); i += whole[i] >> 16) {
    uint32_t op = whole[i] & 0xffffu;
    if (op == 224 && !ordering) ordering = whole[i + 3];      // OpControlBarrier's semantics
    if ((op == 237 || op == 239) && !atomic) atomic = i + 5;  // OpAtomicUMin/UMax's
  }
  ASSERT_NE(ordering, 0u);
  ASSERT_NE(atomic, 0u);
  broken[3][atomic] = ordering;
  for (std::vector<uint32_t>& words : broken) {
    const std::vector<uint32_t> was = words;
    EXPECT_FALSE(coherence_at_barriers(words));
    EXPECT_EQ(words, was);
  }
}

// FLASHVK_SPIRV_AS_BUILT, the diagnostic that gives the driver glslang's modules untouched: on
// where it is set to anything but 0.
TEST(SpirvRewrite, TheEnvironmentCanAskForModulesAsBuilt) {
  const char* name = "FLASHVK_SPIRV_AS_BUILT";
  const char* was = std::getenv(name);
  const std::string saved = was ? was : "";
  ::unsetenv(name);
  EXPECT_FALSE(spirv_as_built());
  for (const char* value : {"1", "yes"}) {
    ::setenv(name, value, 1);
    EXPECT_TRUE(spirv_as_built()) << value;
  }
  for (const char* value : {"0", ""}) {
    ::setenv(name, value, 1);
    EXPECT_FALSE(spirv_as_built()) << '"' << value << '"';
  }
  if (was)
    ::setenv(name, saved.c_str(), 1);
  else
    ::unsetenv(name);
}

// The matrices a matrix kernel keeps across a tile's phases (flash_cm.comp's o_acc, p_frag,
// s_rows and keep_m, and coef_m but for FlashAttention-2's; with the softmax in matrices,
// s_tile and row_state too) are indexed by constants alone
// (OpConstant, or a specialization constant's expression): a driver keeps an array that an index
// reaches at run time in memory, and NVIDIA's kept o_acc in local memory while [[unroll]] loops'
// variables indexed it (glslang writes those as loops; only the driver's unrolling made them
// constant). Nor is such an array used whole (loaded, stored, copied or passed to a function,
// where a callee would index it). An element of a matrix is not checked: GL_NV_cooperative_matrix
// has no product of two, and coopmat.glsl's CM_NV steps through elements in loops.
TEST(SpirvKernels, MatrixKernelsIndexTheMatricesTheyKeepByConstants) {
  size_t kernels = 0;
  for (const ShaderBlob& blob : shader_blobs()) {
    const std::string name = blob.name;
    // (the stand-ins, for llvmpipe, keep their loops: flash_cm.comp's CM_EACH)
    if (name.find("_cooperative_matrix_") == std::string::npos ||
        name.find("_emu") != std::string::npos)
      continue;
    ++kernels;
    const std::vector<uint32_t> w = words_of(blob);
    std::map<uint32_t, std::string> names;  // OpName
    std::set<uint32_t> constants;           // constants and specialization constants' ids
    std::map<std::string, size_t> indexed;  // kept matrices' access chains, by name
    auto kept = [&names](uint32_t id) {
      auto it = names.find(id);
      static const std::set<std::string> arrays = {"o_acc",  "p_frag", "s_rows",   "keep_m",
                                                   "coef_m", "s_tile", "row_state"};
      return it != names.end() && arrays.count(it->second);
    };
    for (size_t i = 5; i < w.size();) {
      uint32_t op = w[i] & 0xffffu, n = w[i] >> 16;
      ASSERT_TRUE(n > 0 && i + n <= w.size()) << name << ": malformed at word " << i;
      const uint32_t* x = &w[i];
      if (op == 5 && n > 2) {  // OpName: a nul-terminated string in the words after the id
        const char* text = reinterpret_cast<const char*>(x + 2);
        names[x[1]] = std::string(text, strnlen(text, 4 * (n - 2)));
      }
      // OpConstantTrue/False, OpConstant, OpSpecConstantTrue/False, OpSpecConstant, ...Op
      if ((op >= 41 && op <= 43) || (op >= 48 && op <= 50) || op == 52) constants.insert(x[2]);
      if ((op == 65 || op == 66) && n > 4 && kept(x[3])) {  // OpAccessChain, InBounds
        ++indexed[names[x[3]]];
        EXPECT_TRUE(constants.count(x[4]))
            << name << ": " << names[x[3]] << " indexed by %" << x[4] << ", not a constant";
      }
      // The whole array loaded, stored or copied (OpLoad, OpStore, OpCopyMemory), or passed
      // (an OpFunctionCall's argument)
      std::vector<uint32_t> whole;
      if (op == 61 && n > 3) whole = {x[3]};
      if (op == 62 && n > 2) whole = {x[1]};
      if (op == 63 && n > 2) whole = {x[1], x[2]};
      if (op == 57) whole.assign(x + 4, x + n);
      for (uint32_t id : whole)
        EXPECT_FALSE(kept(id)) << name << ": " << names[id] << " used whole (opcode " << op << ")";
      i += n;
    }
    EXPECT_GT(indexed["o_acc"], 0u) << name;
    EXPECT_GT(indexed["p_frag"], 0u) << name;
    EXPECT_GT(indexed["s_rows"], 0u) << name;
    EXPECT_GT(indexed["keep_m"], 0u) << name;
    if (name.find("flash1") != std::string::npos || name.find("flashd") != std::string::npos) {
      EXPECT_GT(indexed["coef_m"], 0u) << name;
    }
    if (name.find("nv2") != std::string::npos) {
      EXPECT_GT(indexed["s_tile"], 0u) << name;
      EXPECT_GT(indexed["row_state"], 0u) << name;
    }
  }
  // flash1, flash2, flashd and splitkv, each through khr, nv and nv2.
  EXPECT_EQ(kernels, 12u);
}

}  // namespace
}  // namespace flashvk::detail
