#pragma once
// Internal Vulkan plumbing: result checks, buffers, and the context's shared objects.
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <vulkan/vulkan.h>

#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "flashvk/error.hpp"
#include "layouts.hpp"

namespace flashvk::detail {

/// Throws VulkanError naming `call` unless `result` is VK_SUCCESS.
void check(VkResult result, const char* call);
/// The failure armed by testing::inject_failure for `call` (testing.hpp), or VK_SUCCESS; the
/// check compiles away unless the engine is built for tests (FLASHVK_FAULT_INJECTION). And
/// testing::clear_unroll_hints_on_llvmpipe's setting (false unless built for tests).
#ifdef FLASHVK_FAULT_INJECTION
VkResult injected(const char* call);
std::atomic<bool>& unroll_hints_cleared();
#else
inline VkResult injected(const char*) {
  return VK_SUCCESS;
}
inline bool unroll_hints_cleared() {
  return false;
}
#endif
void apply_overrides(DeviceInfo& info, const LimitOverrides& overrides);
/// engine_stats()'s counters: every site that creates or destroys a Vulkan object says so.
void objects_created(uint64_t n = 1);
void objects_destroyed(uint64_t n = 1);
void device_memory(int64_t bytes);  ///< allocated (> 0) or freed (< 0)

struct ContextImpl;
struct ShaderBlob;

/// A storage buffer with its own memory. Move-only.
class Buffer {
 public:
  Buffer() = default;
  Buffer(ContextImpl& ctx, uint64_t bytes, bool host_visible = false);
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  VkBuffer handle() const { return buffer_; }
  uint64_t bytes() const { return bytes_; }
  void* mapped() const { return mapped_; }
  void write(const void* data, uint64_t bytes, uint64_t offset = 0);
  void read(void* data, uint64_t bytes, uint64_t offset = 0) const;
  void fill(uint32_t word);

 private:
  void release();
  ContextImpl* ctx_ = nullptr;
  VkBuffer buffer_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  uint64_t bytes_ = 0;
  uint64_t allocated_ = 0;  // device memory bytes (the requirement's size)
  void* mapped_ = nullptr;
};

/// A copy into `dst` and a barrier that makes it visible to later shaders and transfers.
void record_copy_in(VkCommandBuffer cmd, VkBuffer src, uint64_t src_offset, VkBuffer dst,
                    uint64_t dst_offset, uint64_t bytes);
/// A barrier after earlier shaders and transfers, a copy into `dst`, and a barrier that makes it
/// visible to the host.
void record_copy_out(VkCommandBuffer cmd, VkBuffer src, uint64_t src_offset, VkBuffer dst,
                     uint64_t dst_offset, uint64_t bytes);
/// Blocking copies between host memory and `bytes` of any buffer from `offset`, through a
/// staging buffer.
void copy_to_buffer(ContextImpl& ctx, VkBuffer dst, uint64_t offset, const void* data,
                    uint64_t bytes);
void copy_from_buffer(ContextImpl& ctx, VkBuffer src, uint64_t offset, void* data, uint64_t bytes);

/// The specialization constants, in ID order (shaders/spec_constants.glsl).
namespace spec_id {
enum : uint32_t {
#define SPEC_WORKGROUP(id, field, value) field,
#define SPEC_CONSTANT(id, type, NAME, field, value) field,
#include "../../shaders/spec_constants.glsl"
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT
  count
};
// Every constant's ID is its position in the list: the map entries below are made by position.
#define SPEC_WORKGROUP(id, field, value) static_assert(field == id, "spec_constants.glsl: " #field);
#define SPEC_CONSTANT(id, type, NAME, field, value) \
  static_assert(field == id, "spec_constants.glsl: " #NAME "'s ID is not its position");
#include "../../shaders/spec_constants.glsl"
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT
}  // namespace spec_id

/// What a pipeline is built from besides its SPIR-V: the tile layout, the build options that
/// pick the SPIR-V (shaders/builds.def), and the specialization constants, each field named as
/// the shaders name the constant (in lower case: `bc` is BC, `rows` is ROWS).
struct Spec {
  TileLayout layout = TileLayout::shared;
  bool kv_quant = false;       // KV_QUANT: K and V in storage formats of their own
  bool block_shuffle = false;  // blocks: rows reduced with subgroup shuffles (BLOCK_SHUFFLE)
  bool block_f16 = false;      // blocks: fp16 products (BLOCK_F16; ExecutionHints::fp16_arithmetic)
  MatrixApi matrix = MatrixApi::none;  // cooperative matrices: the build's API (MAT)
  /// The lanes each subgroup of its pipeline must have, all of them active (VK_EXT_subgroup_size_
  /// control's required size and full subgroups), derived from the layout: the one rule for
  /// which kernels assume a subgroup size. Register tiles, lanes and register blocks with
  /// shuffles are built for the context's size (`context_subgroup`, DeviceInfo::subgroup_size);
  /// the matrix units' kernels need their shape's (SUBGROUP); shared tiles (and every pass that
  /// is not a tile layout), blocks without shuffles and the emulated matrix kernel (whose groups
  /// are not subgroups) need none (0).
  uint32_t required_subgroup(uint32_t context_subgroup) const {
    bool units = layout == TileLayout::cooperative_matrix && on_matrix_units(matrix);
    bool shuffles = layout == TileLayout::registers || layout == TileLayout::lanes ||
                    (layout == TileLayout::blocks && block_shuffle);
    return units ? subgroup : shuffles ? context_subgroup : 0;
  }
#define SPEC_WORKGROUP(id, field, value) uint32_t field = value;
#define SPEC_CONSTANT(id, type, NAME, field, value) uint32_t field = value;
#include "../../shaders/spec_constants.glsl"
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT

