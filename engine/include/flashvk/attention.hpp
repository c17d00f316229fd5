#pragma once
// attention(): softmax(scale * Q K^T) V by one of the six variants, on the GPU.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashvk/context.hpp"
#include "flashvk/modifiers.hpp"
#include "flashvk/tensor.hpp"

namespace flashvk {

enum class Variant { naive, online, flash1, flash2, flashd, splitkv };
enum class RopeLayout { none, interleaved, half };
/// Where the fused kernels keep a K/V tile (docs/engine.md): `shared` memory, read by every row
/// of the workgroup (GPUs), or `registers`, spread over a subgroup's lanes and read with subgroup
/// shuffles, each invocation working on 4 rows (CPU drivers such as lavapipe, where it is tens
/// of times faster). `automatic`
/// picks registers on CPU devices that have the subgroup operations, shared memory elsewhere.
/// `cooperative_matrix`: shared-memory tiles whose products Q K^T and P V run on the matrix units
/// (VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix, fp16 in, fp32 accumulate); fp16 Q,
/// K and V in fp16 or a block format (decoded to fp16 as a tile is staged), flash1, flash2,
/// flashd and splitkv, d and dv multiples of 16 up to 128, or of 32 up
/// to 256 (half that on Intel Arc A's 8x8 matrices). `automatic` picks it wherever it runs on
/// matrix units, but for Intel's integrated GPUs that list only 8x8x16 (no XMX).
/// `lanes`: splitkv for decoding on GPUs: all of a KV head's query rows (at most 8) in one
/// workgroup, each key's head dimension spread over a few lanes that load 16 bytes each;
/// d and dv multiples of 8 (fp16) or 4 (fp32), subgroup shuffles. `automatic` picks it for
/// splitkv on GPUs when a KV head has at most 8 query rows.
/// `blocks`: register blocks for GPUs without matrix units (phones, integrated GPUs, fp32 on
/// any GPU): the workgroup's queries and each K/V tile in shared memory, each invocation
/// computing a 4-row block of the scores and of the output from 16-byte vector reads, rows reduced
/// with subgroup shuffles where the device has them and through shared memory where not; d and
/// dv multiples of 4. `automatic` picks it on GPUs where the matrix kernel is not picked.
enum class TileLayout { automatic, shared, registers, cooperative_matrix, lanes, blocks };
/// What the engine knows of a tile layout, kept in one table (engine/src/layouts.hpp) that the
/// planner, the kernel builds, the CLI and the docs read.
struct TileLayoutInfo {
  TileLayout layout;
  const char* name;    ///< tile_layout_name(): "cooperative_matrix"
  const char* option;  ///< the CLI's --layout: "coopmat"
  const char* about;   ///< one line on what it does
  const char* files;   ///< its kernel's shader file (shaders/)
};
const TileLayoutInfo& tile_layout_info(TileLayout layout);
const char* tile_layout_name(TileLayout layout);
/// Every layout, `automatic` first, in TileLayout's order.
std::vector<TileLayout> all_tile_layouts();
/// Parses a name or a CLI option ("cooperative_matrix" or "coopmat"); throws Error naming the
/// options otherwise.
TileLayout parse_tile_layout(const std::string& text);

/// What the engine knows of a variant, kept in one table (attention.cpp) that the planner, the
/// traces, the CLI and the viewer all read.
struct VariantInfo {
  Variant variant;
  const char* name;   ///< canonical name, as the CLI and traces spell it ("flash2")
  const char* about;  ///< one line on what it does
  bool fused;         ///< one kernel over K/V tiles (all but naive, which materialises S)
  uint32_t passes;    ///< passes over the keys of a fused kernel (the online softmax: 2)
  bool keeps_max;     ///< keeps a running max m and denominator l (all but FLASH-D)
  bool keeps_lse;     ///< keeps a running log-sum-exp per step (all but naive)
  bool matrix;        ///< has a cooperative-matrix kernel (TileLayout::cooperative_matrix)
  bool splits_keys;   ///< walks chunks of keys in parallel and merges them (Flash-Decoding)
  bool lazy_output;   ///< keeps o unnormalised, divided by l once at the end (FA2's deferral)
};
const VariantInfo& variant_info(Variant variant);

const std::vector<Variant>& all_variants();
const char* variant_name(Variant variant);
/// Parses a canonical name ("flash2"); throws Error naming the valid ones otherwise.
Variant parse_variant(const std::string& name);
const char* rope_name(RopeLayout layout);
RopeLayout parse_rope(const std::string& name);

struct RopeParams {
  RopeLayout layout = RopeLayout::interleaved;
  double base = 10000.0;
  int64_t position_offset = 0;  ///< position of the first vector of each sequence
};

/// How a call runs, not what it computes: the engine chooses each of these from the device when
/// left at 0 / automatic (docs/engine.md, "Tile layouts"); a caller sets them to tune one shape
/// or to try a layout (`flashvk bench` times them).
struct ExecutionHints {
  TileLayout tile_layout = TileLayout::automatic;  ///< fused variants (not naive, not traces)
  /// Invocations per workgroup; 0 = auto (64). With shared tiles one query row each; with
  /// register tiles R rows each (AttentionResult::block_rows says how many rows a workgroup
  /// covered). With tile_layout cooperative_matrix, query rows a workgroup: 64 (d and dv up to
  /// 128 on 16x16 matrices), 128 (as many groups again, each K/V tile staged once for twice the
  /// rows; 256 invocations on 16x16), or 32, each block of rows split over two groups of half
  /// the head dims (d and dv multiples of 32; a lane's registers for queries and output halved,
  /// as past d = 128).
  uint32_t block_rows = 0;
  /// With tile_layout cooperative_matrix, query rows each group of the kernel (a subgroup on
  /// the matrix units) multiplies: 0 = the engine's, one matrix's rows (16; 8 on Intel), or two
  /// matrices' (32 on 16x16; not on Arc's 8x8 by 8 lanes): each K and V matrix read from shared
  /// memory then feeds two products, for twice a lane's output registers. d and dv up to 128;
  /// block_rows 0 (128 rows a workgroup, 64 past d = 64, where the queries stay in shared
  /// memory and 128 rows would not fit) or 64; not with matrix_api nv2, whose softmax is a
  /// group's matrix. Traces, which run shared tiles, ignore it.
  uint32_t group_rows = 0;
  /// Bc, keys per tile; 0 = the most that fit in shared memory. With tile_layout
  /// cooperative_matrix, 16, 32 or 64 (what a tuning sweep varies); with automatic, it asks for
  /// shared tiles.
  uint32_t block_keys = 0;
  uint32_t splits = 0;      ///< splitkv: number of key chunks; 0 = chosen from the device
  /// Shared memory the kernels may use per workgroup; 0 = the device's (at most 48 KiB).
  /// 16384 runs them as on a device with only Vulkan's guaranteed minimum.
  uint32_t max_shared_memory = 0;
  /// fp16 arithmetic, the path for phones and other GPUs without matrix units: the register
  /// blocks multiply in fp16 (f16vec2, two rows a product) and sum at most 8 products in fp16
  /// before adding them to fp32 scores and outputs; the softmax stays fp32. Q, K, V and P are
  /// rounded to fp16 on the way (any storage type), so every run of 8 unscaled q·k products must
  /// stay within fp16's range (65504). Needs shaderFloat16 enabled (DeviceInfo::
  /// fp16_arithmetic; ExternalDevice::fp16_arithmetic_enabled) and a fused variant; runs in
  /// TileLayout::blocks (which `automatic` then picks, on any device) or cooperative_matrix
  /// (fp16 products always). Error bound: docs/algorithms.md, "fp16 arithmetic".
  bool fp16_arithmetic = false;
};

/// What one attention call computes: the variant, the scale, the score modifiers, RoPE; and
/// how it runs (hints).
struct AttentionParams {
  Variant variant = Variant::flash2;
  std::optional<float> scale;  ///< default 1/sqrt(d)
  Modifiers mods;              ///< causal, window, softcap, ALiBi, sinks, masks (modifiers.hpp)
  RopeLayout rope = RopeLayout::none;  ///< rotate Q and K before attention
  double rope_base = 10000.0;
  std::optional<int64_t> query_position;  ///< RoPE position of query 0; default Nk - Nq
  bool want_lse = true;
  ExecutionHints hints;
};

/// The sizes every kernel works with, read from the tensors' shapes.
struct Dims {
  uint32_t batch = 1, heads = 1, kv_heads = 1, nq = 0, nk = 0, d = 0, dv = 0;
  /// Keys a K/V head can hold: Nk, or the capacity of a cache whose first Nk keys K and V are
  /// (Tensor::prefix, row_capacity()); 1 for a paged cache, whose heads are looked up.
  uint32_t kv_rows = 0;
  /// Key rows in K's (and V's) memory: K's span() / d (B * Hkv * kv_rows when dense), or a
  /// paged cache's pages * Hkv * page size.
  uint64_t kv_keys = 0;
  std::vector<int64_t> out_shape;  ///< [.., Nq, dv] with the rank of Q
  std::vector<int64_t> lse_shape;  ///< [.., Nq]
};

/// Checks that Q [B,H,Nq,d], K [B,Hkv,Nk,d] and V [B,Hkv,Nk,dv] (or rank 2/3 forms) fit
/// together; throws Error naming the tensor and dimension otherwise.
Dims check_shapes(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                  const std::vector<int64_t>& v);

/// The page table of a paged KV cache, with FlashInfer's meaning: K and V are pages
/// [pages, Hkv, page_size, d] (and dv), and sequence b of the batch holds the pages
/// indices[indptr[b]], .., indices[indptr[b + 1] - 1] in order, each full but the last, which
/// holds last_page_len[b] tokens (1 .. page_size); a sequence without pages has no tokens
/// (last_page_len 0). Token t of sequence b is row t % page_size of page
/// indices[indptr[b] + t / page_size].
struct PageTable {
  uint32_t page_size = 16;
  std::vector<uint32_t> indptr = {0};   ///< [B + 1]: 0, then non-decreasing
  std::vector<uint32_t> indices;        ///< [indptr[B]]: page numbers
  std::vector<uint32_t> last_page_len;  ///< [B]

