#include "spirv.hpp"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace flashvk::detail {

namespace {

constexpr size_t kHeader = 5;  // magic, version, generator, bound, schema
constexpr uint32_t kMagic = 0x07230203;

enum Op : uint32_t {
  kOpMemoryModel = 14,
  kOpTypePointer = 32,
  kOpConstant = 43,
  kOpFunctionParameter = 55,
  kOpVariable = 59,
  kOpLoad = 61,
  kOpStore = 62,
  kOpCopyMemory = 63,
  kOpCopyMemorySized = 64,
  kOpAccessChain = 65,
  kOpInBoundsAccessChain = 66,
  kOpPtrAccessChain = 67,
  kOpInBoundsPtrAccessChain = 70,
  kOpCopyObject = 83,
  kOpSelect = 169,
  kOpControlBarrier = 224,
  kOpMemoryBarrier = 225,
  kOpAtomicLoad = 227,
  kOpAtomicStore = 228,
  kOpAtomicCompareExchange = 230,
  kOpAtomicCompareExchangeWeak = 231,
  kOpAtomicXor = 242,
  kOpAtomicFMinEXT = 5614,
  kOpAtomicFMaxEXT = 5615,
  kOpAtomicFAddEXT = 6035,
  kOpPhi = 245,
  kOpLoopMerge = 246,
  kOpCooperativeMatrixLoadKHR = 4457,
  kOpCooperativeMatrixStoreKHR = 4458,
  kOpCooperativeMatrixLoadNV = 5359,
  kOpCooperativeMatrixStoreNV = 5360,
};

constexpr uint32_t kStorageWorkgroup = 4;
constexpr uint32_t kMemoryModelVulkan = 3;
// Memory operands (each of the first three with one more word, in this order).
constexpr uint32_t kAligned = 0x2, kMakePointerAvailable = 0x8, kMakePointerVisible = 0x10,
                   kKnownMemoryOperands = 0x3f;
// Memory semantics.
constexpr uint32_t kAcquire = 0x2, kRelease = 0x4, kAcquireRelease = 0x8, kSeqCst = 0x10,
                   kWorkgroupMemory = 0x100, kMakeAvailable = 0x2000, kMakeVisible = 0x4000;

struct Inst {
  size_t at;  // where its first word is
  uint32_t op, count;
};

// The module's instructions; empty where it is not whole.
std::vector<Inst> instructions(const std::vector<uint32_t>& words) {
  std::vector<Inst> out;
  if (words.size() < kHeader || words[0] != kMagic) return out;
  for (size_t i = kHeader; i < words.size();) {
    uint32_t op = words[i] & 0xffffu, count = words[i] >> 16;
    if (count == 0 || i + count > words.size()) return {};
    out.push_back({i, op, count});
    i += count;
  }
  return out;
}

// Where an access's pointer and memory-operand mask are (word offsets in the instruction; the
// mask only where the instruction has that many words), or {0, 0} for other instructions.
std::pair<uint32_t, uint32_t> access_operands(uint32_t op) {
  switch (op) {
    case kOpLoad:
      return {3, 4};
    case kOpStore:
      return {1, 3};
    case kOpCooperativeMatrixLoadKHR:  // type, result, pointer, layout, stride, operands
    case kOpCooperativeMatrixLoadNV:   // type, result, pointer, stride, column major, operands
      return {3, 6};
    case kOpCooperativeMatrixStoreKHR:  // pointer, object, layout, stride, operands
    case kOpCooperativeMatrixStoreNV:   // pointer, object, stride, column major, operands
      return {1, 5};
    default:
      return {0, 0};
  }
}

// Where an atomic's pointer and memory semantics are (word offsets; {0} for other instructions):
// OpAtomicStore's pointer, scope, semantics, value; the compare-exchanges' two semantics; every
// other's result type, result, pointer, scope, semantics.
struct AtomicOperands {
  uint32_t pointer;
  uint32_t semantics[2];
};
AtomicOperands atomic_operands(uint32_t op) {
  if (op == kOpAtomicStore) return {1, {3, 0}};
  if (op == kOpAtomicCompareExchange || op == kOpAtomicCompareExchangeWeak) return {3, {5, 6}};
  bool atomic = (op >= kOpAtomicLoad && op <= kOpAtomicXor) || op == kOpAtomicFMinEXT ||
                op == kOpAtomicFMaxEXT || op == kOpAtomicFAddEXT;
  return atomic ? AtomicOperands{3, {5, 0}} : AtomicOperands{0, {0, 0}};
}

}  // namespace

void clear_unroll_hints(std::vector<uint32_t>& words) {
  constexpr uint32_t kUnroll = 0x1;
  for (const Inst& in : instructions(words))
    if (in.op == kOpLoopMerge && in.count >= 4) words[in.at + 3] &= ~kUnroll;
}