  /// The constants' values, by ID.
  std::array<uint32_t, spec_id::count> constants() const {
    return {
#define SPEC_WORKGROUP(id, field, value) field,
#define SPEC_CONSTANT(id, type, NAME, field, value) field,
#include "../../shaders/spec_constants.glsl"
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT
    };
  }
  /// Query rows one workgroup covers: one an invocation (shared tiles), ROWS an invocation
  /// (register tiles), ROWS a row group of LANES invocations (blocks), ROWS (lanes: all of a KV
  /// head's), or CM_M CM_ROW_MATRICES a group of SUBGROUP invocations over LANES (cooperative
  /// matrices: LANES groups a block of them).
  uint32_t block() const {
    return layout_row(layout).workgroup_rows(
        {workgroup, rows, lanes, subgroup, cm_m, cm_row_matrices});
  }
  bool operator<(const Spec& o) const {
    auto fields = [](const Spec& s) {
      return std::tie(s.layout, s.kv_quant, s.block_shuffle, s.block_f16, s.matrix);
    };
    return fields(*this) < fields(o) || (fields(*this) == fields(o) && constants() < o.constants());
  }
};

/// The bindings of the one descriptor set layout every kernel uses, from shaders/bindings.glsl:
/// kQ, kK, ... (kTrace, kTileBits and kChunksDone share binding 8, by build).
enum Binding : uint32_t {
#define BINDING(Name, number, what) k##Name = number,
#include "../../shaders/bindings.glsl"
#undef BINDING
};
/// Storage-buffer bindings 0 .. kHeads; then K, V and the mask as uniform texel buffers (register
/// tiles); then the uniform buffer of lengths (common.glsl `lengths`); then the user-written
/// functions' `flex_table[]` (Modifiers::flex_table; flashvk::flex).
constexpr uint32_t kBindings = kHeads + 1;
constexpr uint32_t kTexelBindings = 3;
constexpr uint32_t kLengthsBinding = kLengths;
constexpr uint32_t kFlexTableBinding = kFlexTable;
static_assert(kKTexels == kBindings && kVTexels == kKTexels + 1 && kMaskTexels == kVTexels + 1 &&
                  kLengths == kBindings + kTexelBindings && kFlexTable == kLengths + 1,
              "shaders/bindings.glsl: storage buffers, then texels, lengths and flex_table");

struct ContextImpl {
  bool owns = false;
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;
  uint32_t timestamp_bits = 0;
  bool fp16_enabled = false;
  MatrixApi matrix_api = MatrixApi::none;  // the cooperative-matrix kernels' (never automatic)
  bool fp16_arithmetic_enabled = false;  // shaderFloat16 is enabled
  bool size_control_enabled = false;     // subgroupSizeControl and computeFullSubgroups are
  bool compile_only = false;             // ContextOptions::compile_only: no memory, no queue work
  bool capture = false;  // pipelines keep the driver's statistics (pipeline_executable_properties)
  // llvmpipe ends every loop of a shader invocation once they have run 65535 iterations together
  // (LP_MAX_TGSI_LOOP_ITERATIONS); plans keep under it there.
  bool loop_limited = false;
  bool clear_unroll = false;  // testing::clear_unroll_hints_on_llvmpipe, on llvmpipe
  uint32_t matrix_skip = 0;   // ContextOptions::matrix_skip as CM_SKIP's bits
  VkDebugUtilsMessengerEXT messenger = VK_NULL_HANDLE;
  DeviceInfo info;
  VkPhysicalDeviceMemoryProperties memory{};

  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout pipeline_layout = VK_NULL_HANDLE;
  VkPipelineCache cache = VK_NULL_HANDLE;
  std::string cache_path;  // where the pipeline cache is loaded from and saved to; "" = nowhere
  VkCommandPool pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  Buffer dummy;  // bound where a kernel does not use a binding

