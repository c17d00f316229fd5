#include <bit>
#include <cmath>
#include <cstring>
#include <utility>

#include "flashvk/context.hpp"
#include "flashvk/tensor.hpp"
#include "vk.hpp"

namespace flashvk {
namespace detail {

Buffer::Buffer(ContextImpl& ctx, uint64_t bytes, bool host_visible) : ctx_(&ctx), bytes_(bytes) {
  ctx.check_runs("memory allocated");
  const DeviceInfo& info = ctx.info;
  if (bytes > info.max_allocation)
    throw Error("a buffer of " + std::to_string(bytes) + " bytes exceeds the device's " +
                "maxMemoryAllocationSize (" + std::to_string(info.max_allocation) + " bytes)");
  VkBufferCreateInfo buffer_info{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  buffer_info.size = std::max<uint64_t>(bytes, 16);
  buffer_info.usage = kTensorUsage | VK_BUFFER_USAGE_UNIFORM_BUFFER_BIT;
  buffer_info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
  check(vkCreateBuffer(ctx.device, &buffer_info, nullptr, &buffer_), "vkCreateBuffer");
  objects_created();
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(ctx.device, buffer_, &req);
  // Prefer memory that is both device-local and mappable (integrated GPUs, lavapipe, ReBAR):
  // then uploads are plain copies. Otherwise device-local, reached through a staging buffer.
  const VkMemoryPropertyFlags mappable =
      VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
  uint32_t type = ctx.memory_type(
      req.memoryTypeBits, mappable | (host_visible ? 0 : VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT));
  if (type == UINT32_MAX && !host_visible)
    type = ctx.memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  if (type == UINT32_MAX) {
    release();
    throw Error("no suitable Vulkan memory type for a storage buffer");
  }
  VkMemoryAllocateInfo alloc{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  alloc.allocationSize = req.size;
  alloc.memoryTypeIndex = type;
  VkResult result = injected("vkAllocateMemory");
  if (result == VK_SUCCESS) result = vkAllocateMemory(ctx.device, &alloc, nullptr, &memory_);
  if (result != VK_SUCCESS) {
    release();
    throw VulkanError(result, "vkAllocateMemory(" + std::to_string(req.size) + " bytes)");
  }
  objects_created();
  allocated_ = req.size;
  device_memory(int64_t(allocated_));
  try {
    check(vkBindBufferMemory(ctx.device, buffer_, memory_, 0), "vkBindBufferMemory");
    if ((ctx.memory.memoryTypes[type].propertyFlags & mappable) == mappable)
      check(vkMapMemory(ctx.device, memory_, 0, VK_WHOLE_SIZE, 0, &mapped_), "vkMapMemory");
  } catch (...) {
    release();  // a constructor that throws runs no destructor
    throw;
  }
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    ctx_ = std::exchange(other.ctx_, nullptr);
    buffer_ = std::exchange(other.buffer_, VK_NULL_HANDLE);
    memory_ = std::exchange(other.memory_, VK_NULL_HANDLE);
    bytes_ = std::exchange(other.bytes_, 0);
    mapped_ = std::exchange(other.mapped_, nullptr);
    allocated_ = std::exchange(other.allocated_, 0);
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() {
  if (!ctx_) return;
  if (buffer_) vkDestroyBuffer(ctx_->device, buffer_, nullptr);
  if (memory_) vkFreeMemory(ctx_->device, memory_, nullptr);  // unmaps too
  objects_destroyed((buffer_ ? 1u : 0u) + (memory_ ? 1u : 0u));
  device_memory(-int64_t(std::exchange(allocated_, 0)));
  buffer_ = VK_NULL_HANDLE;
  memory_ = VK_NULL_HANDLE;
  mapped_ = nullptr;
}

void Buffer::write(const void* data, uint64_t bytes, uint64_t offset) {
  if (mapped_) {
    std::memcpy(static_cast<char*>(mapped_) + offset, data, bytes);
    return;
  }
  copy_to_buffer(*ctx_, buffer_, offset, data, bytes);
}

void Buffer::read(void* data, uint64_t bytes, uint64_t offset) const {
  if (mapped_) {
    std::memcpy(data, static_cast<const char*>(mapped_) + offset, bytes);
    return;
  }
  copy_from_buffer(*ctx_, buffer_, offset, data, bytes);
}

void Buffer::fill(uint32_t word) {
  if (mapped_) {
    auto* words = static_cast<uint32_t*>(mapped_);
    for (uint64_t i = 0; i < bytes_ / 4; ++i) words[i] = word;
    return;
  }
  ctx_->submit_and_wait(
      [&](VkCommandBuffer cmd) { vkCmdFillBuffer(cmd, buffer_, 0, VK_WHOLE_SIZE, word); });
}

// Through a host-visible staging buffer, then a barrier: the copy's writes are visible to the
// kernels and copies of later submissions.
void record_copy_in(VkCommandBuffer cmd, VkBuffer src, uint64_t src_offset, VkBuffer dst,
                    uint64_t dst_offset, uint64_t bytes) {
  VkBufferCopy region{src_offset, dst_offset, bytes};
  vkCmdCopyBuffer(cmd, src, dst, 1, &region);
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                          VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1,
                       &barrier, 0, nullptr, 0, nullptr);
}

void record_copy_out(VkCommandBuffer cmd, VkBuffer src, uint64_t src_offset, VkBuffer dst,
                     uint64_t dst_offset, uint64_t bytes) {
  VkMemoryBarrier before{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  before.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  before.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, &before, 0, nullptr, 0, nullptr);
  VkBufferCopy region{src_offset, dst_offset, bytes};
  vkCmdCopyBuffer(cmd, src, dst, 1, &region);
  VkMemoryBarrier after{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  after.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
  after.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                       &after, 0, nullptr, 0, nullptr);
}

void copy_to_buffer(ContextImpl& ctx, VkBuffer dst, uint64_t offset, const void* data,
                    uint64_t bytes) {
  Buffer staging(ctx, bytes, true);
  std::memcpy(staging.mapped(), data, bytes);
  ctx.submit_and_wait(
      [&](VkCommandBuffer cmd) { record_copy_in(cmd, staging.handle(), 0, dst, offset, bytes); });
}

void copy_from_buffer(ContextImpl& ctx, VkBuffer src, uint64_t offset, void* data, uint64_t bytes) {
  Buffer staging(ctx, bytes, true);
  ctx.submit_and_wait(
      [&](VkCommandBuffer cmd) { record_copy_out(cmd, src, offset, staging.handle(), 0, bytes); });
  std::memcpy(data, staging.mapped(), bytes);
}

}  // namespace detail

// A buffer of the tensor's own, or (views) the application's buffer, offset and usage.
struct Tensor::Storage {
  detail::Buffer buffer;
  VkBuffer foreign = VK_NULL_HANDLE;
  uint64_t offset = 0, bytes = 0;
  VkBufferUsageFlags usage = kTensorUsage;
  int64_t rows = -1;             // rows of a matrix in memory (prefix views); -1: shape[-2]
  std::vector<int64_t> strides;  // element strides of each dimension
  int64_t span = 0;              // values from offset to the last one held, plus one
};

namespace {

std::vector<int64_t> dense_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

// Values from the first to the last of a tensor of `shape` laid out by `strides`.
int64_t strided_span(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) return 0;
    last += (shape[i] - 1) * strides[i];
  }
  return last + 1;
}

// A view's strides: one per dimension, the last 1, the others whole rows (kernels address rows).
void check_strides(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  std::string what = "Tensor::view with strides " + shape_string(strides) + " for shape " +
                     shape_string(shape) + ": ";
  if (strides.size() != shape.size())
    throw Error(what + "give one stride per dimension (" + std::to_string(shape.size()) + ")");
  if (shape.empty()) return;
  if (strides.back() != 1)
    throw Error(what + "the last stride must be 1 (the values of a row are contiguous)");
  int64_t row = shape.back();
  for (size_t i = 0; i + 1 < strides.size(); ++i)
    if (strides[i] < 0 || (row > 0 && strides[i] % row != 0))
      throw Error(what +
                  "every stride but the last must be a whole number of rows, a "
                  "non-negative multiple of the last dimension (" +
                  std::to_string(row) + ")");
}

// Checks what every tensor needs of its dtype and shape; returns the bytes its values take,
// buffer_bytes(): whole 32-bit words (kernels read K and V in storage of their own as words, and
// an odd count of blocks or of halves ends mid-word), whole 16 bytes for the block formats.
uint64_t tensor_bytes(Context& ctx, const std::vector<int64_t>& shape, DType dtype) {
  if (dtype == DType::f16 && !ctx.impl().fp16_enabled)
    throw Error("fp16 storage needs storageBuffer16BitAccess, which device " + ctx.device().name +
                " does not offer (or the adopted device did not enable)");
  for (int64_t d : shape)
    if (d < 0) throw Error("negative dimension in shape " + shape_string(shape));
  check_blocks(shape, dtype);
  return buffer_bytes(dtype, flashvk::numel(shape));
}

}  // namespace

Tensor::Tensor() = default;
Tensor::Tensor(Tensor&&) noexcept = default;
Tensor& Tensor::operator=(Tensor&&) noexcept = default;
Tensor::~Tensor() = default;

Tensor::Tensor(Context& ctx, std::vector<int64_t> shape, DType dtype)
    : ctx_(&ctx), shape_(std::move(shape)), dtype_(dtype) {
  uint64_t bytes = tensor_bytes(ctx, shape_, dtype);
  // Only the allocation limit here (Buffer checks it): how much one binding may see depends on
  // how a kernel binds the tensor, which the plan checks (register tiles read K and V as texels).
  buffer_ = std::make_unique<Storage>(Storage{detail::Buffer(ctx.impl(), bytes)});
  buffer_->strides = dense_strides(shape_);
  buffer_->span = flashvk::numel(shape_);
}

Tensor Tensor::view(Context& ctx, VkBuffer buffer, uint64_t offset, std::vector<int64_t> shape,
                    DType dtype, VkBufferUsageFlags usage, std::vector<int64_t> strides) {
  if (buffer == VK_NULL_HANDLE) throw Error("Tensor::view of a null VkBuffer");
  if (!(usage & VK_BUFFER_USAGE_STORAGE_BUFFER_BIT))
    throw Error(
        "Tensor::view: the kernels bind tensors as storage buffers; a buffer without "
        "VK_BUFFER_USAGE_STORAGE_BUFFER_BIT cannot hold one");
  uint64_t align = ctx.device().min_storage_offset_alignment;
  if (align > 1 && offset % align)
    throw Error("Tensor::view at byte offset " + std::to_string(offset) + ": " + ctx.device().name +
                " binds storage buffers at multiples of " + std::to_string(align) +
                " bytes (minStorageBufferOffsetAlignment)");
  Tensor t;
  t.ctx_ = &ctx;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  uint64_t bytes = tensor_bytes(ctx, t.shape_, dtype);
  int64_t span = flashvk::numel(t.shape_);
  if (strides.empty()) {
    strides = dense_strides(t.shape_);
  } else {
    check_strides(t.shape_, strides);
    span = strided_span(t.shape_, strides);
    bytes = buffer_bytes(dtype, span);
  }
  t.buffer_ = std::make_unique<Storage>(
      Storage{detail::Buffer(), buffer, offset, bytes, usage, -1, std::move(strides), span});
  return t;
}

Tensor Tensor::prefix(int64_t n) const {
  if (!buffer_) throw Error("prefix of an empty tensor");
  if (shape_.size() < 2) throw Error("prefix needs a tensor of rank 2 or more ([.., N, d])");
  if (n < 0 || n > shape_[shape_.size() - 2])
    throw Error("prefix of " + std::to_string(n) + " rows of a tensor of shape " +
                shape_string(shape_) + ": at most " + std::to_string(shape_[shape_.size() - 2]));
  Tensor t;
  t.ctx_ = ctx_;
  t.shape_ = shape_;
  t.shape_[t.shape_.size() - 2] = n;
  t.dtype_ = dtype_;
  t.buffer_ = std::make_unique<Storage>(Storage{detail::Buffer(), buffer(), offset(), bytes(),
                                                usage(), row_capacity(), strides(), span()});
  return t;
}

void Tensor::write(const HostTensor& host) {
  if (!buffer_) throw Error("write to an empty tensor");
  if (host.data.size() != uint64_t(flashvk::numel(host.shape)))
    throw Error("write of a host tensor of shape " + shape_string(host.shape) + " holding " +
                std::to_string(host.data.size()) + " values");
  if (host.shape != shape_)
    throw Error("write of a " + shape_string(host.shape) + " tensor into one of shape " +
                shape_string(shape_));
  if (dtype_ == DType::f32) return write_bytes(host.data.data(), host.data.size() * 4);
  std::vector<uint8_t> bytes = encode(host.data, dtype_);
  write_bytes(bytes.data(), bytes.size());
}

void Tensor::write_storage(const std::vector<uint8_t>& bytes) {
  if (!buffer_) throw Error("write to an empty tensor");
  uint64_t want = storage_bytes(dtype_, flashvk::numel(shape_));
  if (bytes.size() != want)
    throw Error("write_storage of " + std::to_string(bytes.size()) + " bytes into a " +
                shape_string(shape_) + " tensor of " + dtype_name(dtype_) + ", which takes " +
                std::to_string(want));
  write_bytes(bytes.data(), bytes.size());
}

void Tensor::write_bytes(const void* data, uint64_t size) {
  if (!is_dense())
    throw Error(is_prefix() ? "write into a prefix() view, whose rows are not contiguous; write "
                              "the whole tensor it views"
                            : "write into a strided view, whose values are not contiguous; write "
                              "its buffer as the application lays it out");
  if (!(usage() & VK_BUFFER_USAGE_TRANSFER_DST_BIT))
    throw Error("write into a view whose buffer lacks VK_BUFFER_USAGE_TRANSFER_DST_BIT");
  if (size == 0) return;
  if (buffer_->foreign)
    detail::copy_to_buffer(ctx_->impl(), buffer_->foreign, buffer_->offset, data, size);
  else
    buffer_->buffer.write(data, size);
}

struct Staging::Memory {
  detail::Buffer buffer;
};

Staging::Staging(Context& ctx, uint64_t bytes)
    : memory_(new Memory{detail::Buffer(ctx.impl(), bytes, true)}) {
  if (!memory_->buffer.mapped()) throw Error("Staging: the device has no host-visible memory");
}
Staging::Staging(Staging&&) noexcept = default;
Staging& Staging::operator=(Staging&&) noexcept = default;
Staging::~Staging() = default;

void* Staging::data() const {
  return memory_ ? memory_->buffer.mapped() : nullptr;
}
uint64_t Staging::bytes() const {
  return memory_ ? memory_->buffer.bytes() : 0;
}

namespace {

void check_region(const Staging& staging, uint64_t offset, uint64_t bytes, const char* what) {
  if (!staging.data()) throw Error(std::string("Staging::") + what + " of an empty staging");
  if (offset > staging.bytes() || bytes > staging.bytes() - offset)
    throw Error(std::string("Staging::") + what + ": " + std::to_string(bytes) +
                " bytes at offset " + std::to_string(offset) + " pass the end of the staging (" +
                std::to_string(staging.bytes()) + " bytes); make it at least " +
                std::to_string(offset + bytes) + " bytes");
}

void check_copyable(const Tensor& t, VkBufferUsageFlags need, const char* what) {
  if (t.empty()) throw Error(std::string("Staging::") + what + " of an empty tensor");
  if (!t.is_dense())
    throw Error(std::string("Staging::") + what + " of a " +
                (t.is_prefix() ? "prefix()" : "strided") +
                " view, whose values are not contiguous; copy the whole tensor or buffer it views");
  if (!(t.usage() & need))
    throw Error(std::string("Staging::") + what + " of a view whose buffer lacks " +
                (need == VK_BUFFER_USAGE_TRANSFER_DST_BIT ? "VK_BUFFER_USAGE_TRANSFER_DST_BIT"
                                                          : "VK_BUFFER_USAGE_TRANSFER_SRC_BIT"));
}

}  // namespace

uint64_t Staging::write(const HostTensor& host, DType dtype, uint64_t offset) {
  if (host.data.size() != uint64_t(flashvk::numel(host.shape)))
    throw Error("Staging::write of a host tensor of shape " + shape_string(host.shape) +
                " holding " + std::to_string(host.data.size()) + " values");
  check_blocks(host.shape, dtype);
  uint64_t size = buffer_bytes(dtype, flashvk::numel(host.shape));
  check_region(*this, offset, size, "write");
  auto* at = static_cast<uint8_t*>(data()) + offset;
  if (dtype == DType::f32) {
    std::memcpy(at, host.data.data(), host.data.size() * 4);
  } else {
    std::vector<uint8_t> bytes = encode(host.data, dtype);
    std::memcpy(at, bytes.data(), bytes.size());
  }
  return size;
}

HostTensor Staging::read(const std::vector<int64_t>& shape, DType dtype, uint64_t offset) const {
  check_blocks(shape, dtype);
  int64_t n = flashvk::numel(shape);
  uint64_t size = storage_bytes(dtype, n);
  check_region(*this, offset, size, "read");
  const auto* at = static_cast<const uint8_t*>(data()) + offset;
  HostTensor out(shape);
  if (dtype == DType::f32)
    std::memcpy(out.data.data(), at, size);
  else
    out.data = decode(std::vector<uint8_t>(at, at + size), dtype, n);
  return out;
}

void Staging::record_upload(VkCommandBuffer cmd, const Tensor& dst, uint64_t offset) const {
  check_copyable(dst, VK_BUFFER_USAGE_TRANSFER_DST_BIT, "record_upload");
  check_region(*this, offset, dst.bytes(), "record_upload");
  if (dst.bytes() > 0)
    detail::record_copy_in(cmd, memory_->buffer.handle(), offset, dst.buffer(), dst.offset(),
                           dst.bytes());
}

void Staging::record_download(VkCommandBuffer cmd, const Tensor& src, uint64_t offset) const {
  check_copyable(src, VK_BUFFER_USAGE_TRANSFER_SRC_BIT, "record_download");
  check_region(*this, offset, src.bytes(), "record_download");
  if (src.bytes() > 0)
    detail::record_copy_out(cmd, src.buffer(), src.offset(), memory_->buffer.handle(), offset,
                            src.bytes());
}

Tensor Tensor::upload(Context& ctx, const HostTensor& host, DType dtype) {
  Tensor t(ctx, host.shape, dtype);
  t.write(host);
  return t;
}

HostTensor Tensor::download() const {
  if (!buffer_) throw Error("download of an empty tensor");
  if (!(usage() & VK_BUFFER_USAGE_TRANSFER_SRC_BIT))
    throw Error("download of a view whose buffer lacks VK_BUFFER_USAGE_TRANSFER_SRC_BIT");
  // All the values from offset() to the last (of the tensor a prefix() views, or a strided
  // view's span), from which the tensor's are then gathered.
  HostTensor all({span()});
  uint64_t size = storage_bytes(dtype_, span());
  if (size == 0) return HostTensor(shape_);
  auto read = [&](void* data) {
    if (buffer_->foreign)
      detail::copy_from_buffer(ctx_->impl(), buffer_->foreign, buffer_->offset, data, size);
    else
      buffer_->buffer.read(data, size);
  };
  if (dtype_ == DType::f32) {  // straight into the floats
    read(all.data.data());
  } else {
    std::vector<uint8_t> bytes(size);
    read(bytes.data());
    all.data = decode(bytes, dtype_, all.numel());
  }
  if (is_dense()) {
    all.shape = shape_;
    return all;
  }
  // Row by row: every stride but the last is a whole number of rows.
  HostTensor host(shape_);
  int64_t row = shape_.empty() ? 1 : shape_.back(), rows = row == 0 ? 0 : host.numel() / row;
  const std::vector<int64_t>& st = strides();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0, rest = r;
    for (size_t i = shape_.size() - 1; i-- > 0;) {
      at += rest % shape_[i] * st[i];
      rest /= shape_[i];
    }
    std::copy_n(all.data.begin() + at, row, host.data.begin() + r * row);
  }
  return host;
}

