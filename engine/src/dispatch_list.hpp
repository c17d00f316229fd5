#pragma once
// A list of dispatches and barriers with their descriptor sets and a timestamp pair, recorded
// into any command buffer, ours or the application's, as often as it is submitted. It holds
// the Vulkan objects that recording needs (a descriptor pool, a query pool) and nothing that
// depends on the call's lengths: those the kernels read from a uniform buffer when they run
// (Plan::set_keys, set_position), so a list recorded once serves every decode step.
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "vk.hpp"

namespace flashvk::detail {

/// One storage-buffer binding: a buffer, where its data starts and how many bytes a kernel may
/// see (VK_WHOLE_SIZE: to the buffer's end). A bare VkBuffer binds all of it.
struct Range {
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceSize offset = 0, bytes = VK_WHOLE_SIZE;
  Range() = default;
  Range(VkBuffer whole) : buffer(whole) {}  // NOLINT: implicit, a buffer binds whole
  Range(VkBuffer b, VkDeviceSize first, VkDeviceSize size)
      : buffer(b), offset(first), bytes(size) {}
};
using Bindings = std::array<Range, kBindings>;
using TexelViews = std::array<VkBufferView, kTexelBindings>;

struct Dispatch {
  VkPipeline pipeline = VK_NULL_HANDLE;  // null: a barrier
  VkDescriptorSet set = VK_NULL_HANDLE;
  std::array<uint32_t, 32> push{};
  uint32_t push_bytes = 0;
  std::array<uint32_t, 3> groups{1, 1, 1};
};

class DispatchList {
 public:
  explicit DispatchList(ContextImpl& impl);
  DispatchList(const DispatchList&) = delete;
  DispatchList& operator=(const DispatchList&) = delete;
  ~DispatchList();

  /// A descriptor set of the kernels' layout: the storage buffers, the lengths uniform buffer,
  /// where the first is not null the texel views (register tiles), and the user functions'
  /// table (a 16-byte placeholder where null).
  VkDescriptorSet make_set(const Bindings& buffers, VkBuffer lengths, const TexelViews& texels,
                           Range flex_table = {});
  /// Appends a dispatch of `groups` workgroups; throws where the device allows fewer.
  void add(VkPipeline pipeline, VkDescriptorSet set, std::array<uint32_t, 3> groups,
           const void* push_data, uint32_t push_bytes);
  /// Appends a barrier: the dispatches after it see what those before it wrote.
  void add_barrier();
  /// Fills `range` with `word` each time the list runs, before its first dispatch (all fills
  /// first, then one barrier): counters that every run must find at zero, whatever an earlier
  /// run that stopped part-way left in them.
  void add_fill(Range range, uint32_t word);
  /// Records the list, between two timestamps, then a barrier that makes the outputs visible to
  /// later shaders, transfers and the host.
  void record(VkCommandBuffer cmd) const;
  /// Milliseconds between the timestamps, once the recorded work has finished (0 without them).
  double gpu_ms() const;

 private:
  ContextImpl& impl_;
  VkDescriptorPool pool_ = VK_NULL_HANDLE;
  VkQueryPool queries_ = VK_NULL_HANDLE;
  uint64_t sets_ = 0;  // descriptor sets allocated from pool_ (freed with it)
  std::vector<Dispatch> steps_;
  std::vector<std::pair<Range, uint32_t>> fills_;
};

}  // namespace flashvk::detail
