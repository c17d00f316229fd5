#pragma once
// Tensors: float32 data on the host, and device buffers with a shape and a storage type.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

namespace flashvk {

class Context;

/// Storage types. Q is f32 or f16 (O and LSE are always f32); K and V may also be bf16 or one of
/// ggml's block formats of 32 values, a value x = d q + m from its quant q, its block's fp16 scale
/// d and, where the format has one, its block's fp16 minimum m (else 0):
///   - q8_0: int8 q
///   - q4_0: 4-bit, x = d (q - 8)
///   - q4_1: 4-bit, with m
///   - q5_0: 5-bit, x = d (q - 16)
///   - q5_1: 5-bit, with m
///   - iq4_nl: 4-bit indices of ggml's 16 non-linear levels, x = d level[q]
/// They are quantised on upload as ggml's quantize_row_*_ref do and dequantised by the kernels as
/// they load a tile. ggml's fields bit for bit, as a struct of arrays rather than ggml's array of
/// blocks: on the device a block tensor keeps all its quants first, block after block as ggml's
/// qs (a 4-bit block's byte j holding values j and j + 16 in its low and high nibble), then all
/// its block heads, one a block of 32 along the last dimension (which must be a multiple of 32):
/// d (two blocks a word), or d and m (a word), or d, m and ggml's 32 fifth bits qh (two words).
/// Every format is a row of one table (engine/src/formats.cpp) with its twin for the kernels
/// (shaders/formats.glsl), which numbers them alike.
enum class DType { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl };
const char* dtype_name(DType dtype);
/// What a list of dtypes is for: any storage (K and V), Q's, or a KV cache appended to on the
/// device (KvCache).
enum class DTypeUse { storage, query, append };
/// The dtypes for `use`, in DType's order.
std::vector<DType> dtypes(DTypeUse use = DTypeUse::storage);
/// Their names as a list for messages and help: "f32, f16, bf16, q8_0 or q4_0".
std::string dtype_list(DTypeUse use = DTypeUse::storage);
/// Every dtype's name and a few words on it, "; " between them, for help texts.
std::string dtype_help();
/// Whether `dtype` stores quantised blocks (quantised on upload and on append).
bool dtype_quantised(DType dtype);
/// Storage of Q, K and V, for the calls that upload host tensors: Q in f32 or f16, K and V in
/// any DType. One DType stores all three alike.
struct Storage {
  DType q = DType::f32, k = DType::f32, v = DType::f32;
  Storage() = default;
  Storage(DType all) : q(all), k(all), v(all) {}  // NOLINT: implicit, so a DType reads as one
  Storage(DType q_dtype, DType k_dtype, DType v_dtype) : q(q_dtype), k(k_dtype), v(v_dtype) {}
  /// K or V stored otherwise than Q: the kernels read them in their storage and decode them.
  bool own_kv() const { return k != q || v != q; }
};
/// Parses a dtype_name ("q8_0"); throws Error naming the valid ones otherwise.
DType parse_dtype(const std::string& name);
/// Values one block of a dtype holds along the last dimension: 32 for the block formats, else 1.
uint32_t dtype_block(DType dtype);
/// Throws Error unless a tensor of `shape` divides into `dtype`'s blocks along its last dimension.
void check_blocks(const std::vector<int64_t>& shape, DType dtype);
/// Bytes that `numel` values take in `dtype` storage (a whole number of blocks).
uint64_t storage_bytes(DType dtype, int64_t numel);
/// Bytes a Tensor of `numel` values in `dtype` takes in its buffer (Tensor::bytes()):
/// storage_bytes() rounded up to whole 32-bit words, and for the block formats to 16 bytes (the
/// kernels read those blocks as 16-byte texels).
uint64_t buffer_bytes(DType dtype, int64_t numel);
/// `values` in `dtype` storage, as uploaded: rounded to nearest even (f16, bf16), or quantised
/// per block of 32 as ggml's quantize_row_*_ref do.
std::vector<uint8_t> encode(const std::vector<float>& values, DType dtype);
std::vector<float> decode(const std::vector<uint8_t>& bytes, DType dtype, int64_t numel);
/// Bytes that `numel` values take as ggml stores them: its array of block structs (block_q8_0,
/// block_q4_1, ...: a block's fp16 d, then m and qh where the format has them, then its quants
/// qs) for the block formats, else storage_bytes().
uint64_t ggml_bytes(DType dtype, int64_t numel);
/// Blocks as ggml writes them (a tensor, or a KV cache, of ggml's `dtype`), bit for bit, into
/// the struct of arrays the engine stores (encode()'s bytes, for Tensor::write_storage), and
/// back: the same quants and heads moved, nothing rounded. Element formats are returned as they
/// are. Throws Error where the bytes are not `numel` values' worth.
std::vector<uint8_t> from_ggml_blocks(const std::vector<uint8_t>& blocks, DType dtype,
                                      int64_t numel);
std::vector<uint8_t> to_ggml_blocks(const std::vector<uint8_t>& bytes, DType dtype, int64_t numel);

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
/// The values a tensor of `dtype` holds once `x` is uploaded (encode then decode): what a
/// float64 reference must see to isolate the kernel from the storage's rounding.
HostTensor stored_values(const HostTensor& x, DType dtype);

/// PyTorch's boolean attn_mask (true = attend) as an additive mask of the same shape
/// (Modifiers::mask): 0 where `attend` is nonzero, -inf elsewhere.
HostTensor bool_mask(const std::vector<uint8_t>& attend, std::vector<int64_t> shape);
std::string shape_string(const std::vector<int64_t>& shape);

/// The usage a tensor's own VkBuffer has (with UNIFORM_BUFFER besides), and what Tensor::view
/// takes a caller's buffer to have unless told otherwise: kernels bind tensors as storage buffers,
/// register tiles read K and V as uniform texel buffers, and write() and download() copy to and
/// from them.
constexpr VkBufferUsageFlags kTensorUsage =
    VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT |
    VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;

/// A tensor in `dtype` storage on the device: in a buffer of its own, or a view of part of a
/// buffer the application owns. Its values from offset() on (blocks as DType says), row-major,
/// or where a view's element strides put them. Move-only; the Context must outlive it.
class Tensor {
 public:
  Tensor();
  /// A buffer of its own, uninitialised.
  Tensor(Context& ctx, std::vector<int64_t> shape, DType dtype);
  /// A view of the application's `buffer` from byte `offset`: no copy, and nothing is owned, so
  /// the buffer must outlive the view and any recording that uses it. `offset` must be a
  /// multiple of the device's minStorageBufferOffsetAlignment (DeviceInfo), and the buffer must
  /// hold bytes() from there, buffer_bytes(dtype, numel): the block formats padded to whole 16
  /// bytes (the engine cannot see a VkBuffer's size; the validation layers can). `usage`: the flags
  /// the buffer was created with, at least STORAGE_BUFFER. Without UNIFORM_TEXEL_BUFFER, or at an
  /// offset that is not a multiple of minTexelBufferOffsetAlignment, K and V are read through
  /// shared tiles, not register tiles; write() needs TRANSFER_DST and download() TRANSFER_SRC.
  ///
  /// `strides`: the element strides of each dimension, for tensors laid out otherwise than
  /// row-major (empty: row-major). The last is 1 (a row's values are contiguous) and the others
  /// whole rows, multiples of the last dimension, in any order: K and V of a token-major cache
  /// [B, N, Hkv, d] are views of shape [B, Hkv, N, d] with strides {N Hkv d, d, Hkv d, 1}; Q from
  /// a fused QKV projection [N, H + 2 Hkv, d] is [H, N, d] with strides {d, (H + 2 Hkv) d, 1}.
  /// The buffer then holds bytes() from `offset`: the span from the first value to the last. Q,
  /// K, V and O of attention may be such views (K and V with the same strides in rows; LSE
  /// dense); download() gathers one, write() and Staging refuse it.
  static Tensor view(Context& ctx, VkBuffer buffer, uint64_t offset, std::vector<int64_t> shape,
                     DType dtype, VkBufferUsageFlags usage = kTensorUsage,
                     std::vector<int64_t> strides = {});
  /// A view of the first `n` rows of every [.., N, d] matrix (dimension -2), without a copy: a
  /// KV cache of capacity N holding n tokens, for attention over them. Its matrices stay N rows
  /// apart in memory (row_capacity()): it keeps the strides of the tensor it views. Q, K, V and
  /// O may be such views (K and V alike), LSE may not; download() reads one, write() refuses it
  /// (write the whole cache). The tensor it views must outlive it.
  Tensor prefix(int64_t n) const;
  /// Encodes `host` in `dtype` storage (encode()); the block formats need a last dimension
  /// that is a multiple of their block (dtype_block).
  static Tensor upload(Context& ctx, const HostTensor& host, DType dtype);
  /// Encodes `host` (of this tensor's shape) into this tensor's storage and waits for the copy.
  void write(const HostTensor& host);
  /// Copies values already in this tensor's storage (encode()'s bytes, storage_bytes(dtype,
  /// numel) of them: e.g. from_ggml_blocks() of a cache ggml wrote) and waits for the copy.
  void write_storage(const std::vector<uint8_t>& bytes);
  HostTensor download() const;

