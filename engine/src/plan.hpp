#pragma once
// A Plan is one attention call turned into a list of dispatches with their descriptor sets,
// scratch buffers and outputs. It can be recorded into any command buffer, ours or the app's.
// Three parts, each in its own file: the tiling policy chooses the layout and tiles from the
// device (tiling.hpp, choose_tiling), the Plan checks the call and builds the kernels' inputs
// once, in its constructor (this file; the kernel families in kernels/ add their dispatches
// to it there), and the DispatchList records them (dispatch_list.hpp). After construction a
// plan changes only the lengths its kernels read when they run (set_keys, set_position).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dispatch_list.hpp"
#include "flashvk/attention.hpp"
#include "kernels.hpp"
#include "shader_registry.hpp"
#include "tiling.hpp"
#include "vk.hpp"

namespace flashvk::detail {

/// The kernels' push constants, `Params` in shaders/common.glsl: both sides take their members
/// from one list, shaders/push_fields.glsl.
#define PUSH_FIELD(type, name) PUSH_TYPE_##type name;
#define PUSH_TYPE_uint uint32_t
#define PUSH_TYPE_int int32_t
#define PUSH_TYPE_float float
struct Push {
#include "../../shaders/push_fields.glsl"
};
#undef PUSH_FIELD
#undef PUSH_TYPE_uint
#undef PUSH_TYPE_int
#undef PUSH_TYPE_float
static_assert(sizeof(Push) % 4 == 0 && sizeof(Push) <= 128 &&
                  sizeof(Push) <= sizeof(Dispatch::push),
              "push constants: 32-bit members within Vulkan's guaranteed 128 bytes");
constexpr uint32_t kFlagLse = 4, kFlagTrace = 8;  // a key mask: Spec::key_mask
/// Spec::mods bits, MOD_* in shaders/modifiers.glsl.
constexpr uint32_t kModSoftcap = 1, kModAlibi = 2, kModSinks = 4, kModMask = 8, kModTiles = 16,
                   kModSoftcapWide = 32;
/// Softcaps past this take tanh's series near 0 too (kModSoftcapWide): the kernels' c - 2c /
/// (e^2x + 1) is about c 2^-24 off in each score, whatever the score.
constexpr float kSoftcapFastMax = 64.0f;

/// Where tensor `t`'s values are.
Range binding(const Tensor& t);
/// Strides in rows (of the last dimension) from one batch, head and row of a [.., N, d] tensor to
/// the next: the kernels' q_/kv_/o_ strides (shaders/push_fields.glsl).
struct RowStrides {
  uint32_t b = 0, h = 0, r = 1;
  std::string text() const;
};
RowStrides row_strides(const Tensor& t, const char* name);

/// Tracing asks for a trace build of the kernels and a fixed tiling; recordings may write into
/// the caller's outputs.
struct PlanOptions {
  bool trace = false;
  /// The TRACE builds (flashvk_trace's trace_shader_blobs()), which a trace plan runs.
  const std::vector<ShaderBlob>* trace_builds = nullptr;
  uint32_t trace_bh = 0, trace_row = 0;
  uint32_t keys = 0;            ///< force Bc (1 = the per-key recurrence)
  uint32_t keys_per_split = 0;  ///< force the splitkv chunk length
  AttentionOutputs outputs;     ///< the caller's O and LSE, if it gives them
  /// Planned for any number of keys up to K's row_capacity() (Plan::set_keys), not just Nk.
  bool dynamic_keys = false;
  /// K and V are pages of a paged cache, looked up in this table (PAGE_SIZE in common.glsl).
  const PageTable* pages = nullptr;
  /// New K and V rows appended to K and V (a KV cache) at Plan::set_position before attention.
  struct {
    const Tensor* k = nullptr;
    const Tensor* v = nullptr;
  } append;
};

class Plan;
// The kernel families, one host file each next to its shaders (kernels/*.cpp), and the
// modifiers' encoding (modifiers.cpp): the steps of a plan's construction, and the only code
// besides plan.cpp that sees its state.
/// The modifiers checked and encoded for the kernels (modifiers.cpp): push constants, Spec::mods,
/// the per-head table, and their words of the small tables (appended to `words`).
void encode_modifiers(Plan& plan, std::vector<uint32_t>& words);
/// The modifiers' part of the kernels' specialization constants (Spec::mods, Spec::key_mask).
void spec_modifiers(const Modifiers& m, Spec& spec);
/// With mask_mod (and flashvk::flex), flex_tiles.comp, which writes the tile bitmap the fused
/// kernels skip by: the plan's first dispatch where `each_run` (its keys change from run to run),
/// else run once, now.
void plan_flex_tiles(Plan& plan, bool each_run);
/// flex_tiles.comp's constants for the fused kernel of constants `attention`.
Spec flex_tiles_spec(const Spec& attention);
/// `m`'s user-written functions evaluated on `ctx`'s device (flex_eval.comp) at points of five
/// floats each (the score, then b, h, q_idx and kv_idx as int bits), with FLEX_NQ = nq and
/// FLEX_NK = nk: two floats a point, score_mod's score and 1 where mask_mod keeps the key.
std::vector<float> evaluate_user_functions(Context& ctx, const Modifiers& m, uint32_t nq,
                                           uint32_t nk, const std::vector<float>& points);
/// The constants a call's kernels run with: the tiling (choose_tiling), the page size of a paged
/// cache (0: dense) and the modifiers' part. The plans and describe_pipelines() both take it.
Spec call_spec(const TilingRequest& request, uint32_t page_size);
void plan_fused(Plan& plan);  // online, flash1, flash2, flashd
void plan_naive(Plan& plan);
void plan_splitkv(Plan& plan);

class Plan {
 public:
  Plan(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
       const AttentionParams& params, const PlanOptions& options = {});
  /// A plan that only rotates `x` (the standalone RoPE op); the result is out().
  Plan(Context& ctx, const Tensor& x, const RopeParams& rope);
  /// An empty plan, for dispatches added by hand (the calibration kernels).
  explicit Plan(Context& ctx);
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan();