  uint32_t batch() const { return indptr.empty() ? 0 : uint32_t(indptr.size() - 1); }
  uint32_t length(uint32_t b) const;  ///< the tokens of sequence b
  /// A new sequence, without tokens; returns its index b.
  uint32_t add_sequence();
  /// Where one more token of sequence b goes: its last page's next row, or row 0 of a page
  /// taken from the back of `free_pages` when that page is full (or b has none). Throws when a
  /// page is needed and none is free.
  struct Slot {
    uint32_t page = 0, row = 0;
  };
  Slot grow(uint32_t b, std::vector<uint32_t>& free_pages);
  /// Gives sequence b's pages back to `free_pages`; b stays, with no tokens.
  void release(uint32_t b, std::vector<uint32_t>& free_pages);
  /// Throws Error unless the table is well formed for `pages` pages of K and V: indptr from 0
  /// and non-decreasing, every index below `pages`, last_page_len in 1 .. page_size (0 for a
  /// sequence without pages).
  void check(uint64_t pages) const;
};

struct AttentionResult {
  Tensor out;                 ///< float32 [B, H, Nq, dv] (rank of Q)
  Tensor lse;                 ///< float32 [B, H, Nq], empty unless want_lse
  double gpu_ms = 0.0;        ///< from timestamp queries; 0 when the device has none
  uint64_t device_bytes = 0;  ///< bytes this call allocated: outputs and scratch
  TileLayout tile_layout = TileLayout::shared;  ///< the layout that ran (naive: shared)
  /// The tiling that ran: query rows per workgroup and keys per K/V tile (0 for naive, which
  /// has no tiles), and splitkv's number of key chunks (1 for the other variants).
  uint32_t block_rows = 0, block_keys = 0, splits = 1;
  /// cooperative_matrix: query rows each group of the kernel multiplied (ExecutionHints::
  /// group_rows); 0 for the other layouts.
  uint32_t group_rows = 0;
};

/// Runs attention on device tensors, submits and waits.
AttentionResult attention(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionParams& params = {});

/// Attention over a batch of sequences of different lengths in a paged KV cache, in one
/// dispatch: Q [B, H, Nq, d] (B = pages.batch()), K pages [pages, Hkv, page_size, d] and V pages
/// [pages, Hkv, page_size, dv], dense, of any storage type. Each sequence's Nq queries are
/// bottom-right aligned to its own length (query i sits on key i + length - Nq), for causal
/// attention and windows alike. Every fused variant and layout; not naive (which
/// materialises a score matrix of one Nk), RoPE (rotate K before it goes into its page) or an
/// additive mask.
AttentionResult paged_attention(Context& ctx, const Tensor& q, const Tensor& k_pages,
                                const Tensor& v_pages, const PageTable& pages,
                                const AttentionParams& params = {});

struct HostAttentionResult {
  HostTensor out;
  HostTensor lse;
  double gpu_ms = 0.0;
  uint64_t device_bytes = 0;
  TileLayout tile_layout = TileLayout::shared;
  uint32_t block_rows = 0, block_keys = 0, splits = 1;  ///< as in AttentionResult
  uint32_t group_rows = 0;                              ///< as in AttentionResult
};

/// Q, K and V uploaded in their storage (Tensor::upload); an error names the tensor ("K: ... stores
/// blocks of 32 values ...").
std::array<Tensor, 3> upload_qkv(Context& ctx, const HostTensor& q, const HostTensor& k,
                                 const HostTensor& v, const Storage& storage);

/// Uploads (in `storage`: one DType for all, or Q's, K's and V's), runs and downloads: the
/// simplest way in.
HostAttentionResult attention(Context& ctx, const HostTensor& q, const HostTensor& k,
                              const HostTensor& v, const AttentionParams& params = {},
                              Storage storage = {});

/// Applies rotary embedding to a [.., N, d] tensor; returns a new tensor of the same dtype.
Tensor rope(Context& ctx, const Tensor& x, const RopeParams& params);

namespace detail {
class Plan;
}

/// Outputs the caller owns, for a recording to write into: float32 tensors of the shapes
/// AttentionResult describes (O [.., Nq, dv] with Q's rank, LSE [.., Nq] when want_lse), for
/// example views of the application's own buffers (Tensor::view). Unset ones are allocated by
/// the recording.
struct AttentionOutputs {
  const Tensor* out = nullptr;
  const Tensor* lse = nullptr;
};

/// The shape of a KV cache: per sequence of the batch and KV head, `capacity` tokens of K (d
/// values) and V (dv values, 0 = d), stored as any of dtype_list(DTypeUse::append):
/// f32, f16, or a block format (d and dv multiples of 32; appended rows are quantised on the
/// device as they go in).
struct KvCacheShape {
  uint32_t batch = 1, kv_heads = 1, capacity = 0, d = 0, dv = 0;
  DType dtype = DType::f16;
};

/// A KV cache on the device: K [B, Hkv, capacity, d] and V [B, Hkv, capacity, dv], allocated
/// once. Recordings append to it (AttentionRecording's appending form) and attend over its
/// first tokens; keys(n) and values(n) are views of those tokens for other recordings.
class KvCache {
 public:
  /// Device buffers of its own, uninitialised.
  KvCache(Context& ctx, const KvCacheShape& shape);
  /// A cache over the application's tensors (e.g. Tensor::view of its own buffers): K [B, Hkv,
  /// capacity, d] and V [B, Hkv, capacity, dv], dense, alike in dtype (dtypes(DTypeUse::append)).
  KvCache(Tensor keys, Tensor values);
  KvCache(KvCache&&) noexcept = default;
  KvCache& operator=(KvCache&&) noexcept = default;