VkBuffer Tensor::buffer() const {
  if (!buffer_) return VK_NULL_HANDLE;
  return buffer_->foreign ? buffer_->foreign : buffer_->buffer.handle();
}
uint64_t Tensor::offset() const {
  return buffer_ ? buffer_->offset : 0;
}
uint64_t Tensor::bytes() const {
  if (!buffer_) return 0;
  return buffer_->foreign ? buffer_->bytes : buffer_->buffer.bytes();
}
int64_t Tensor::row_capacity() const {
  if (buffer_ && buffer_->rows >= 0) return buffer_->rows;
  return shape_.size() >= 2 ? shape_[shape_.size() - 2] : 1;
}
bool Tensor::is_prefix() const {
  return buffer_ && buffer_->rows >= 0 && buffer_->rows != shape_[shape_.size() - 2];
}
const std::vector<int64_t>& Tensor::strides() const {
  static const std::vector<int64_t> none;
  return buffer_ ? buffer_->strides : none;
}
int64_t Tensor::span() const {
  return buffer_ ? buffer_->span : 0;
}
bool Tensor::is_dense() const {
  if (!buffer_ || is_prefix()) return false;
  std::vector<int64_t> dense = dense_strides(shape_);
  for (size_t i = 0; i < shape_.size(); ++i)
    if (shape_[i] > 1 && buffer_->strides[i] != dense[i]) return false;
  return true;
}
bool Tensor::is_view() const {
  return buffer_ && buffer_->foreign;
}
VkBufferUsageFlags Tensor::usage() const {
  return buffer_ ? buffer_->usage : 0;
}

}  // namespace flashvk