  void record(VkCommandBuffer cmd) const { dispatches_.record(cmd); }
  double gpu_ms() const { return dispatches_.gpu_ms(); }  ///< after the recorded work has finished
  /// The number of keys the recorded kernels attend over when they next run (dynamic_keys).
  void set_keys(uint32_t n);
  /// Where the appended rows go when the recorded work next runs (options.append): rows
  /// [position, position + Nq), attention over position + Nq keys.
  void set_position(uint32_t position);

  // What ran, and what it made (AttentionResult's fields).
  TileLayout tile_layout() const { return spec.layout; }
  /// Query rows a workgroup covers and keys a tile holds (0, 0 for naive, which has no tiles).
  uint32_t block_rows() const;
  /// Query rows a group of the matrix kernel multiplies (AttentionResult::group_rows).
  uint32_t group_rows() const;
  uint32_t block_keys() const;
  /// splitkv's chunks of keys and their length (1 and 0 for the other variants).
  uint32_t key_chunks() const { return splits; }
  uint32_t keys_per_chunk() const { return keys_per_split; }
  uint64_t allocated_bytes() const { return device_bytes; }
  /// Throws Error if a user-written function read flex_table past its end in the runs so far
  /// (once the recorded work has finished).
  void check_user_functions();
  float scale() const { return push.scale; }
  const Tensor& out() const { return out_; }
  const Tensor& lse() const { return lse_; }
  /// Hands O and LSE over (a one-shot call's result).
  Tensor take_out() { return std::move(out_); }
  Tensor take_lse() { return std::move(lse_); }
  /// A trace plan's records (PlanOptions::trace), once the recorded work has finished.
  std::vector<float> trace_records() const;
  /// splitkv's partial results, once the recorded work has finished: each row's chunks' o'
  /// ([B * H * Nq * chunks, dv]) and (m, l) ([B * H * Nq * chunks, 2]).
  std::vector<float> chunk_outputs() const { return read_floats(scratch1); }
  std::vector<float> chunk_states() const { return read_floats(scratch2); }

  // Building a plan by hand (the calibrations): descriptor sets and dispatches.
  VkDescriptorSet make_set(const Bindings& buffers);
  /// Adds a dispatch; `push_data` defaults to the plan's Push.
  void add(VkPipeline pipeline, VkDescriptorSet set, std::array<uint32_t, 3> groups,
           const void* push_data = nullptr, uint32_t push_bytes = 0);
  void add_barrier();
  /// Zeroes (fills with `word`) a buffer of the plan's before each run (DispatchList::add_fill).
  void add_fill(const Buffer& buffer, uint32_t word);
  Buffer scratch(uint64_t bytes);

 private:
  friend void encode_modifiers(Plan&, std::vector<uint32_t>&);
  friend void plan_flex_tiles(Plan&, bool);
  friend std::vector<float> evaluate_user_functions(Context&, const Modifiers&, uint32_t, uint32_t,
                                                    const std::vector<float>&);
  friend void plan_fused(Plan&);
  friend void plan_naive(Plan&);
  friend void plan_splitkv(Plan&);
  friend VkBuffer plan_angles(Plan&, uint32_t, uint32_t, int64_t);
  friend void plan_rows(Plan&, const Tensor&, const Tensor&, uint32_t, VkBuffer);
  friend void plan_rope(Plan&, const Tensor&, Tensor&, int64_t);