  std::mutex submit_mutex;  // the queue, the command pool and the fence
  std::mutex pipeline_mutex;
  std::map<std::pair<std::string, Spec>, VkPipeline> pipelines;
  std::map<std::string, VkShaderModule> modules;
  std::shared_ptr<KernelCompiler> compiler;  // user-written functions (flashvk::flex::enable)
  std::map<std::string, std::vector<uint32_t>> user_words;  // user_pipeline's SPIR-V, by module
  std::mutex message_mutex;
  std::vector<std::string> messages;
  /// RoPE's cos/sin tables by (base, positions, d, first position), shared by the plans that
  /// hold them (plan_angles).
  std::mutex table_mutex;
  std::map<std::tuple<double, uint32_t, uint32_t, int64_t>, std::weak_ptr<Buffer>> angle_tables;

  ContextImpl() = default;
  ContextImpl(const ContextImpl&) = delete;
  ContextImpl& operator=(const ContextImpl&) = delete;
  ~ContextImpl();

  /// The descriptor set and pipeline layouts and the pipeline cache; then, unless compile_only,
  /// init_queue_objects().
  void init_shared_objects();
  void init_queue_objects();  // the command pool, the fence and the placeholder buffer
  /// Writes the pipeline cache to cache_path (a temporary file, then a rename); false on failure.
  bool save_pipeline_cache() const;
  uint32_t memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const;
  /// The SPIR-V the driver gets for `blob` (spirv.hpp's coherence_at_barriers, unless
  /// spirv_as_built(); the tests' unroll hints aside): the pipeline report's.
  std::vector<uint32_t> driver_spirv(const ShaderBlob& blob) const;
  /// The constants a pipeline of `spec` is created with: its own, but for the matrix kernels'
  /// CM_SKIP, which is the context's (ContextOptions::matrix_skip): the pipeline report's too.
  std::array<uint32_t, spec_id::count> driver_constants(const Spec& spec) const;
  /// The pipeline of the embedded build `blob` with these constants, built once and cached.
  VkPipeline pipeline(const ShaderBlob& blob, const Spec& spec);
  VkPipeline pipeline(const ShaderBlob& blob, const Spec& spec,
                      const std::lock_guard<std::mutex>& held);  // pipeline_mutex held
  /// The pipeline of build `build` with `mods`' user-written functions compiled in (compiler),
  /// the module kept per build and functions.
  VkPipeline user_pipeline(const std::string& build, const Modifiers& mods, const Spec& spec);
  /// The SPIR-V user_pipeline compiled for `build` and `mods` (the pipeline report's), or none.
  std::vector<uint32_t> user_spirv(const std::string& build, const Modifiers& mods);
  /// Throws unless the context can run work (not ContextOptions::compile_only); `what` names it.
  void check_runs(const char* what) const;
  /// Records with `fill`, submits, and waits for the queue to finish it.
  void submit_and_wait(const std::function<void(VkCommandBuffer)>& fill);
};

/// A compute-to-everything barrier on all memory: the kernels' writes become visible to the next
/// dispatch, to transfers and to the host.
void compute_barrier(VkCommandBuffer cmd, VkPipelineStageFlags dst_stages,
                     VkAccessFlags dst_access);

DeviceInfo describe(VkInstance instance, VkPhysicalDevice physical, uint32_t index);
/// The matrix API a context asking for `requested` runs (automatic: the device's default);
/// throws Error, its message led by `who`, where the device cannot have it.
MatrixApi usable_matrix_api(const DeviceInfo& info, MatrixApi requested, const std::string& who);
// The first of kMatrixShapes that `listed` (vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)
// has as fp16 products into fp32 by a subgroup, and whose subgroup size a compute pipeline can
// require with every lane active (VK_EXT_subgroup_size_control); {} if none.
MatrixShape pick_matrix_shape(const std::vector<VkCooperativeMatrixPropertiesKHR>& listed,
                              const DeviceInfo& info);
// The shape a context's matrix kernels take on `api` (DeviceInfo::matrix_shape for the context):
// the device's for khr, 16x16x16 by 32 for nv, `emulated` (ContextOptions::emulated_matrix_shape,
// checked to be one of kMatrixShapes) else the device's else 16x16x16 by 32 for emulated.
MatrixShape context_matrix_shape(const DeviceInfo& info, MatrixApi api, MatrixShape emulated,
                                 const std::string& who);

}  // namespace flashvk::detail
