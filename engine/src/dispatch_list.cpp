#include "dispatch_list.hpp"

#include <cstring>
#include <string>

#include "flashvk/error.hpp"

namespace flashvk::detail {

DispatchList::DispatchList(ContextImpl& impl) : impl_(impl) {
  VkDescriptorPoolSize sizes[] = {{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 8 * (kBindings + 1)},
                                  {VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, 8 * kTexelBindings},
                                  {VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, 8}};
  VkDescriptorPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pool_info.maxSets = 8;  // at most 4 so far: RoPE's or an append's 3 and attention's 1
  pool_info.poolSizeCount = 3;
  pool_info.pPoolSizes = sizes;
  check(vkCreateDescriptorPool(impl_.device, &pool_info, nullptr, &pool_),
        "vkCreateDescriptorPool");
  objects_created();
  if (impl_.timestamp_bits > 0 && impl_.info.timestamps) {
    VkQueryPoolCreateInfo query_info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    query_info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    query_info.queryCount = 2;
    VkResult r = vkCreateQueryPool(impl_.device, &query_info, nullptr, &queries_);
    if (r != VK_SUCCESS) {  // the destructor does not run for a throwing constructor
      vkDestroyDescriptorPool(impl_.device, pool_, nullptr);
      objects_destroyed();
      check(r, "vkCreateQueryPool");
    }
    objects_created();
  }
}

DispatchList::~DispatchList() {
  uint64_t destroyed = sets_;  // freed with their pool
  if (queries_) {
    vkDestroyQueryPool(impl_.device, queries_, nullptr);
    ++destroyed;
  }
  if (pool_) {
    vkDestroyDescriptorPool(impl_.device, pool_, nullptr);
    ++destroyed;
  }
  objects_destroyed(destroyed);
}

VkDescriptorSet DispatchList::make_set(const Bindings& buffers, VkBuffer lengths,
                                       const TexelViews& texel_views, Range flex_table) {
  VkDescriptorSetAllocateInfo alloc{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  alloc.descriptorPool = pool_;
  alloc.descriptorSetCount = 1;
  alloc.pSetLayouts = &impl_.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(impl_.device, &alloc, &set), "vkAllocateDescriptorSets");
  objects_created();
  ++sets_;
  std::array<VkDescriptorBufferInfo, kBindings> infos{};
  std::array<VkWriteDescriptorSet, kBindings> writes{};
  for (uint32_t i = 0; i < kBindings; ++i) {
    infos[i] = {buffers[i].buffer, buffers[i].offset, buffers[i].bytes};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(impl_.device, kBindings, writes.data(), 0, nullptr);
  VkDescriptorBufferInfo length_info{lengths ? lengths : impl_.dummy.handle(), 0, 16};
  VkWriteDescriptorSet length_write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  length_write.dstSet = set;
  length_write.dstBinding = kLengthsBinding;
  length_write.descriptorCount = 1;
  length_write.descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER;
  length_write.pBufferInfo = &length_info;
  vkUpdateDescriptorSets(impl_.device, 1, &length_write, 0, nullptr);
  // Exactly the table and its fault word: the shaders take the table's length from the range.
  VkDescriptorBufferInfo table_info{flex_table.buffer ? flex_table.buffer : impl_.dummy.handle(),
                                    flex_table.offset, flex_table.buffer ? flex_table.bytes : 16};
  VkWriteDescriptorSet table_write = length_write;
  table_write.dstBinding = kFlexTableBinding;
  table_write.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
  table_write.pBufferInfo = &table_info;
  vkUpdateDescriptorSets(impl_.device, 1, &table_write, 0, nullptr);
  if (!texel_views[0]) return set;
  std::array<VkWriteDescriptorSet, kTexelBindings> texel_writes{};
  for (uint32_t i = 0; i < kTexelBindings; ++i) {
    texel_writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    texel_writes[i].dstSet = set;
    texel_writes[i].dstBinding = kBindings + i;
    texel_writes[i].descriptorCount = 1;
    texel_writes[i].descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
    texel_writes[i].pTexelBufferView = &texel_views[i];
  }
  vkUpdateDescriptorSets(impl_.device, kTexelBindings, texel_writes.data(), 0, nullptr);
  return set;
}

void DispatchList::add(VkPipeline pipeline, VkDescriptorSet set, std::array<uint32_t, 3> groups,
                       const void* push_data, uint32_t push_bytes) {
  const char* axis[] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i)
    if (groups[i] > impl_.info.max_workgroup_count[i])
      throw Error(std::string("attention needs ") + std::to_string(groups[i]) +
                  " workgroups along " + axis[i] + ", more than the device's " +
                  "maxComputeWorkGroupCount[" + std::to_string(i) + "] (" +
                  std::to_string(impl_.info.max_workgroup_count[i]) + ")");
  Dispatch d;
  d.pipeline = pipeline;
  d.set = set;
  d.groups = groups;
  std::memcpy(d.push.data(), push_data, push_bytes);
  d.push_bytes = push_bytes;
  steps_.push_back(d);
}

void DispatchList::add_barrier() {
  steps_.push_back(Dispatch{});
}

void DispatchList::add_fill(Range range, uint32_t word) {
  fills_.emplace_back(range, word);
}

void DispatchList::record(VkCommandBuffer cmd) const {
  if (queries_) {
    vkCmdResetQueryPool(cmd, queries_, 0, 2);
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, 0);
  }
  // The fills: after the previous run's dispatches (the barrier that ends every recording
  // orders its shaders' accesses before later transfers), before this run's.
  for (const auto& [range, word] : fills_)
    vkCmdFillBuffer(cmd, range.buffer, range.offset, range.bytes, word);
  if (!fills_.empty()) {
    VkMemoryBarrier filled{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    filled.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    filled.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                         0, 1, &filled, 0, nullptr, 0, nullptr);
  }
  for (const Dispatch& d : steps_) {
    if (!d.pipeline) {
      compute_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                      VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      continue;
    }
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline);
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, impl_.pipeline_layout, 0, 1,
                            &d.set, 0, nullptr);
    vkCmdPushConstants(cmd, impl_.pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d.push_bytes,
                       d.push.data());
    std::array<uint32_t, 3> groups = d.groups;
    if (injected("vkCmdDispatch") != VK_SUCCESS) {
      // Test builds (testing::inject_failure): the dispatch as a device lost part-way through it
      // would leave its buffers, half its workgroups along its last axis of several run.
      int axis = groups[2] > 1 ? 2 : groups[1] > 1 ? 1 : 0;
      groups[axis] /= 2;
    }
    vkCmdDispatch(cmd, groups[0], groups[1], groups[2]);
  }
  if (queries_) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 1);
  // Outputs become visible to whatever comes next: shaders, copies or the host.
  compute_barrier(cmd,
                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                      VK_PIPELINE_STAGE_HOST_BIT,
                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                      VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT |
                      VK_ACCESS_HOST_READ_BIT);
}

double DispatchList::gpu_ms() const {
  if (!queries_) return 0.0;
  uint64_t stamps[2] = {0, 0};
  VkResult r = vkGetQueryPoolResults(impl_.device, queries_, 0, 2, sizeof(stamps), stamps,
                                     sizeof(uint64_t), VK_QUERY_RESULT_64_BIT);
  if (r != VK_SUCCESS) return 0.0;
  uint64_t valid = impl_.timestamp_bits >= 64 ? ~0ull : ((1ull << impl_.timestamp_bits) - 1);
  uint64_t ticks = (stamps[1] - stamps[0]) & valid;
  return double(ticks) * impl_.info.timestamp_period_ns * 1e-6;
}

}  // namespace flashvk::detail