  Tensor(Tensor&&) noexcept;
  Tensor& operator=(Tensor&&) noexcept;
  ~Tensor();

  const std::vector<int64_t>& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  VkBuffer buffer() const;
  uint64_t offset() const;  ///< where the values start in buffer(); 0 but for views
  /// Bytes the values take from offset(): buffer_bytes() (of the whole tensor a prefix()
  /// views; of the span of a strided view).
  uint64_t bytes() const;
  bool is_view() const;
  /// Element strides of each dimension: row-major for the tensor's own buffer, a view's as
  /// given, a prefix()'s those of the tensor it views.
  const std::vector<int64_t>& strides() const;
  /// Values its memory holds from offset(): numel() for a dense tensor, that of the tensor it
  /// views for a prefix(), the span from its first value to its last for a strided view.
  int64_t span() const;
  /// Whether its values are row-major and contiguous (no prefix(), no strides of a view's own).
  bool is_dense() const;
  /// Rows of each [N, d] matrix its memory holds: shape()[-2], but for a prefix() view the N of
  /// the tensor it views (a KV cache's capacity).
  int64_t row_capacity() const;
  /// Whether its rows are spaced wider than its shape says (a prefix() of fewer rows).
  bool is_prefix() const;
  VkBufferUsageFlags usage() const;
  bool empty() const { return buffer_ == nullptr; }
  Context* context() const { return ctx_; }

