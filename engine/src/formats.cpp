// The storage formats (formats.hpp): one row of kFormats each, and every host question about a
// format answered from it: names, sizes, encoding on upload and decoding.
#include "formats.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "flashvk/error.hpp"

namespace flashvk::detail {

namespace {

// Each block format's quantiser, as ggml's quantize_row_*_ref quantises one block of 32 values x
// (its quants into q as ggml's qs, its head into h: d, then m, then qh's two halves), and its
// decoder of value j. Step by step as ggml rounds, so that a cache reads as ggml's would.
void put_head(uint16_t* h, float d, float m, uint32_t qh, uint32_t halves) {
  h[0] = float_to_half(d);
  if (halves > 1) h[1] = float_to_half(m);
  if (halves > 2) h[2] = uint16_t(qh & 0xffffu), h[3] = uint16_t(qh >> 16);
}
float head_d(const uint16_t* h) {
  return half_to_float(h[0]);
}
// Of a 4-bit format, the nibble of value j: byte j % 16, low for j < 16, high for the rest.
int nibble(const uint8_t* q, uint32_t j) {
  return j < 16 ? q[j] & 15 : q[j - 16] >> 4;
}
// Of q5_0 and q5_1, value j's fifth bit from qh (head halves 2 and 3).
int fifth_bit(const uint16_t* h, uint32_t j) {
  uint32_t qh = uint32_t(h[2]) | uint32_t(h[3]) << 16;
  return int((qh >> j) & 1u) << 4;
}
// The value of largest magnitude, with its sign (0 for a block of zeros).
float signed_max(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), max = x[j];
  return max;
}
// Quants 0 .. levels - 1 of values j and j + 16 into byte j; the fifth bits into qh.
uint32_t pack_nibbles(const int* l, uint8_t* q) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((l[j] & 15) | (l[j + 16] & 15) << 4);
    qh |= uint32_t((l[j] >> 4) & 1) << j | uint32_t((l[j + 16] >> 4) & 1) << (j + 16);
  }
  return qh;
}

// q8_0: d = max|x| / 127, q = round(x / d).
void quantise_q8_0(const float* x, uint8_t* q, uint16_t* h) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j)
    q[j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(x[j] * id)));
  put_head(h, d, 0, 0, 1);
}
float dequantise_q8_0(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>(static_cast<int8_t>(q[j]));
}

// q4_0 and q5_0: d = (the value of largest magnitude, with its sign) / -(levels / 2), and
// q = x / d + levels / 2, truncated (after + 0.5) and capped at levels - 1.
template <int levels>
void quantise_symmetric(const float* x, uint8_t* q, uint16_t* h) {
  float d = signed_max(x) / float(-levels / 2), id = d != 0.0f ? 1.0f / d : 0.0f;
  int l[32];
  for (int j = 0; j < 32; ++j)
    l[j] = std::min(levels - 1, static_cast<int>(static_cast<int8_t>(x[j] * id + (levels / 2 + 0.5f))));
  uint32_t qh = pack_nibbles(l, q);
  put_head(h, d, 0, qh, levels == 16 ? 1 : 4);
}
// q4_1 and q5_1: d = (max - min) / (levels - 1), m = min, q = (x - m) / d rounded.
template <int levels>
void quantise_affine(const float* x, uint8_t* q, uint16_t* h) {
  float lo = x[0], hi = x[0];
  for (int j = 0; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  float d = (hi - lo) / float(levels - 1), id = d != 0.0f ? 1.0f / d : 0.0f;
  int l[32];
  for (int j = 0; j < 32; ++j)
    l[j] = std::min(levels - 1, static_cast<int>(static_cast<int8_t>((x[j] - lo) * id + 0.5f)));
  uint32_t qh = pack_nibbles(l, q);
  put_head(h, d, lo, qh, levels == 16 ? 2 : 4);
}
float dequantise_q4_0(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>(nibble(q, j) - 8);
}
float dequantise_q4_1(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>(nibble(q, j)) + half_to_float(h[1]);
}
float dequantise_q5_0(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>((nibble(q, j) | fifth_bit(h, j)) - 16);
}
float dequantise_q5_1(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>(nibble(q, j) | fifth_bit(h, j)) + half_to_float(h[1]);
}

// iq4_nl: ggml's kvalues_iq4nl, and quantize_row_iq4_nl_ref's one step: each value to the level
// nearest x / d0 (d0 = the signed max over the lowest level), then the scale that fits the
// levels best in least squares weighted by x^2.
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};
int iq4_nearest(float x) {  // a tie takes the upper level
  if (x <= kIq4Levels[0]) return 0;
  if (x >= kIq4Levels[15]) return 15;
  int lo = 0;
  for (int i = 1; i < 15; ++i)
    if (x >= kIq4Levels[i]) lo = i;
  return x - kIq4Levels[lo] < kIq4Levels[lo + 1] - x ? lo : lo + 1;
}
void quantise_iq4_nl(const float* x, uint8_t* q, uint16_t* h) {
  float max = signed_max(x), d = 0.0f;
  int l[32] = {};
  if (std::fabs(max) >= 1e-15f) {
    float id = 1.0f / (max / kIq4Levels[0]), sum_qx = 0.0f, sum_q2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      l[j] = iq4_nearest(id * x[j]);
      float level = kIq4Levels[l[j]], w = x[j] * x[j];
      sum_qx += w * level * x[j];
      sum_q2 += w * level * level;
    }
    d = sum_q2 > 0.0f ? sum_qx / sum_q2 : 0.0f;
  }
  pack_nibbles(l, q);
  put_head(h, d, 0, 0, 1);
}
float dequantise_iq4_nl(const uint8_t* q, const uint16_t* h, uint32_t j) {
  return head_d(h) * static_cast<float>(kIq4Levels[nibble(q, j)]);
}