  const Tensor& keys() const { return k_; }  ///< all of K, at capacity
  const Tensor& values() const { return v_; }
  Tensor keys(uint32_t n) const { return k_.prefix(n); }  ///< the first n tokens' K
  Tensor values(uint32_t n) const { return v_.prefix(n); }
  const KvCacheShape& shape() const { return shape_; }
  uint32_t capacity() const { return shape_.capacity; }

 private:
  KvCacheShape shape_;
  Tensor k_, v_;
};

/// Attention recorded into a command buffer the application owns (e.g. its frame's). Holds the
/// outputs (unless given), scratch buffers and descriptor sets, so it must outlive the command
/// buffer's execution. Q, K, V and the outputs may be views of the application's buffers. The
/// caller makes the writes to q, k, v visible before the recorded work; the recording ends with a
/// barrier that makes out and lse visible to shaders, transfers and host.
class AttentionRecording {
 public:
  AttentionRecording(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionParams& params = {}, const AttentionOutputs& outputs = {});
  /// A decode step (or prefill chunk) over `cache`, recorded once and resubmitted: each time it
  /// runs it first writes k_new [B, Hkv, n, d] and v_new [B, Hkv, n, dv] (the cache's dtype;
  /// f32 or f16 for a cache of a block format, quantised per block of 32 as they go in, after
  /// RoPE) into the cache's rows [p, p + n), where p is the last set_position(), rotating K there
  /// (RoPE at positions p.., when params.rope is set), then attends Q [B, H, n, d] (rotated at
  /// the same positions) over the cache's first p + n tokens; query i sits on token p + i.
  /// Masks of a fixed length (key_mask, mask) and query_position are refused; causal, windows,
  /// softcap, ALiBi and sinks follow the length. q, k_new and v_new are read when it runs, so
  /// the application writes them (or has its own shaders write them) before each submit. The
  /// cache, k_new and v_new must outlive the recording and its executions (their handles are
  /// recorded, not copies).
  AttentionRecording(Context& ctx, const Tensor& q, KvCache& cache, const Tensor& k_new,
                     const Tensor& v_new, const AttentionParams& params = {},
                     const AttentionOutputs& outputs = {});
  AttentionRecording(AttentionRecording&&) noexcept;
  AttentionRecording& operator=(AttentionRecording&&) noexcept;
  ~AttentionRecording();