 private:
  void write_bytes(const void* data, uint64_t size);  // checks, then the copy
  struct Storage;
  Context* ctx_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::f32;
  std::unique_ptr<Storage> buffer_;
};

/// Host-visible memory of the engine's for uploads and downloads recorded into the application's
/// own command buffer, next to the blocking Tensor::write and download(): allocated once and
/// mapped for its whole life, so a decode step moves its Q, K and V in and its O out with no
/// allocation and no submit of the engine's. The host writes it before the submit and reads it
/// after the fence, one region per tensor (its own byte offsets). Move-only; the Context must
/// outlive it. (An application with staging of its own records vkCmdCopyBuffer into the
/// VkBuffer of a tensor, Tensor::buffer() at offset(), itself.)
class Staging {
 public:
  Staging(Context& ctx, uint64_t bytes);
  Staging(Staging&&) noexcept;
  Staging& operator=(Staging&&) noexcept;
  ~Staging();

  void* data() const;  ///< the mapped bytes, host-coherent
  uint64_t bytes() const;
  /// Encodes `host` in `dtype` storage (as Tensor::write does) at byte `offset`; returns the
  /// bytes it took (a tensor of that shape and dtype's bytes()).
  uint64_t write(const HostTensor& host, DType dtype, uint64_t offset = 0);
  /// Decodes a tensor of `shape` in `dtype` storage from byte `offset`.
  HostTensor read(const std::vector<int64_t>& shape, DType dtype, uint64_t offset = 0) const;
  /// Records a copy of dst.bytes() from byte `offset` into `dst` (dense; a view needs
  /// TRANSFER_DST), then a barrier that makes it visible to later shaders and transfers.
  void record_upload(VkCommandBuffer cmd, const Tensor& dst, uint64_t offset = 0) const;
  /// Records a barrier after the shaders and transfers before it, a copy of `src` (dense; a view
  /// needs TRANSFER_SRC) to byte `offset`, and a barrier that makes it visible to the host.
  void record_download(VkCommandBuffer cmd, const Tensor& src, uint64_t offset = 0) const;

 private:
  struct Memory;
  std::unique_ptr<Memory> memory_;
};

/// IEEE half-precision conversion, round to nearest even.
uint16_t float_to_half(float value);
float half_to_float(uint16_t bits);

}  // namespace flashvk
