#pragma once
// Tensors: float32 data on the host, and device buffers with a shape and a storage type.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

namespace flashvk {

class Context;

enum class DType { f32, f16 };
const char* dtype_name(DType dtype);
size_t dtype_size(DType dtype);

/// Row-major float32 data with its shape, as read from or written to .npy files.
struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  HostTensor() = default;
  HostTensor(std::vector<int64_t> dims, std::vector<float> values = {});
  int64_t numel() const;
  float& at(std::initializer_list<int64_t> index);
  float at(std::initializer_list<int64_t> index) const;
};

int64_t numel(const std::vector<int64_t>& shape);

/// PyTorch's boolean attn_mask (true = attend) as an additive mask of the same shape
/// (AttentionParams::mask): 0 where `attend` is nonzero, -inf elsewhere.
HostTensor bool_mask(const std::vector<uint8_t>& attend, std::vector<int64_t> shape);
std::string shape_string(const std::vector<int64_t>& shape);

/// A device buffer holding a tensor in `dtype` storage. Move-only; the Context must outlive it.
class Tensor {
 public:
  Tensor();
  Tensor(Context& ctx, std::vector<int64_t> shape, DType dtype);
  static Tensor upload(Context& ctx, const HostTensor& host, DType dtype);
  HostTensor download() const;

  Tensor(Tensor&&) noexcept;
  Tensor& operator=(Tensor&&) noexcept;
  ~Tensor();

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  VkBuffer buffer() const;
  uint64_t bytes() const;
  bool empty() const { return buffer_ == nullptr; }
  Context* context() const { return ctx_; }

 private:
  struct Storage;
  Context* ctx_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  std::unique_ptr<Storage> buffer_;
};

/// IEEE half-precision conversion, round to nearest even.
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);

}  // namespace flashvk