bool coherence_at_barriers(std::vector<uint32_t>& words) {
  const std::vector<Inst> insts = instructions(words);
  bool vulkan_model = false;
  std::unordered_set<uint32_t> pointer_types, pointers;  // to workgroup memory
  std::unordered_map<uint32_t, size_t> constants;        // id -> instruction (OpConstant)
  for (size_t n = 0; n < insts.size(); ++n) {
    const Inst& in = insts[n];
    const uint32_t* w = &words[in.at];
    if (in.op == kOpMemoryModel && in.count == 3) vulkan_model = w[2] == kMemoryModelVulkan;
    if (in.op == kOpTypePointer && in.count == 4 && w[2] == kStorageWorkgroup)
      pointer_types.insert(w[1]);
    if (in.op == kOpConstant && in.count == 4) constants[w[2]] = n;
    bool typed_pointer = in.op == kOpVariable || in.op == kOpFunctionParameter ||
                         in.op == kOpAccessChain || in.op == kOpInBoundsAccessChain ||
                         in.op == kOpPtrAccessChain || in.op == kOpInBoundsPtrAccessChain ||
                         in.op == kOpCopyObject || in.op == kOpSelect || in.op == kOpPhi;
    if (typed_pointer && in.count >= 3 && pointer_types.count(w[1])) pointers.insert(w[2]);
  }
  if (!vulkan_model || pointers.empty()) return false;

  // The accesses to rewrite, with their new masks.
  std::unordered_map<size_t, uint32_t> new_mask;  // instruction -> mask
  for (size_t n = 0; n < insts.size(); ++n) {
    const Inst& in = insts[n];
    const uint32_t* w = &words[in.at];
    if ((in.op == kOpCopyMemory || in.op == kOpCopyMemorySized) &&
        (pointers.count(w[1]) || pointers.count(w[2])))
      return false;  // (glslang writes none into these kernels)
    // An atomic that orders workgroup memory (acquire or release: synchronisation through it
    // rather than a barrier) would lose the per-access operations it relies on; relaxed ones
    // (common.glsl's workgroup_min_max) order nothing.
    if (const AtomicOperands a = atomic_operands(in.op); a.pointer) {
      if (in.count <= a.semantics[0] || !pointers.count(w[a.pointer])) continue;
      for (uint32_t at : a.semantics) {
        if (at == 0) continue;
        if (in.count <= at) return false;
        auto c = constants.find(w[at]);
        if (c == constants.end()) return false;
        if (words[insts[c->second].at + 3] & (kAcquire | kRelease | kAcquireRelease | kSeqCst))
          return false;
      }
      continue;
    }
    auto [pointer, mask_at] = access_operands(in.op);
    if (pointer == 0 || in.count <= mask_at || !pointers.count(w[pointer])) continue;
    uint32_t mask = w[mask_at];
    if (mask & ~kKnownMemoryOperands) return false;
    uint32_t extra = ((mask & kAligned) != 0) + ((mask & kMakePointerAvailable) != 0) +
                     ((mask & kMakePointerVisible) != 0);
    if (in.count != mask_at + 1 + extra) return false;
    if (mask & (kMakePointerAvailable | kMakePointerVisible))
      new_mask[n] = mask & ~(kMakePointerAvailable | kMakePointerVisible);
  }
  if (new_mask.empty()) return false;

  // The barriers that order workgroup memory, each with a constant of its semantics that adds
  // the availability and visibility operations; new constants go after the ones they extend.
  uint32_t bound = words[3];
  std::map<std::pair<size_t, uint32_t>, uint32_t> made;  // (constant, semantics) -> id
  std::unordered_map<size_t, uint32_t> new_semantics;    // barrier -> its constant's id
  for (size_t n = 0; n < insts.size(); ++n) {
    const Inst& in = insts[n];
    if (in.op != kOpControlBarrier && in.op != kOpMemoryBarrier) continue;
    uint32_t at = in.op == kOpControlBarrier ? 3 : 2;
    if (in.count != at + 1) return false;
    auto c = constants.find(words[in.at + at]);
    if (c == constants.end()) return false;  // a specialization constant, say
    uint32_t semantics = words[insts[c->second].at + 3];
    if (!(semantics & kWorkgroupMemory)) continue;
    uint32_t add = 0;
    if (semantics & (kRelease | kAcquireRelease)) add |= kMakeAvailable;
    if (semantics & (kAcquire | kAcquireRelease)) add |= kMakeVisible;
    if ((semantics | add) == semantics) continue;
    auto [it, fresh] = made.try_emplace({c->second, semantics | add}, bound);
    if (fresh) ++bound;
    new_semantics[n] = it->second;
  }

  std::vector<uint32_t> out(words.begin(), words.begin() + kHeader);
  out[3] = bound;
  for (size_t n = 0; n < insts.size(); ++n) {
    const Inst& in = insts[n];
    const uint32_t* w = &words[in.at];
    if (auto m = new_mask.find(n); m != new_mask.end()) {
      uint32_t mask_at = access_operands(in.op).second, mask = w[mask_at];
      std::vector<uint32_t> inst(w, w + mask_at);
      inst.push_back(m->second);
      uint32_t next = mask_at + 1;
      if (mask & kAligned) inst.push_back(w[next++]);  // the dropped scopes follow it
      inst[0] = (uint32_t(inst.size()) << 16) | in.op;
      out.insert(out.end(), inst.begin(), inst.end());
      continue;
    }
    size_t first = out.size();
    out.insert(out.end(), w, w + in.count);
    if (auto s = new_semantics.find(n); s != new_semantics.end())
      out[first + (in.op == kOpControlBarrier ? 3 : 2)] = s->second;
    if (in.op == kOpConstant)
      for (const auto& [key, id] : made)
        if (key.first == n) out.insert(out.end(), {(4u << 16) | kOpConstant, w[1], id, key.second});
  }
  words = std::move(out);
  return true;
}

bool spirv_as_built() {
  const char* env = std::getenv("FLASHVK_SPIRV_AS_BUILT");
  return env && *env && std::strcmp(env, "0") != 0;
}

}  // namespace flashvk::detail