// In DType's order (checked below against shaders/formats.glsl's IDs).
constexpr Format kFormats[] = {
    {DType::f32, "f32", 1, 32, true, true, "32-bit floats", 0, nullptr, nullptr, 0},
    {DType::f16, "f16", 1, 16, true, true, "IEEE half precision", 0, nullptr, nullptr, 0},
    {DType::bf16, "bf16", 1, 16, false, false, "bfloat16", 0, nullptr, nullptr, 0},
    {DType::q8_0, "q8_0", 32, 8, false, true, "int8 and a scale", 1, quantise_q8_0,
     dequantise_q8_0, 0b1},
    {DType::q4_0, "q4_0", 32, 4, false, true, "4 bits and a scale", 1, quantise_symmetric<16>,
     dequantise_q4_0, 0b1},
    {DType::q4_1, "q4_1", 32, 4, false, true, "4 bits, a scale and a minimum", 2,
     quantise_affine<16>, dequantise_q4_1, 0b11},
    {DType::q5_0, "q5_0", 32, 4, false, true, "5 bits and a scale", 4, quantise_symmetric<32>,
     dequantise_q5_0, 0b1101},
    {DType::q5_1, "q5_1", 32, 4, false, true, "5 bits, a scale and a minimum", 4,
     quantise_affine<32>, dequantise_q5_1, 0b1111},
    {DType::iq4_nl, "iq4_nl", 32, 4, false, true, "4-bit indices of 16 non-linear levels and a scale",
     1, quantise_iq4_nl, dequantise_iq4_nl, 0b1},
};

#define FORMAT_ID(NAME, type, id)                                                   \
  static_assert(kFormats[static_cast<int>(DType::type)].dtype == DType::type &&     \
                    static_cast<int>(DType::type) == int(id),                         \
                "shaders/formats.glsl: " #NAME " is not DType::" #type "'s number");
#include "../../shaders/formats.glsl"
#undef FORMAT_ID

uint16_t float_to_bf16(float value) {
  uint32_t x = std::bit_cast<uint32_t>(value);
  if (std::isnan(value)) return static_cast<uint16_t>((x >> 16) | 0x40u);  // stays a NaN
  x += 0x7fffu + ((x >> 16) & 1u);                                         // nearest even
  return static_cast<uint16_t>(x >> 16);
}

bool for_use(const Format& f, DTypeUse use) {
  return use == DTypeUse::storage || (use == DTypeUse::query ? f.query : f.appendable);
}

}  // namespace

const Format& format(DType dtype) {
  auto i = static_cast<size_t>(dtype);
  if (i >= std::size(kFormats)) throw Error("unknown DType " + std::to_string(i));
  return kFormats[i];
}

}  // namespace flashvk::detail

