#pragma once
// Context: the Vulkan instance, device and queue the engine runs on, created by the engine
// (headless) or borrowed from an application that already has them.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

namespace flashvk {

namespace detail {
struct ContextImpl;
}

/// How the cooperative-matrix kernels (TileLayout::cooperative_matrix) reach matrix units.
enum class MatrixApi {
  /// ContextOptions: khr where the device has it, else nv, else emulated (with fp16 storage),
  /// else none
  automatic,
  none,       ///< no matrix kernels
  khr,        ///< VK_KHR_cooperative_matrix (NVIDIA, AMD RDNA3 and later, Intel Arc)
  nv,         ///< VK_NV_cooperative_matrix (NVIDIA's first extension)
  /// VK_NV_cooperative_matrix2 (NVIDIA): khr's products, with the softmax kept in accumulator
  /// matrices by the second extension's row operations (reductions, per-element functions,
  /// conversions); 16x16x16 and Vulkan 1.3 (its kernels are SPIR-V 1.6). Only where asked for;
  /// past d or dv = 128 the calls run khr's kernel.
  nv2,
  /// The same kernels with the products in ordinary arithmetic, on any device with fp16
  /// storage: slow, for running the matrix kernels where there are no matrix units (tests on a
  /// CPU). Runs only where a call asks for TileLayout::cooperative_matrix.
  emulated,
  /// nv2's kernel the same way (its row operations in ordinary arithmetic too), at 16x16x16.
  emulated_nv2,
};
/// "auto", "none", "khr", "nv", "nv2", "emulated", "emulated-nv2".
const char* matrix_api_name(MatrixApi api);
/// Whether `api` runs the matrix kernels on the device's matrix units (khr, nv, nv2).
bool on_matrix_units(MatrixApi api);
/// Whether `api` runs nv2's kernel, the softmax in accumulators (nv2, emulated_nv2).
bool keeps_softmax_in_matrices(MatrixApi api);

/// A shape of the matrix units as the cooperative-matrix kernels take it: an m x k fp16 matrix
/// times a k x n one, accumulated in fp32, by a subgroup of `subgroup` lanes (each lane holds 8
/// of the m x n accumulators). {}: none.
struct MatrixShape {
  uint32_t m = 0, n = 0, k = 0, subgroup = 0;
  bool operator==(const MatrixShape&) const = default;
};
/// The shapes the kernels are built for, in the order a device's list
/// (vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR) is searched: 16x16x16 by 32 lanes (NVIDIA,
/// AMD RDNA3 and later), 8x16x16 by 16 (Intel Xe2), 8x8x16 by 8 (Intel Arc A-series).
inline constexpr MatrixShape kMatrixShapes[] = {{16, 16, 16, 32}, {8, 16, 16, 16}, {8, 8, 16, 8}};
/// "16x16x16 by 32 lanes"; "none" for {}.
std::string matrix_shape_name(const MatrixShape& shape);

/// What the engine needs to know about a device; `flashvk devices` prints it.
struct DeviceInfo {
  uint32_t index = 0;
  std::string name;
  std::string type;  // "discrete", "integrated", "virtual", "cpu", "other"
  std::string driver;
  uint32_t api_version = 0;
  uint32_t max_shared_memory = 0;          // bytes per workgroup
  uint32_t max_workgroup_invocations = 0;  // per workgroup
  uint32_t max_workgroup_count[3] = {0, 0, 0};
  /// Lanes a subgroup has: the device's default (subgroupSize); for a context, the size its
  /// subgroup kernels are built for and require (ContextOptions::subgroup_size).
  uint32_t subgroup_size = 0;
  /// The sizes a compute pipeline may require (VK_EXT_subgroup_size_control's
  /// minSubgroupSize..maxSubgroupSize; both subgroup_size without it), and how many subgroups a
  /// workgroup may then have (maxComputeWorkgroupSubgroups; 0 without it).
  uint32_t min_subgroup_size = 0, max_subgroup_size = 0, max_workgroup_subgroups = 0;
  /// Compute pipelines can require a subgroup size with every subgroup full
  /// (VK_EXT_subgroup_size_control: subgroupSizeControl, computeFullSubgroups, compute among
  /// requiredSubgroupSizeStages). Vulkan promises no subgroup size otherwise, so the kernels
  /// that assume one (register tiles, lanes, register blocks' shuffles, matrix units) need it.
  bool subgroup_size_control = false;
  /// Compute shaders have subgroup shuffle and arithmetic operations; for a context, also that
  /// its kernels may use them: the device has subgroup_size_control and the context enabled it
  /// (its pipelines require the sizes their kernels were built for). Without, shared memory
  /// does what the shuffles would.
  bool subgroup_shuffle = false;
  uint64_t max_storage_buffer_range = 0;      // bytes one storage-buffer binding can see
  uint64_t max_texel_buffer_elements = 0;     // texels one texel-buffer binding can see
  uint64_t min_storage_offset_alignment = 0;  // a storage-buffer binding's offset divides by it
  uint64_t min_texel_offset_alignment = 0;    // a texel-buffer view's offset divides by it
  bool texel_buffers = false;        // RGBA fp32 and fp16 uniform texel buffers (register tiles)
  uint64_t max_allocation = 0;       // bytes one allocation may have
  uint64_t device_local_memory = 0;  // bytes in the largest device-local heap
  bool fp16_storage = false;         // storageBuffer16BitAccess is supported
  /// shaderFloat16 (VK_KHR_shader_float16_int8 or Vulkan 1.2): fp16 arithmetic in shaders, for
  /// ExecutionHints::fp16_arithmetic.
  bool fp16_arithmetic = false;
  /// The matrix units' API Context::create takes by default: khr where the device has
  /// VK_KHR_cooperative_matrix with one of kMatrixShapes (fp16 products accumulated in fp32,
  /// by subgroups of the shape's size that the pipeline can require: VK_EXT_subgroup_size_
  /// control), shaderFloat16 and the Vulkan memory model with device scope; else nv where it has
  /// VK_NV_cooperative_matrix with 16x16x16 by 32, shaderFloat16 and the memory model; else none.
  MatrixApi matrix_api = MatrixApi::none;
  /// The shape the matrix kernels take on matrix_api: the first of kMatrixShapes the device
  /// lists (nv: 16x16x16 by 32); {} for none. For a context, the shape of its own matrix API
  /// (emulated: ContextOptions::emulated_matrix_shape).
  MatrixShape matrix_shape;
  bool cooperative_matrix = false;     ///< matrix_api is khr or nv
  bool nv_cooperative_matrix = false;  ///< nv can run (also where khr is the default)
  /// nv2 can run: khr at 16x16x16 by 32, VK_NV_cooperative_matrix2 with its reductions,
  /// per-element operations and conversions, and Vulkan 1.3.
  bool nv_cooperative_matrix2 = false;
  bool timestamps = false;
  float timestamp_period_ns = 1.0f;
  /// VK_KHR_pipeline_executable_properties: the driver tells what it compiled (registers,
  /// spills, occupancy, its disassembly); describe_pipelines() reports it.
  bool pipeline_statistics = false;
  /// Vector registers a SIMD holds for 64-lane subgroups, where the driver says (AMD's
  /// VK_AMD_shader_core_properties, vgprsPerSimd: RADV gives 512 on RDNA2 and RDNA3.5, 768 on
  /// Navi 31); 0 elsewhere. The decoding kernel sizes its steps so that 8 subgroups a SIMD fit.
  uint32_t registers_per_simd = 0;
};

/// Lists the Vulkan devices the loader finds, in the loader's order (the index used everywhere).
std::vector<DeviceInfo> list_devices();
/// The device Context::create picks when ContextOptions::device is -1: the first discrete GPU,
/// else the first integrated one, else the first device (an index into `devices`).
uint32_t default_device(const std::vector<DeviceInfo>& devices);

/// Limits lower than the device's, to see how work behaves on a smaller device (0 = the device's).
struct LimitOverrides {
  uint64_t max_storage_buffer_range = 0;
  uint64_t max_allocation = 0;
  uint32_t max_workgroup_count = 0;        ///< applied to x, y and z
  uint32_t max_shared_memory = 0;          ///< bytes per workgroup
  uint32_t max_workgroup_invocations = 0;  ///< per workgroup
  bool no_subgroup_operations = false;     ///< as a device without subgroup shuffles
  /// Vulkan's guaranteed minimums for compute: 16 KiB of shared memory, 128 invocations a
  /// workgroup, no subgroup operations (a small phone GPU, at worst).
  static LimitOverrides vulkan_minimums() { return {0, 0, 0, 16384, 128, true}; }
};

struct ContextOptions {
  int device = -1;          ///< device index; -1: the first discrete, else integrated, else 0
  bool validation = false;  ///< enable VK_LAYER_KHRONOS_validation with synchronization checks
  LimitOverrides limits;
  /// A file for the driver's compiled pipelines (VkPipelineCache): read when the context is
  /// created (ignored unless it was written for this very device and driver), written back
  /// when the context is destroyed. Empty: none.
  std::string pipeline_cache_path;
  /// A context that only compiles: the device, the pipeline cache and pipelines, and no memory,
  /// queue work or command pool, so that it runs on a device that cannot run work (Mesa's
  /// RADV_FORCE_FAMILY null device: AMD's compiler without AMD's GPU). Its pipelines keep the
  /// driver's statistics and disassembly where the device has VK_KHR_pipeline_executable_
  /// properties (describe_pipelines). Tensors and attention calls on it throw Error.
  bool compile_only = false;
  /// Which API the matrix kernels use (automatic: DeviceInfo::matrix_api, or emulated where that
  /// is none). khr, nv or nv2 where the device lacks it, or emulated without fp16 storage,
  /// throws Error. nv2 creates the instance for Vulkan 1.3.
  MatrixApi matrix_api = MatrixApi::automatic;
  /// The subgroup size the kernels that use subgroup operations are built for and require
  /// (0: the device's default, DeviceInfo::subgroup_size): one of min_subgroup_size ..
  /// max_subgroup_size on a device with subgroup_size_control (wave32 or wave64 on AMD; SIMD8,
  /// 16 or 32 on Intel), else Error. The matrix units' kernels require their shape's size
  /// (DeviceInfo::matrix_shape) whatever it is.
  uint32_t subgroup_size = 0;
  /// matrix_api emulated: the shape whose kernels the stand-in runs, one of kMatrixShapes, so
  /// that a CPU runs the logic a device of that shape would; {}: the device's own
  /// (DeviceInfo::matrix_shape), else 16x16x16 by 32. Another shape, or one set where the
  /// context's matrix API is not emulated, throws Error.
  MatrixShape emulated_matrix_shape;
  /// A timing diagnostic, never for results: phases the matrix kernels leave out, by name and
  /// separated by commas (staging, scores, softmax, pv; docs/performance.md), to tell where a
  /// GPU's time goes; their outputs are then wrong. Two more leave out a way of holding data,
  /// not work, and keep the results: `prefetch` (each K/V tile fetched only as it is stored,
  /// not during the tile before) and `queries` (Q's matrices read from shared memory at each
  /// tile, not held in registers), which tell what registers would buy. Empty: none. Another
  /// name throws Error. (`flashvk bench` and `flashvk pipelines` take it from the environment
  /// variable FLASHVK_MATRIX_SKIP.)
  std::string matrix_skip;
};

/// Handles of an application's own Vulkan objects. The engine never destroys any of them.
/// The device must have been created with Vulkan 1.1 or later; `fp16_storage_enabled` says
/// whether storageBuffer16BitAccess was enabled on it (needed for DType::f16).
struct ExternalDevice {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical_device = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;  ///< a queue with compute support
  uint32_t queue_family = 0;
  bool fp16_storage_enabled = false;
  /// What the device was created with for the matrix kernels: khr, VK_KHR_cooperative_matrix
  /// (feature cooperativeMatrix), shaderFloat16, vulkanMemoryModel and
  /// vulkanMemoryModelDeviceScope; nv, VK_NV_cooperative_matrix (feature cooperativeMatrix),
  /// shaderFloat16, vulkanMemoryModel and vulkanMemoryModelDeviceScope; nv2, khr's and
  /// VK_NV_cooperative_matrix2 (cooperativeMatrixReductions, cooperativeMatrixConversions and
  /// cooperativeMatrixPerElementOperations) and maintenance4 (its kernels' SPIR-V 1.6 sizes the
  /// workgroup with LocalSizeId) on an instance and device of Vulkan 1.3; all three
  /// also subgroup_size_control_enabled; emulated or emulated_nv2, fp16 storage alone (slow; for
  /// tests); none (automatic is taken as none).
  MatrixApi matrix_api = MatrixApi::none;
  /// Whether shaderFloat16 (VkPhysicalDeviceShaderFloat16Int8Features) was enabled:
  /// ExecutionHints::fp16_arithmetic needs it. Implied by matrix_api khr, nv or nv2.
  bool fp16_arithmetic_enabled = false;
  /// Whether subgroupSizeControl and computeFullSubgroups (VkPhysicalDeviceSubgroupSizeControl
  /// Features, VK_EXT_subgroup_size_control or Vulkan 1.3) were enabled: the kernels that use
  /// subgroup operations require their subgroup size, so without it they give way to shared
  /// memory (slower on GPUs), and matrix_api khr, nv or nv2 is refused.
  bool subgroup_size_control_enabled = false;
  std::string pipeline_cache_path;  ///< as in ContextOptions
};

/// The Vulkan objects and device memory the engine holds, over every context of the process
/// (the application's own objects are not counted): for an app's memory budget, and to check
/// that a recorded decode step creates nothing (objects_created stays put while it runs).
struct EngineStats {
  /// Every Vulkan object the engine has created or allocated: instances, devices, buffers,
  /// memory, buffer views, pools, descriptor sets, command buffers, pipelines, ...
  uint64_t objects_created = 0;
  uint64_t objects_live = 0;  ///< of those, not yet destroyed or freed
  uint64_t device_bytes = 0;  ///< device memory the engine has allocated and not yet freed
};
EngineStats engine_stats();

struct Modifiers;

/// What compiles the kernels with user-written functions (Modifiers::score_mod and mask_mod).
/// flashvk::flex::enable(ctx) installs glslang's; a context without one refuses such calls.
class KernelCompiler {
 public:
  virtual ~KernelCompiler() = default;
  /// SPIR-V of the kernel build `build` (a build name of shaders/builds.def) with `mods`'
  /// functions in it; throws Error, in one line naming the file and line, where they do not
  /// compile. Called once per build and set of functions (the context keeps the pipelines).
  virtual std::vector<uint32_t> compile(const std::string& build, const Modifiers& mods) = 0;
};

class Context {
 public:
  /// Creates an instance and device of its own (headless, no surface).
  static Context create(const ContextOptions& options = {});
  /// Runs on an application's device. Submissions to `queue` are serialised by this context only:
  /// the application must not use the queue from another thread while the engine submits.
  static Context adopt(const ExternalDevice& external);

  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  ~Context();

  const DeviceInfo& device() const;
  bool owns_device() const;
  /// The Vulkan objects this context runs on, its own or the adopted ones: for creating buffers
  /// on its device that tensors view (Tensor::view), or recording on its queue's family. The
  /// queue is shared: the application must not submit to it while the engine does.
  ExternalDevice handles() const;
  /// Messages of warning or error severity from the validation layers since the last call.
  std::vector<std::string> take_validation_messages();
  /// Installs what compiles user-written attention (flashvk::flex::enable does).
  void set_kernel_compiler(std::shared_ptr<KernelCompiler> compiler);

  detail::ContextImpl& impl() const { return *impl_; }

 private:
  explicit Context(std::unique_ptr<detail::ContextImpl> impl);
  std::unique_ptr<detail::ContextImpl> impl_;
};

}  // namespace flashvk
