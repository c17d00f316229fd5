// Host-side tensor helpers: shapes, HostTensor, and the storage formats (fp16, bf16, q8_0, q4_0).
// No Vulkan here, so the .npy reader and its fuzz target can use them alone.
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

namespace {
constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16, DType::q8_0, DType::q4_0};
constexpr const char* kDTypeNames[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
constexpr int64_t kBlock = 32;

bool blocked(DType dtype) {
  return dtype == DType::q8_0 || dtype == DType::q4_0;
}

uint16_t float_to_bf16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((x >> 16) | 0x40u);  // stays a NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                         // nearest even
  return static_cast<uint16_t>(x >> 16);
}

// ggml's quantize_row_q8_0_ref and quantize_row_q4_0_ref, one block of 32 values: the quants
// go to q (q8_0: 32 bytes; q4_0: 16 bytes of nibbles), the fp16 scale is returned.
uint16_t quantize_block(const float* x, DType dtype, uint8_t* q) {
  if (dtype == DType::q8_0) {
    float amax = 0.0f;
    for (int64_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int64_t j = 0; j < kBlock; ++j)
      q[j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
    return float_to_half(d);
  }
  float amax = 0.0f, max = 0.0f;  // the value of largest magnitude, with its sign
  for (int64_t j = 0; j < kBlock; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int64_t j = 0; j < kBlock / 2; ++j) {
    auto nibble = [&](float v) {
      return static_cast<uint8_t>(
          std::min(15, static_cast<int>(static_cast<int8_t>(v * id + 8.5f))));
    };
    q[j] = static_cast<uint8_t>(nibble(x[j]) | nibble(x[j + kBlock / 2]) << 4);
  }
  return float_to_half(d);
}
}  // namespace

const char* dtype_name(DType dtype) {
  return kDTypeNames[static_cast<int>(dtype)];
}

DType parse_dtype(const std::string& name) {
  std::string valid;
  for (DType dtype : kDTypes) {
    if (name == dtype_name(dtype)) return dtype;
    valid += std::string(valid.empty() ? "" : ", ") + dtype_name(dtype);
  }
  throw Error("unknown dtype '" + name + "'; expected one of " + valid);
}

uint32_t dtype_block(DType dtype) {
  return blocked(dtype) ? uint32_t(kBlock) : 1u;
}

uint64_t storage_bytes(DType dtype, int64_t numel) {
  uint64_t n = static_cast<uint64_t>(numel);
  switch (dtype) {
    case DType::f32:
      return 4 * n;
    case DType::f16:
    case DType::bf16:
      return 2 * n;
    case DType::q8_0:
      return n + n / kBlock * 2;
    case DType::q4_0:
      return n / 2 + n / kBlock * 2;
  }
  return 4 * n;
}

uint64_t buffer_bytes(DType dtype, int64_t numel) {
  uint64_t align = dtype == DType::q8_0 || dtype == DType::q4_0 ? 16 : 4;
  return (storage_bytes(dtype, numel) + align - 1) / align * align;
}

std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  int64_t n = static_cast<int64_t>(values.size());
  if (n % dtype_block(dtype))
    throw Error(std::string(dtype_name(dtype)) + " stores blocks of 32 values; " +
                std::to_string(n) + " values are not a whole number of blocks");
  std::vector<uint8_t> bytes(storage_bytes(dtype, n));
  auto put16 = [&](uint64_t at, uint16_t x) { std::memcpy(bytes.data() + at, &x, 2); };
  if (dtype == DType::f32) {
    if (n) std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (dtype == DType::f16 || dtype == DType::bf16) {
    for (int64_t i = 0; i < n; ++i)
      put16(2 * uint64_t(i),
            dtype == DType::f16 ? float_to_half(values[i]) : float_to_bf16(values[i]));
  } else {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(values[i]))
        throw Error(std::string(dtype_name(dtype)) + " quantises finite values only; value " +
                    std::to_string(i) + " is " + std::to_string(values[i]));
    uint64_t quant_bytes = dtype == DType::q8_0 ? 32 : 16;
    uint64_t scales = uint64_t(n) / kBlock * quant_bytes;
    for (int64_t b = 0; b < n / kBlock; ++b)
      put16(scales + 2 * uint64_t(b),
            quantize_block(values.data() + b * kBlock, dtype, bytes.data() + b * quant_bytes));
  }
  return bytes;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype, int64_t numel) {
  if (bytes.size() != storage_bytes(dtype, numel) || numel % dtype_block(dtype))
    throw Error("decode: " + std::to_string(bytes.size()) + " bytes do not hold " +
                std::to_string(numel) + " values of " + dtype_name(dtype));
  std::vector<float> values(static_cast<size_t>(numel));
  auto get16 = [&](uint64_t at) {
    uint16_t x;
    std::memcpy(&x, bytes.data() + at, 2);
    return x;
  };
  if (dtype == DType::f32) {
    if (numel) std::memcpy(values.data(), bytes.data(), bytes.size());
  } else if (dtype == DType::f16 || dtype == DType::bf16) {
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t x = get16(2 * uint64_t(i));
      values[i] = dtype == DType::f16 ? half_to_float(x) : std::bit_cast<float>(uint32_t(x) << 16);
    }
  } else {
    uint64_t quant_bytes = dtype == DType::q8_0 ? 32 : 16;
    uint64_t scales = uint64_t(numel) / kBlock * quant_bytes;
    for (int64_t i = 0; i < numel; ++i) {
      int64_t b = i / kBlock, j = i % kBlock;
      float d = half_to_float(get16(scales + 2 * uint64_t(b)));
      const uint8_t* q = bytes.data() + b * quant_bytes;
      int quant = dtype == DType::q8_0 ? static_cast<int8_t>(q[j])
                                       : (j < 16 ? q[j] & 15 : q[j - 16] >> 4) - 8;
      values[i] = d * static_cast<float>(quant);
    }
  }
  return values;
}

void check_blocks(const std::vector<int64_t>& shape, DType dtype) {
  if (blocked(dtype) && (shape.empty() || shape.back() % kBlock))
    throw Error(std::string(dtype_name(dtype)) +
                " stores blocks of 32 values along the last dimension; shape " +
                shape_string(shape) + " has " +
                (shape.empty() ? std::string("none") : std::to_string(shape.back())));
}

HostTensor stored_values(const HostTensor& x, DType dtype) {
  if (dtype == DType::f32) return x;
  check_blocks(x.shape, dtype);
  return HostTensor(x.shape, decode(encode(x.data, dtype), dtype, x.numel()));
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