  /// The pipelines of the plan's attention kernels (attention_pipelines), in dispatch order.
  std::vector<VkPipeline> pipelines() const;
  /// A pipeline of the build `choice` names: a TRACE build from options.trace_builds, else the
  /// engine's.
  VkPipeline pipeline(const PipelineChoice& choice) const;
  /// An output of `shape`: the caller's `given` (checked, as a view) or a new tensor.
  Tensor output(const Tensor* given, const std::vector<int64_t>& shape, const char* name);
  /// Throws when tensor `name` is larger than one storage-buffer binding may be.
  void check_binding(const Tensor& t, const char* name) const;
  /// Loop iterations one invocation runs over `keys` keys (llvmpipe caps them; see below).
  uint64_t loop_iterations(uint64_t keys) const;
  /// Throws on llvmpipe when one invocation would loop past its cap of 65535 iterations.
  void check_loop_budget(uint64_t keys) const;
  static constexpr uint64_t kLoopBudget = 60000;
  static std::vector<float> read_floats(const Buffer& buffer);
  Range flex_range() const;  // the user functions' table and its fault word, or none
  void upload_flex_table();  // flex_table from params.mods (modifiers.cpp)
  void set_tables();         // the small tables: the modifiers', then the page table
  void make_texel_views();
  // The attention constructor's steps, in order.
  void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v);
  void choose_kernels(const Tensor& k, const Tensor& v);
  void set_push_constants();
  void bind_inputs(const Tensor& q, const Tensor& k, const Tensor& v);
  void bind_outputs(const Tensor& q, const Tensor& k, const Tensor& v);
  void record_dispatches();
  bool rotates_k() const;
  void check_append(const Tensor& q, const Tensor& k, const Tensor& v);
  void check_paged() const;  // what paged K and V (options.pages) cannot be asked for
  void plan_append(const Tensor& q, const Tensor& k, const Tensor& v);

  // Set by the constructor and the construction steps it calls; read-only after it.
  Context& ctx;
  ContextImpl& impl;
  AttentionParams params;
  PlanOptions options;
  Dims dims;
  DType dtype;  // Q's
  Storage kv;   // Q's, K's and V's storage (own_kv(): the KV_QUANT kernels, or K_FORMAT's)
  Spec spec;
  Push push{};
  Bindings bindings{};
  Tensor out_, lse_;    // the plan's own, or views of the caller's (PlanOptions::outputs)
  Tensor q_rot, k_rot;  // RoPE'd copies, when asked for
  Buffer tables, scratch1, scratch2, trace;  // shaders/bindings.glsl: Tables, Scratch1, Scratch2, binding 8
  Buffer heads;             // [B * H] (ALiBi slope, sink logit), when a modifier needs them
  Buffer flex_table;        // Modifiers::flex_table, when given (the user functions' flex_table[])
  bool flex_tiles = false;  // mask_mod's tile bitmap is computed by flex_tiles.comp first
  Buffer flex_stamps;       // flex_tiles.comp: the length of keys each bitmap word was made for
  uint32_t tile_keys = 0;   // the keys a row of the tile bitmap spans (lengths.tile_keys)
  std::vector<std::shared_ptr<Buffer>> angle_tables;  // RoPE angle tables, shared (plan_angles)
  uint32_t splits = 1, keys_per_split = 0;
  /// K's and V's strides in rows; paged: b * Hkv + hkv is the K/V head's index (key_row).
  RowStrides kv_strides;
  /// The most keys the kernels may be asked to attend: Nk, or with dynamic_keys the capacity
  /// (Dims::kv_rows). Chunks, scratch and loop budgets are sized for it.
  uint32_t most_keys = 0;
  bool appends = false;  // options.append was given: set_position, not set_keys
  Buffer lengths;        // host-visible: the Nk the kernels read (common.glsl `lengths`)
  uint64_t device_bytes = 0;
  TexelViews texel_views{};  // K, V as texels (register tiles)
  DispatchList dispatches_;
};

/// rope.comp's flags: rotate (else copy), pairs (x_i, x_i+d/2), output rows and angles from
/// lengths.position.
constexpr uint32_t kRowsHalf = 1, kRowsRotate = 2, kRowsAtPosition = 4, kAnglesAtPosition = 8;
/// Q [B, H, Nq, d] against K and V pages [pages, Hkv, page_size, d or dv] and their page table
/// (attention.cpp): Nk is the longest sequence's length, kv_rows 1.
Dims check_paged_shapes(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                        const std::vector<int64_t>& v, const PageTable& pages);
uint32_t auto_splits(const DeviceInfo& info, uint64_t groups, uint32_t nk, uint32_t keys,
                     uint64_t gpu_groups = 1024);

}  // namespace flashvk::detail