  void record(VkCommandBuffer cmd);
  /// How many keys of K and V the recorded kernels attend over the next time they run: at most
  /// K's row_capacity() (a KV cache's capacity, K and V being prefix() views of it), so that a
  /// command buffer recorded once serves every decode step, the cache one token longer each
  /// time; the queries sit on the last Nq of the n keys (query i on key i + n - Nq). Nk of the
  /// tensors it was made with until called. A host write to the recording's own memory: call
  /// it when the previous execution has finished. With a key mask, an additive mask or RoPE
  /// only that Nk is accepted.
  void set_keys(uint32_t n);
  /// For a recording that appends to a KV cache: the cache row the next run appends at, which
  /// is the number of tokens the cache holds before it (0 for a prompt's first chunk). Throws
  /// if position + n passes the capacity. Like set_keys, a host write for the next run.
  void set_position(uint32_t position);
  /// Throws Error if, in the runs since it last did, a user-written function
  /// (Modifiers::score_mod, mask_mod) read flex_table past its end (those reads gave 0). Call it
  /// once they have finished; set_keys and set_position check first, so a decode loop hears of
  /// it a step late.
  void check_user_functions() const;
  /// O and LSE: the recording's own, or views of the AttentionOutputs it was given.
  const Tensor& out() const;
  const Tensor& lse() const;
  TileLayout tile_layout() const;  ///< the layout its kernels run (naive: shared)

 private:
  std::unique_ptr<detail::Plan> plan_;
};

}  // namespace flashvk