namespace flashvk {

using detail::format;

const char* dtype_name(DType dtype) {
  return format(dtype).name;
}

std::vector<DType> dtypes(DTypeUse use) {
  std::vector<DType> out;
  for (const detail::Format& f : detail::kFormats)
    if (detail::for_use(f, use)) out.push_back(f.dtype);
  return out;
}

std::string dtype_list(DTypeUse use) {
  std::vector<DType> list = dtypes(use);
  std::string s;
  for (size_t i = 0; i < list.size(); ++i)
    s += std::string(i == 0 ? "" : i + 1 == list.size() ? " or " : ", ") + dtype_name(list[i]);
  return s;
}

std::string dtype_help() {
  std::string s;
  for (const detail::Format& f : detail::kFormats)
    s += std::string(s.empty() ? "" : "; ") + f.name + ": " + f.about;
  return s;
}

DType parse_dtype(const std::string& name) {
  for (const detail::Format& f : detail::kFormats)
    if (name == f.name) return f.dtype;
  throw Error("unknown dtype '" + name + "'; expected one of " + dtype_list());
}

uint32_t dtype_block(DType dtype) {
  return format(dtype).block;
}

bool dtype_quantised(DType dtype) {
  return format(dtype).blocked();
}

uint64_t storage_bytes(DType dtype, int64_t numel) {
  const detail::Format& f = format(dtype);
  uint64_t n = static_cast<uint64_t>(numel);
  return n * f.bits / 8 + (f.blocked() ? n / f.block * 2 * f.head_halves : 0);  // and the heads
}

uint64_t buffer_bytes(DType dtype, int64_t numel) {
  uint64_t align = format(dtype).buffer_align();
  return (storage_bytes(dtype, numel) + align - 1) / align * align;
}

namespace {
void put16(std::vector<uint8_t>& bytes, uint64_t at, uint16_t x) {
  std::memcpy(bytes.data() + at, &x, 2);
}
uint16_t get16(const std::vector<uint8_t>& bytes, uint64_t at) {
  uint16_t x;
  std::memcpy(&x, bytes.data() + at, 2);
  return x;
}
}  // namespace

std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype) {
  const detail::Format& f = format(dtype);
  int64_t n = static_cast<int64_t>(values.size());
  if (n % f.block)
    throw Error(std::string(f.name) + " stores blocks of " + std::to_string(f.block) +
                " values; " + std::to_string(n) + " values are not a whole number of blocks");
  std::vector<uint8_t> bytes(storage_bytes(dtype, n));
  if (dtype == DType::f32) {
    if (n) std::memcpy(bytes.data(), values.data(), bytes.size());
  } else if (!f.blocked()) {  // the 16-bit formats
    for (int64_t i = 0; i < n; ++i)
      put16(bytes, 2 * uint64_t(i),
            dtype == DType::f16 ? float_to_half(values[i]) : detail::float_to_bf16(values[i]));
  } else {
    for (int64_t i = 0; i < n; ++i)
      if (!std::isfinite(values[i]))
        throw Error(std::string(f.name) + " quantises finite values only; value " +
                    std::to_string(i) + " is " + std::to_string(values[i]));
    uint64_t quant_bytes = f.quant_bytes(), blocks = uint64_t(n) / f.block;
    uint64_t heads = blocks * quant_bytes;  // the heads follow every block's quants
    for (uint64_t b = 0; b < blocks; ++b) {
      uint16_t head[4] = {};
      f.quantise(values.data() + b * f.block, bytes.data() + b * quant_bytes, head);
      for (uint32_t i = 0; i < f.head_halves; ++i)
        put16(bytes, heads + 2 * (b * f.head_halves + i), head[i]);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype, int64_t numel) {
  const detail::Format& f = format(dtype);
  if (bytes.size() != storage_bytes(dtype, numel) || numel % f.block)
    throw Error("decode: " + std::to_string(bytes.size()) + " bytes do not hold " +
                std::to_string(numel) + " values of " + f.name);
  std::vector<float> values(static_cast<size_t>(numel));
  if (dtype == DType::f32) {
    if (numel) std::memcpy(values.data(), bytes.data(), bytes.size());
  } else if (!f.blocked()) {  // the 16-bit formats
    for (int64_t i = 0; i < numel; ++i) {
      uint16_t x = get16(bytes, 2 * uint64_t(i));
      values[i] = dtype == DType::f16 ? half_to_float(x) : std::bit_cast<float>(uint32_t(x) << 16);
    }
  } else {
    uint64_t quant_bytes = f.quant_bytes(), heads = uint64_t(numel) / f.block * quant_bytes;
    for (int64_t i = 0; i < numel; ++i) {
      uint64_t b = uint64_t(i) / f.block;
      uint16_t head[4] = {};
      for (uint32_t k = 0; k < f.head_halves; ++k)
        head[k] = get16(bytes, heads + 2 * (b * f.head_halves + k));
      values[i] = f.dequantise(bytes.data() + b * quant_bytes, head, uint32_t(i % f.block));
    }
  }
  return values;
}

uint64_t ggml_bytes(DType dtype, int64_t numel) {
  const detail::Format& f = format(dtype);
  if (!f.blocked()) return storage_bytes(dtype, numel);
  return static_cast<uint64_t>(numel) / f.block * f.ggml_block_bytes();
}

namespace {
// Between ggml's array of blocks and the struct of arrays the engine stores: block b's quants
// and its head's halves (those ggml_halves names, in order), the other halves 0.
std::vector<uint8_t> convert_ggml(const std::vector<uint8_t>& in, DType dtype, int64_t numel,
                                  bool to_ggml) {
  const detail::Format& f = format(dtype);
  uint64_t ours = storage_bytes(dtype, numel), theirs = ggml_bytes(dtype, numel);
  if (numel < 0 || numel % f.block || in.size() != (to_ggml ? ours : theirs))
    throw Error(std::string(to_ggml ? "to_ggml_blocks" : "from_ggml_blocks") + ": " +
                std::to_string(in.size()) + " bytes do not hold " + std::to_string(numel) +
                " values of " + f.name + (f.blocked() ? " (blocks of 32)" : ""));
  if (!f.blocked()) return in;
  std::vector<uint8_t> out(to_ggml ? theirs : ours);
  uint64_t blocks = uint64_t(numel) / f.block, quant = f.quant_bytes();
  uint64_t heads = blocks * quant;  // where our heads start
  for (uint64_t b = 0; b < blocks; ++b) {
    uint8_t* block = (to_ggml ? out.data() : const_cast<uint8_t*>(in.data())) +
                     b * f.ggml_block_bytes();
    uint8_t* soa = to_ggml ? const_cast<uint8_t*>(in.data()) : out.data();
    uint64_t at = 0;
    for (uint32_t h = 0; h < f.head_halves; ++h) {
      if (!(f.ggml_halves >> h & 1u)) continue;  // not in ggml's block: 0 in ours
      uint8_t* half = soa + heads + 2 * (b * f.head_halves + h);
      to_ggml ? std::memcpy(block + at, half, 2) : std::memcpy(half, block + at, 2);
      at += 2;
    }
    uint8_t* quants = soa + b * quant;
    to_ggml ? std::memcpy(block + at, quants, quant) : std::memcpy(quants, block + at, quant);
  }
  return out;
}
}  // namespace

std::vector<uint8_t> from_ggml_blocks(const std::vector<uint8_t>& blocks, DType dtype,
                                      int64_t numel) {
  return convert_ggml(blocks, dtype, numel, false);
}

std::vector<uint8_t> to_ggml_blocks(const std::vector<uint8_t>& bytes, DType dtype,
                                    int64_t numel) {
  return convert_ggml(bytes, dtype, numel, true);
}

void check_blocks(const std::vector<int64_t>& shape, DType dtype) {
  const detail::Format& f = format(dtype);
  if (f.blocked() && (shape.empty() || shape.back() % f.block))
    throw Error(std::string(f.name) + " stores blocks of " + std::to_string(f.block) +
                " values along the last dimension; shape " + shape_string(shape) + " has " +
                (shape.empty() ? std::string("none") : std::to_string(shape.back())));
}

HostTensor stored_values(const HostTensor& x, DType dtype) {
  if (dtype == DType::f32) return x;
  check_blocks(x.shape, dtype);
  return HostTensor(x.shape, decode(encode(x.data, dtype), dtype, x.numel()));
}

}  // namespace flashvk
