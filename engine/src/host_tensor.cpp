// Host-side tensor helpers: shapes, HostTensor, fp16 conversion (the storage formats are
// formats.cpp's). No Vulkan here, so the .npy reader and its fuzz target can use them alone.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "flashvk/error.hpp"
#include "flashvk/tensor.hpp"

namespace flashvk {

HostTensor bool_mask(const std::vector<uint8_t>& attend, std::vector<int64_t> shape) {
  if (int64_t(attend.size()) != numel(shape))
    throw Error("bool_mask: " + std::to_string(attend.size()) + " values for shape " +
                shape_string(shape));
  HostTensor m(std::move(shape));
  for (size_t i = 0; i < attend.size(); ++i)
    m.data[i] = attend[i] ? 0.0f : -std::numeric_limits<float>::infinity();
  return m;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

HostTensor::HostTensor(std::vector<int64_t> dims, std::vector<float> values)
    : shape(std::move(dims)), data(std::move(values)) {
  if (data.empty()) data.assign(static_cast<size_t>(flashvk::numel(shape)), 0.0f);
  if (static_cast<int64_t>(data.size()) != flashvk::numel(shape))
    throw Error("HostTensor: " + std::to_string(data.size()) + " values do not fill shape " +
                shape_string(shape));
}

int64_t HostTensor::numel() const {
  return flashvk::numel(shape);
}

namespace {
size_t flat_index(const std::vector<int64_t>& shape, std::initializer_list<int64_t> index) {
  if (index.size() != shape.size()) throw Error("HostTensor::at: wrong number of indices");
  size_t flat = 0;
  size_t i = 0;
  for (int64_t x : index) flat = flat * static_cast<size_t>(shape[i++]) + static_cast<size_t>(x);
  return flat;
}
}  // namespace

float& HostTensor::at(std::initializer_list<int64_t> index) {
  return data[flat_index(shape, index)];
}
float HostTensor::at(std::initializer_list<int64_t> index) const {
  return data[flat_index(shape, index)];
}

uint16_t float_to_half(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = static_cast<int>(exp) - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to infinity
  if (e <= 0) {                                               // subnormal or zero
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    uint32_t shift = static_cast<uint32_t>(14 - e);
    uint32_t half = mant >> shift;
    uint32_t rest = mant & ((1u << shift) - 1u);
    uint32_t mid = 1u << (shift - 1u);
    if (rest > mid || (rest == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return static_cast<uint16_t>(sign | half);
}

float half_to_float(uint16_t bits) {
  uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

}  // namespace flashvk
