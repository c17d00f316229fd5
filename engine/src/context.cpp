#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string_view>
#include <utility>

#include "flashvk/context.hpp"
#include "shader_registry.hpp"
#include "spirv.hpp"
#include "tiling.hpp"
#include "vk.hpp"

namespace flashvk {
namespace detail {

namespace {
std::atomic<uint64_t> g_created{0}, g_destroyed{0};
std::atomic<int64_t> g_device_bytes{0};
}  // namespace

// How many of `handles` are set.
template <typename... Handle>
uint64_t non_null(Handle... handles) {
  return ((handles != VK_NULL_HANDLE ? 1u : 0u) + ...);
}

void objects_created(uint64_t n) {
  g_created += n;
}
void objects_destroyed(uint64_t n) {
  g_destroyed += n;
}
void device_memory(int64_t bytes) {
  g_device_bytes += bytes;
}

void check(VkResult result, const char* call) {
  if (result != VK_SUCCESS) throw VulkanError(result, call);
}

void apply_overrides(DeviceInfo& info, const LimitOverrides& o) {
  auto lower = [](auto& value, auto forced) {
    if (forced && forced < value) value = forced;
  };
  lower(info.max_storage_buffer_range, o.max_storage_buffer_range);
  lower(info.max_allocation, o.max_allocation);
  for (uint32_t& count : info.max_workgroup_count) lower(count, o.max_workgroup_count);
  lower(info.max_shared_memory, o.max_shared_memory);
  lower(info.max_workgroup_invocations, o.max_workgroup_invocations);
  if (o.no_subgroup_operations) info.subgroup_shuffle = false;
}

namespace {

const char* kValidationLayer = "VK_LAYER_KHRONOS_validation";

std::string type_name(VkPhysicalDeviceType type) {
  switch (type) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT severity,
                                          VkDebugUtilsMessageTypeFlagsEXT,
                                          const VkDebugUtilsMessengerCallbackDataEXT* data,
                                          void* user) {
  if (severity < VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT) return VK_FALSE;
  auto* ctx = static_cast<ContextImpl*>(user);
  std::lock_guard lock(ctx->message_mutex);
  ctx->messages.emplace_back(data->pMessage ? data->pMessage : "(no message)");
  return VK_FALSE;
}

VkDebugUtilsMessengerCreateInfoEXT messenger_info(ContextImpl* ctx) {
  VkDebugUtilsMessengerCreateInfoEXT info{VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT};
  info.messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                         VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT;
  info.messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                     VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT;
  info.pfnUserCallback = on_message;
  info.pUserData = ctx;
  return info;
}

bool layer_present(const char* name) {
  uint32_t count = 0;
  vkEnumerateInstanceLayerProperties(&count, nullptr);
  std::vector<VkLayerProperties> layers(count);
  vkEnumerateInstanceLayerProperties(&count, layers.data());
  return std::any_of(layers.begin(), layers.end(), [&](const VkLayerProperties& l) {
    return std::strcmp(l.layerName, name) == 0;
  });
}

VkInstance make_instance(ContextImpl* ctx, bool validation, uint32_t api_version) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "flashvk";
  app.pEngineName = "flashvk";
  app.apiVersion = api_version;
  VkInstanceCreateInfo info{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  info.pApplicationInfo = &app;
  std::vector<const char*> layers;
  std::vector<const char*> extensions;
  VkDebugUtilsMessengerCreateInfoEXT debug = messenger_info(ctx);
  // Synchronization validation catches missing barriers between our dispatches.
  VkValidationFeatureEnableEXT enables[] = {
      VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT};
  VkValidationFeaturesEXT features{VK_STRUCTURE_TYPE_VALIDATION_FEATURES_EXT};
  features.enabledValidationFeatureCount = 1;
  features.pEnabledValidationFeatures = enables;
  if (validation) {
    if (!layer_present(kValidationLayer))
      throw Error(std::string("validation was requested but ") + kValidationLayer +
                  " is not installed (Debian: vulkan-validationlayers)");
    layers.push_back(kValidationLayer);
    extensions.push_back(VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    debug.pNext = &features;
    info.pNext = &debug;
  }
  info.enabledLayerCount = static_cast<uint32_t>(layers.size());
  info.ppEnabledLayerNames = layers.data();
  info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  VkInstance instance = VK_NULL_HANDLE;
  VkResult result = vkCreateInstance(&info, nullptr, &instance);
  if (result == VK_ERROR_INCOMPATIBLE_DRIVER)
    throw Error(
        "no Vulkan driver found (vkCreateInstance: VK_ERROR_INCOMPATIBLE_DRIVER); install one, "
        "e.g. Mesa's lavapipe: apt-get install mesa-vulkan-drivers");
  check(result, "vkCreateInstance");
  objects_created();
  return instance;
}

std::vector<VkPhysicalDevice> physical_devices(VkInstance instance) {
  uint32_t count = 0;
  check(vkEnumeratePhysicalDevices(instance, &count, nullptr), "vkEnumeratePhysicalDevices");
  std::vector<VkPhysicalDevice> devices(count);
  check(vkEnumeratePhysicalDevices(instance, &count, devices.data()), "vkEnumeratePhysicalDevices");
  return devices;
}

uint32_t compute_family(VkPhysicalDevice physical, uint32_t* timestamp_bits) {
  uint32_t count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, families.data());
  for (uint32_t i = 0; i < count; ++i) {
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      *timestamp_bits = families[i].timestampValidBits;
      return i;
    }
  }
  throw Error("the device has no queue family with compute support");
}

// What the cooperative-matrix kernels (shaders/flash_cm.comp, coopmat.glsl) need besides the
// basics, through VK_NV_cooperative_matrix (MatrixApi::nv) and through VK_KHR_cooperative_matrix
// (MatrixApi::khr). glslang builds both with the Vulkan memory model.
constexpr const char* kCoopmatExtensions[] = {VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME,
                                              VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME,
                                              VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME};
constexpr const char* kKhrCoopmatExtensions[] = {VK_KHR_COOPERATIVE_MATRIX_EXTENSION_NAME,
                                                 VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME,
                                                 VK_KHR_VULKAN_MEMORY_MODEL_EXTENSION_NAME};
// shaderFloat16 (ExecutionHints::fp16_arithmetic). The engine's instance asks for Vulkan 1.1,
// so the extension is enabled even where the device has it in core (1.2).
constexpr const char* kFloat16Extension = VK_KHR_SHADER_FLOAT16_INT8_EXTENSION_NAME;

// Feature structures chained for vkGetPhysicalDeviceFeatures2 and vkCreateDevice. Not copyable:
// the chain points into itself.
struct CoopmatFeatures {
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceShaderFloat16Int8Features float16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceVulkanMemoryModelFeatures memory_model{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
  CoopmatFeatures() {
    coopmat.pNext = &float16;
    float16.pNext = &memory_model;
  }
  CoopmatFeatures(const CoopmatFeatures&) = delete;
  CoopmatFeatures& operator=(const CoopmatFeatures&) = delete;
};

// The same for VK_KHR_cooperative_matrix, and VK_NV_cooperative_matrix2 (MatrixApi::nv2), which
// the chain takes only where memory_model.pNext is pointed at it.
struct KhrCoopmatFeatures {
  VkPhysicalDeviceCooperativeMatrixFeaturesKHR coopmat{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
  VkPhysicalDeviceShaderFloat16Int8Features float16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES};
  VkPhysicalDeviceVulkanMemoryModelFeatures memory_model{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
  VkPhysicalDeviceCooperativeMatrix2FeaturesNV coopmat2{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV};
  // SPIR-V 1.6 declares a workgroup size from specialisation constants with LocalSizeId, which
  // needs maintenance4 (VUID-RuntimeSpirv-LocalSizeId-06434): nv2's kernels and flex builds.
  VkPhysicalDeviceMaintenance4Features maintenance4{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES};
  KhrCoopmatFeatures() {
    coopmat.pNext = &float16;
    float16.pNext = &memory_model;
  }
  KhrCoopmatFeatures(const KhrCoopmatFeatures&) = delete;
  KhrCoopmatFeatures& operator=(const KhrCoopmatFeatures&) = delete;
};

void make_device(ContextImpl& ctx) {
  ctx.family = compute_family(ctx.physical, &ctx.timestamp_bits);
  float priority = 1.0f;
  VkDeviceQueueCreateInfo queue{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  queue.queueFamilyIndex = ctx.family;
  queue.queueCount = 1;
  queue.pQueuePriorities = &priority;
  VkPhysicalDevice16BitStorageFeatures storage16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  storage16.storageBuffer16BitAccess = ctx.info.fp16_storage ? VK_TRUE : VK_FALSE;
  VkDeviceCreateInfo info{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  info.pNext = &storage16;
  info.queueCreateInfoCount = 1;
  info.pQueueCreateInfos = &queue;
  CoopmatFeatures coopmat;
  KhrCoopmatFeatures khr;
  std::vector<const char*> extensions;
  if (ctx.matrix_api == MatrixApi::khr || ctx.matrix_api == MatrixApi::nv2) {
    khr.coopmat.cooperativeMatrix = VK_TRUE;
    khr.float16.shaderFloat16 = VK_TRUE;
    khr.memory_model.vulkanMemoryModel = VK_TRUE;
    // With the memory model on, the other kernels' atomics (Device scope) need this too.
    khr.memory_model.vulkanMemoryModelDeviceScope = VK_TRUE;
    extensions.assign(std::begin(kKhrCoopmatExtensions), std::end(kKhrCoopmatExtensions));
    storage16.pNext = &khr.coopmat;
    if (ctx.matrix_api == MatrixApi::nv2) {  // the row operations of flash_cm.comp's CM_NV2
      khr.coopmat2.cooperativeMatrixReductions = VK_TRUE;
      khr.coopmat2.cooperativeMatrixConversions = VK_TRUE;
      khr.coopmat2.cooperativeMatrixPerElementOperations = VK_TRUE;
      khr.maintenance4.maintenance4 = VK_TRUE;
      khr.memory_model.pNext = &khr.coopmat2;
      khr.coopmat2.pNext = &khr.maintenance4;
      extensions.push_back(VK_NV_COOPERATIVE_MATRIX_2_EXTENSION_NAME);
    }
  } else if (ctx.matrix_api == MatrixApi::nv) {
    coopmat.coopmat.cooperativeMatrix = VK_TRUE;
    coopmat.float16.shaderFloat16 = VK_TRUE;
    coopmat.memory_model.vulkanMemoryModel = VK_TRUE;
    // With the memory model on, the other kernels' atomics (Device scope) need this too.
    coopmat.memory_model.vulkanMemoryModelDeviceScope = VK_TRUE;
    storage16.pNext = &coopmat.coopmat;
    extensions.assign(std::begin(kCoopmatExtensions), std::end(kCoopmatExtensions));
  } else if (ctx.info.fp16_arithmetic) {  // shaderFloat16 alone
    coopmat.float16.shaderFloat16 = VK_TRUE;
    coopmat.float16.pNext = nullptr;
    storage16.pNext = &coopmat.float16;
    extensions.push_back(kFloat16Extension);
  }
  // Pipelines that require their subgroup size (Spec::required_subgroup), wherever the device
  // lets them: the subgroup kernels run only so (DeviceInfo::subgroup_shuffle).
  VkPhysicalDeviceSubgroupSizeControlFeaturesEXT size_control{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
  ctx.size_control_enabled = ctx.info.subgroup_size_control;
  if (ctx.size_control_enabled) {
    size_control.subgroupSizeControl = VK_TRUE;
    size_control.computeFullSubgroups = VK_TRUE;
    size_control.pNext = const_cast<void*>(info.pNext);
    info.pNext = &size_control;
    extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
  }
  // A compile-only context keeps what the driver compiled (describe_pipelines).
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR executables{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR};
  ctx.capture = ctx.compile_only && ctx.info.pipeline_statistics;
  if (ctx.capture) {
    executables.pipelineExecutableInfo = VK_TRUE;
    executables.pNext = const_cast<void*>(info.pNext);
    info.pNext = &executables;
    extensions.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
  }
  info.enabledExtensionCount = static_cast<uint32_t>(extensions.size());
  info.ppEnabledExtensionNames = extensions.data();
  check(vkCreateDevice(ctx.physical, &info, nullptr, &ctx.device), "vkCreateDevice");
  objects_created();
  vkGetDeviceQueue(ctx.device, ctx.family, 0, &ctx.queue);
  ctx.fp16_enabled = ctx.info.fp16_storage;
  ctx.fp16_arithmetic_enabled = ctx.info.fp16_arithmetic;
}

bool texel_buffer_format(VkPhysicalDevice physical, VkFormat format) {
  VkFormatProperties props{};
  vkGetPhysicalDeviceFormatProperties(physical, format, &props);
  return (props.bufferFeatures & VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT) != 0;
}

bool has_extensions(VkPhysicalDevice physical, const std::vector<std::string>& names) {
  uint32_t count = 0;
  if (vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, nullptr) != VK_SUCCESS)
    return false;
  std::vector<VkExtensionProperties> props(count);
  if (vkEnumerateDeviceExtensionProperties(physical, nullptr, &count, props.data()) != VK_SUCCESS)
    return false;
  return std::all_of(names.begin(), names.end(), [&](const std::string& name) {
    return std::any_of(props.begin(), props.end(),
                       [&](const VkExtensionProperties& p) { return name == p.extensionName; });
  });
}

// Whether VK_NV_cooperative_matrix takes 16x16x16 (kMatrixShapes[0]), fp16 A and B, fp32 C
// and D, a subgroup at a time: the one shape the kernels use through it.
bool coopmat_shape(VkInstance instance, VkPhysicalDevice physical) {
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  uint32_t count = 0;
  if (!get || get(physical, &count, nullptr) != VK_SUCCESS) return false;
  std::vector<VkCooperativeMatrixPropertiesNV> props(
      count, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (get(physical, &count, props.data()) != VK_SUCCESS) return false;
  return std::any_of(props.begin(), props.end(), [](const VkCooperativeMatrixPropertiesNV& p) {
    return p.MSize == 16 && p.NSize == 16 && p.KSize == 16 &&
           p.AType == VK_COMPONENT_TYPE_FLOAT16_NV && p.BType == VK_COMPONENT_TYPE_FLOAT16_NV &&
           p.CType == VK_COMPONENT_TYPE_FLOAT32_NV && p.DType == VK_COMPONENT_TYPE_FLOAT32_NV &&
           p.scope == VK_SCOPE_SUBGROUP_NV;
  });
}

// One feature structure (its sType set, no chain) as the device fills it in.
template <typename Features>
Features device_features(VkPhysicalDevice physical, Features wanted) {
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &wanted;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  return wanted;
}

bool fp16_arithmetic(VkPhysicalDevice physical) {
  return has_extensions(physical, {kFloat16Extension}) &&
         device_features(physical,
                         VkPhysicalDeviceShaderFloat16Int8Features{
                             VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES})
                 .shaderFloat16 == VK_TRUE;
}

bool pipeline_statistics(VkPhysicalDevice physical) {
  return has_extensions(physical, {VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME}) &&
         device_features(
             physical,
             VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR{
                 VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR})
                 .pipelineExecutableInfo == VK_TRUE;
}

// The shapes VK_KHR_cooperative_matrix lists.
std::vector<VkCooperativeMatrixPropertiesKHR> khr_coopmat_shapes(VkInstance instance,
                                                                 VkPhysicalDevice physical) {
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  uint32_t count = 0;
  if (!get || get(physical, &count, nullptr) != VK_SUCCESS) return {};
  std::vector<VkCooperativeMatrixPropertiesKHR> props(
      count, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR});
  if (get(physical, &count, props.data()) != VK_SUCCESS) return {};
  props.resize(count);
  return props;
}

// The subgroup sizes compute pipelines can require, all lanes active
// (VK_EXT_subgroup_size_control): DeviceInfo's min/max_subgroup_size, max_workgroup_subgroups
// and subgroup_size_control.
void describe_size_control(VkPhysicalDevice physical, DeviceInfo& info) {
  info.min_subgroup_size = info.max_subgroup_size = info.subgroup_size;
  if (!has_extensions(physical, {VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME})) return;
  VkPhysicalDeviceSubgroupSizeControlPropertiesEXT size{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &size;
  vkGetPhysicalDeviceProperties2(physical, &props);
  auto f = device_features(physical, VkPhysicalDeviceSubgroupSizeControlFeaturesEXT{
                                         VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT});
  info.subgroup_size_control = f.subgroupSizeControl && f.computeFullSubgroups &&
                               (size.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                               size.minSubgroupSize > 0 && size.maxComputeWorkgroupSubgroups > 0;
  if (!info.subgroup_size_control) return;
  info.min_subgroup_size = size.minSubgroupSize;
  info.max_subgroup_size = size.maxSubgroupSize;
  info.max_workgroup_subgroups = size.maxComputeWorkgroupSubgroups;
}

// Whether compute pipelines can require subgroups of `lanes` full lanes, as the matrix units'
// kernels require their shape's (VK_EXT_subgroup_size_control).
bool can_require_subgroup(const DeviceInfo& info, uint32_t lanes) {
  return info.subgroup_size_control && info.min_subgroup_size <= lanes &&
         info.max_subgroup_size >= lanes;
}

// The shape VK_KHR_cooperative_matrix gives the kernels, with the features they need; {} if
// it gives none.
MatrixShape khr_cooperative_matrix(VkInstance instance, VkPhysicalDevice physical,
                                   const DeviceInfo& info) {
  if (!has_extensions(physical,
                      {std::begin(kKhrCoopmatExtensions), std::end(kKhrCoopmatExtensions)}))
    return {};
  KhrCoopmatFeatures f;
  f.memory_model.pNext = nullptr;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &f.coopmat;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  VkPhysicalDeviceCooperativeMatrixPropertiesKHR stages{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &stages;
  vkGetPhysicalDeviceProperties2(physical, &props);
  bool usable = f.coopmat.cooperativeMatrix && f.float16.shaderFloat16 &&
                f.memory_model.vulkanMemoryModel && f.memory_model.vulkanMemoryModelDeviceScope &&
                (stages.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT);
  return usable ? pick_matrix_shape(khr_coopmat_shapes(instance, physical), info) : MatrixShape{};
}

// VK_NV_cooperative_matrix2 with what flash_cm.comp's CM_NV2 build uses, on Vulkan 1.3 (its
// SPIR-V is 1.6, whose LocalSizeId needs maintenance4: every 1.3 device has it).
bool cooperative_matrix2(VkPhysicalDevice physical, const DeviceInfo& info) {
  if (VK_API_VERSION_MINOR(info.api_version) < 3 && VK_API_VERSION_MAJOR(info.api_version) == 1)
    return false;
  if (!has_extensions(physical, {VK_NV_COOPERATIVE_MATRIX_2_EXTENSION_NAME})) return false;
  auto f = device_features(physical, VkPhysicalDeviceCooperativeMatrix2FeaturesNV{
                                         VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV});
  auto m4 = device_features(physical, VkPhysicalDeviceMaintenance4Features{
                                          VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_4_FEATURES});
  return f.cooperativeMatrixReductions && f.cooperativeMatrixConversions &&
         f.cooperativeMatrixPerElementOperations && m4.maintenance4;
}

bool cooperative_matrix(VkInstance instance, VkPhysicalDevice physical, const DeviceInfo& info) {
  if (!can_require_subgroup(info, kMatrixShapes[0].subgroup) ||
      !has_extensions(physical, {std::begin(kCoopmatExtensions), std::end(kCoopmatExtensions)}))
    return false;
  CoopmatFeatures f;
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &f.coopmat;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  return f.coopmat.cooperativeMatrix && f.float16.shaderFloat16 &&
         f.memory_model.vulkanMemoryModel && f.memory_model.vulkanMemoryModelDeviceScope &&
         coopmat_shape(instance, physical);
}

}  // namespace

DeviceInfo describe(VkInstance instance, VkPhysicalDevice physical, uint32_t index) {
  VkPhysicalDeviceSubgroupProperties subgroup{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props.pNext = &subgroup;
  vkGetPhysicalDeviceProperties2(physical, &props);
  VkPhysicalDeviceMaintenance3Properties m3{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 props_m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props_m3.pNext = &m3;
  vkGetPhysicalDeviceProperties2(physical, &props_m3);
  VkPhysicalDevice16BitStorageFeatures storage16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  VkPhysicalDeviceFeatures2 features{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  features.pNext = &storage16;
  vkGetPhysicalDeviceFeatures2(physical, &features);
  VkPhysicalDeviceMemoryProperties memory{};
  vkGetPhysicalDeviceMemoryProperties(physical, &memory);

  const VkPhysicalDeviceLimits& limits = props.properties.limits;
  DeviceInfo info;
  info.index = index;
  info.name = props.properties.deviceName;
  info.type = type_name(props.properties.deviceType);
  info.api_version = props.properties.apiVersion;
  uint32_t dv = props.properties.driverVersion;
  info.driver = std::to_string(VK_API_VERSION_MAJOR(dv)) + "." +
                std::to_string(VK_API_VERSION_MINOR(dv)) + "." +
                std::to_string(VK_API_VERSION_PATCH(dv));
  info.max_shared_memory = limits.maxComputeSharedMemorySize;
  info.max_workgroup_invocations = limits.maxComputeWorkGroupInvocations;
  for (int i = 0; i < 3; ++i) info.max_workgroup_count[i] = limits.maxComputeWorkGroupCount[i];
  info.subgroup_size = subgroup.subgroupSize;
  // Whether compute shaders have all of `ops`.
  auto compute_subgroups = [&](VkSubgroupFeatureFlags ops) {
    return (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
           (subgroup.supportedOperations & ops) == ops;
  };
  info.subgroup_shuffle =
      compute_subgroups(VK_SUBGROUP_FEATURE_SHUFFLE_BIT | VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  info.max_storage_buffer_range = limits.maxStorageBufferRange;
  info.max_texel_buffer_elements = limits.maxTexelBufferElements;
  info.min_storage_offset_alignment = limits.minStorageBufferOffsetAlignment;
  info.min_texel_offset_alignment = limits.minTexelBufferOffsetAlignment;
  info.texel_buffers = texel_buffer_format(physical, VK_FORMAT_R32G32B32A32_SFLOAT) &&
                       texel_buffer_format(physical, VK_FORMAT_R16G16B16A16_SFLOAT);
  info.max_allocation = m3.maxMemoryAllocationSize;
  for (uint32_t h = 0; h < memory.memoryHeapCount; ++h)
    if (memory.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
      info.device_local_memory =
          std::max<uint64_t>(info.device_local_memory, memory.memoryHeaps[h].size);
  info.fp16_storage = storage16.storageBuffer16BitAccess == VK_TRUE;
  info.fp16_arithmetic = fp16_arithmetic(physical);
  describe_size_control(physical, info);
  // The matrix kernel's groups exchange row values (shuffles) and vote on rescaling O.
  const bool matrix_subgroups =
      info.fp16_storage &&
      compute_subgroups(VK_SUBGROUP_FEATURE_SHUFFLE_BIT | VK_SUBGROUP_FEATURE_VOTE_BIT);
  info.nv_cooperative_matrix = matrix_subgroups && cooperative_matrix(instance, physical, info);
  MatrixShape khr =
      matrix_subgroups ? khr_cooperative_matrix(instance, physical, info) : MatrixShape{};
  info.matrix_api = khr.m                        ? MatrixApi::khr
                    : info.nv_cooperative_matrix ? MatrixApi::nv
                                                 : MatrixApi::none;
  info.matrix_shape = khr.m ? khr : info.nv_cooperative_matrix ? kMatrixShapes[0] : MatrixShape{};
  info.cooperative_matrix = info.matrix_api != MatrixApi::none;
  info.nv_cooperative_matrix2 = khr == kMatrixShapes[0] && cooperative_matrix2(physical, info);
  info.timestamps = limits.timestampComputeAndGraphics == VK_TRUE;
  info.timestamp_period_ns = limits.timestampPeriod;
  info.pipeline_statistics = pipeline_statistics(physical);
  if (has_extensions(physical, {VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME})) {
    VkPhysicalDeviceShaderCorePropertiesAMD core{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD};
    VkPhysicalDeviceProperties2 props_core{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    props_core.pNext = &core;
    vkGetPhysicalDeviceProperties2(physical, &props_core);
    info.registers_per_simd = core.vgprsPerSimd;
  }
  return info;
}

ContextImpl::~ContextImpl() {
  if (device != VK_NULL_HANDLE) {
    // A context that never got its fence (compile-only, or a device that cannot run work, whose
    // null driver has no queue to wait on) has submitted nothing.
    if (fence != VK_NULL_HANDLE) vkDeviceWaitIdle(device);
    save_pipeline_cache();  // best effort: a destructor cannot report failure
    dummy = Buffer();
    for (auto& [key, pipe] : pipelines) vkDestroyPipeline(device, pipe, nullptr);
    uint64_t made = pipelines.size();
    for (auto& [key, module] : modules) {
      if (!module) continue;  // its creation failed
      vkDestroyShaderModule(device, module, nullptr);
      ++made;
    }
    objects_destroyed(made);
    uint64_t shared = non_null(cache, pipeline_layout, set_layout, fence, pool);
    vkDestroyPipelineCache(device, cache, nullptr);
    vkDestroyPipelineLayout(device, pipeline_layout, nullptr);
    vkDestroyDescriptorSetLayout(device, set_layout, nullptr);
    vkDestroyFence(device, fence, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
    objects_destroyed(shared);
  }
  if (!owns) return;  // borrowed handles are the application's
  objects_destroyed(non_null(device, messenger, instance));
  if (device != VK_NULL_HANDLE) vkDestroyDevice(device, nullptr);
  if (messenger != VK_NULL_HANDLE) {
    auto destroy = reinterpret_cast<PFN_vkDestroyDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT"));
    if (destroy) destroy(instance, messenger, nullptr);
  }
  if (instance != VK_NULL_HANDLE) vkDestroyInstance(instance, nullptr);
}

namespace {

// The saved cache if it was written for this device and driver, else nothing: the header
// (VkPipelineCacheHeaderVersionOne) is checked here rather than trusting every driver to
// reject a foreign or damaged file.
std::vector<char> read_pipeline_cache(const std::string& path, VkPhysicalDevice physical) {
  if (path.empty()) return {};
  std::ifstream file(path, std::ios::binary);
  std::vector<char> data((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  VkPipelineCacheHeaderVersionOne header{};
  if (data.size() < sizeof(header)) return {};
  std::memcpy(&header, data.data(), sizeof(header));
  VkPhysicalDeviceProperties props{};
  vkGetPhysicalDeviceProperties(physical, &props);
  bool ours = header.headerSize >= sizeof(header) && header.headerSize <= data.size() &&
              header.headerVersion == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
              header.vendorID == props.vendorID && header.deviceID == props.deviceID &&
              std::memcmp(header.pipelineCacheUUID, props.pipelineCacheUUID, VK_UUID_SIZE) == 0;
  return ours ? data : std::vector<char>{};
}

}  // namespace

// Called from the destructor too, so nothing may escape: a failure (std::random_device, a full
// disk, an allocation) only means the next run compiles its pipelines again.
bool ContextImpl::save_pipeline_cache() const try {
  if (cache_path.empty() || cache == VK_NULL_HANDLE) return true;
  size_t size = 0;
  if (vkGetPipelineCacheData(device, cache, &size, nullptr) != VK_SUCCESS) return false;
  std::vector<char> data(size);
  if (vkGetPipelineCacheData(device, cache, &size, data.data()) != VK_SUCCESS) return false;
  // A name no other process writing the same cache picks (the standard library only: the engine
  // builds for Windows, Android and macOS too), then a rename that replaces the old file.
  std::random_device entropy;
  auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  std::string tmp =
      cache_path + ".tmp." + std::to_string(entropy()) + "." + std::to_string(uint64_t(now));
  {
    std::ofstream file(tmp, std::ios::binary);
    file.write(data.data(), static_cast<std::streamsize>(size));
    if (!file) {
      std::remove(tmp.c_str());
      return false;
    }
  }
  std::error_code error;
  std::filesystem::rename(tmp, cache_path, error);
  if (error) {
    std::remove(tmp.c_str());
    return false;
  }
  return true;
} catch (...) {
  return false;
}

void ContextImpl::init_shared_objects() {
  // The subgroup kernels run only where their pipelines can require their subgroup size.
  info.subgroup_shuffle = info.subgroup_shuffle && size_control_enabled;
  vkGetPhysicalDeviceMemoryProperties(physical, &memory);
  std::array<VkDescriptorSetLayoutBinding, kFlexTableBinding + 1> bindings{};
  for (uint32_t i = 0; i < bindings.size(); ++i) {
    bindings[i].binding = i;
    bindings[i].descriptorType = i < kBindings          ? VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
                                 : i < kLengthsBinding  ? VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER
                                 : i == kLengthsBinding ? VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER
                                                        : VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    bindings[i].descriptorCount = 1;
    bindings[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo set_info{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  set_info.bindingCount = static_cast<uint32_t>(bindings.size());
  set_info.pBindings = bindings.data();
  check(vkCreateDescriptorSetLayout(device, &set_info, nullptr, &set_layout),
        "vkCreateDescriptorSetLayout");
  objects_created();
  VkPushConstantRange push{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};  // the guaranteed minimum
  VkPipelineLayoutCreateInfo layout_info{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  layout_info.setLayoutCount = 1;
  layout_info.pSetLayouts = &set_layout;
  layout_info.pushConstantRangeCount = 1;
  layout_info.pPushConstantRanges = &push;
  check(vkCreatePipelineLayout(device, &layout_info, nullptr, &pipeline_layout),
        "vkCreatePipelineLayout");
  objects_created();
  VkPipelineCacheCreateInfo cache_info{VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
  std::vector<char> saved = read_pipeline_cache(cache_path, physical);
  cache_info.initialDataSize = saved.size();
  cache_info.pInitialData = saved.empty() ? nullptr : saved.data();
  check(vkCreatePipelineCache(device, &cache_info, nullptr, &cache), "vkCreatePipelineCache");
  objects_created();
  if (compile_only) return;
  // What running work needs. A device that cannot run any (a null device, which compiles only)
  // fails here, said in one line.
  try {
    init_queue_objects();
  } catch (const VulkanError& e) {
    throw Error(info.name + " cannot run work (" + e.what() +
                "); a compile-only context (ContextOptions::compile_only, `flashvk pipelines`) "
                "can still build its pipelines");
  }
}

void ContextImpl::init_queue_objects() {
  VkCommandPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pool_info.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pool_info.queueFamilyIndex = family;
  check(vkCreateCommandPool(device, &pool_info, nullptr, &pool), "vkCreateCommandPool");
  objects_created();
  VkFenceCreateInfo fence_info{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  VkResult result = injected("vkCreateFence");
  check(result ? result : vkCreateFence(device, &fence_info, nullptr, &fence), "vkCreateFence");
  objects_created();
  dummy = Buffer(*this, 16);
}

uint32_t ContextImpl::memory_type(uint32_t type_bits, VkMemoryPropertyFlags want) const {
  for (uint32_t i = 0; i < memory.memoryTypeCount; ++i)
    if ((type_bits & (1u << i)) && (memory.memoryTypes[i].propertyFlags & want) == want) return i;
  return UINT32_MAX;
}

namespace {

// ContextOptions::matrix_skip's names and CM_SKIP's bits (shaders/flash_cm.comp, SKIP_*).
constexpr uint32_t kSkipQueries = 32;  // Q's matrices from a shared array of their own
constexpr std::pair<std::string_view, uint32_t> kPhases[] = {
    {"staging", 1}, {"scores", 2},    {"softmax", 4},
    {"pv", 8},      {"prefetch", 16}, {"queries", kSkipQueries}};

uint32_t matrix_phases(const std::string& names) {
  uint32_t bits = 0;
  std::string_view rest = names;
  while (!rest.empty()) {
    std::string_view name = rest.substr(0, rest.find(','));
    auto it = std::find_if(std::begin(kPhases), std::end(kPhases),
                           [&](const auto& phase) { return phase.first == name; });
    if (it == std::end(kPhases)) {
      std::string known;
      for (const auto& phase : kPhases) known += std::string(phase.first) + ", ";
      throw Error("ContextOptions::matrix_skip (FLASHVK_MATRIX_SKIP): '" + std::string(name) +
                  "' is not a phase of the matrix kernel (" + known + "separated by commas)");
    }
    bits |= it->second;
    rest.remove_prefix(std::min(rest.size(), name.size() + 1));
  }
  return bits;
}

}  // namespace

std::array<uint32_t, spec_id::count> ContextImpl::driver_constants(const Spec& spec) const {
  std::array<uint32_t, spec_id::count> values = spec.constants();
  if (spec.layout != TileLayout::cooperative_matrix) return values;
  values[spec_id::cm_skip] = matrix_skip;
  // queries keeps Q in shared memory (Q_SHARED), an array the tiling counts only where it keeps
  // it there itself: the block's rows of Q in fp16, each padded by 16 bytes (flash_cm.comp's
  // q_sh), over what the tiling counts at most.
  if (matrix_skip & kSkipQueries) values[spec_id::q_shared] = 1;
  if ((matrix_skip & kSkipQueries) && !spec.q_shared) {
    uint32_t bytes = matrix_kernel_bytes(spec) + spec.block() * (spec.d + 8) * 2;
    if (bytes > info.max_shared_memory)
      throw Error(
          "ContextOptions::matrix_skip (FLASHVK_MATRIX_SKIP) queries: the matrix kernel "
          "needs up to " +
          std::to_string(bytes) + " bytes of shared memory at d=" + std::to_string(spec.d) +
          " with " + std::to_string(spec.bc) + " keys a tile; this device allows " +
          std::to_string(info.max_shared_memory));
  }
  return values;
}

std::vector<uint32_t> ContextImpl::driver_spirv(const ShaderBlob& blob) const {
  std::vector<uint32_t> words(blob.words, blob.words + blob.bytes / 4);
  if (!spirv_as_built()) coherence_at_barriers(words);
  return words;
}

VkPipeline ContextImpl::pipeline(const ShaderBlob& blob, const Spec& spec) {
  std::lock_guard lock(pipeline_mutex);
  return pipeline(blob, spec, lock);
}

VkPipeline ContextImpl::pipeline(const ShaderBlob& blob, const Spec& spec,
                                 const std::lock_guard<std::mutex>&) {
  auto key = std::make_pair(std::string(blob.name), spec);
  if (auto it = pipelines.find(key); it != pipelines.end()) return it->second;
  const uint32_t required = spec.required_subgroup(info.subgroup_size);
  if (required && spec.workgroup % required != 0)
    throw Error(std::string("internal: ") + blob.name + " would require subgroups of " +
                std::to_string(required) + " lanes in a workgroup of " +
                std::to_string(spec.workgroup));
  VkShaderModule& module = modules[key.first];
  if (module == VK_NULL_HANDLE) {
    std::vector<uint32_t> words = driver_spirv(blob);
    if (clear_unroll) clear_unroll_hints(words);  // testing::clear_unroll_hints_on_llvmpipe
    VkShaderModuleCreateInfo module_info{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    module_info.codeSize = words.size() * 4;
    module_info.pCode = words.data();
    check(vkCreateShaderModule(device, &module_info, nullptr, &module), "vkCreateShaderModule");
    objects_created();
  }
  std::array<uint32_t, spec_id::count> values = driver_constants(spec);
  std::array<VkSpecializationMapEntry, spec_id::count> entries{};
  for (uint32_t i = 0; i < values.size(); ++i) entries[i] = {i, i * 4u, 4u};
  VkSpecializationInfo spec_info{static_cast<uint32_t>(values.size()), entries.data(),
                                 sizeof(values), values.data()};
  VkComputePipelineCreateInfo create{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  create.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  create.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  create.stage.module = module;
  create.stage.pName = "main";
  create.stage.pSpecializationInfo = &spec_info;
  VkPipelineShaderStageRequiredSubgroupSizeCreateInfoEXT subgroup{
      VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO_EXT};
  if (required) {  // the kernel's subgroups, all lanes active (vk.hpp, Spec)
    subgroup.requiredSubgroupSize = required;
    create.stage.pNext = &subgroup;
    create.stage.flags = VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT_EXT;
  }
  create.layout = pipeline_layout;
  if (capture)
    create.flags = VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR |
                   VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
  VkPipeline pipe = VK_NULL_HANDLE;
  check(vkCreateComputePipelines(device, cache, 1, &create, nullptr, &pipe),
        "vkCreateComputePipelines");
  objects_created();
  pipelines[key] = pipe;
  return pipe;
}

namespace {

// A module per build and functions, keyed by their whole text (no digest to collide); the name
// goes through a C string, so its separator is not '\0'.
std::string user_module(const std::string& build, const Modifiers& mods) {
  const char sep = '\x1f';
  return build + "+user" + sep + mods.score_mod_name + sep + mods.score_mod + sep +
         mods.mask_mod_name + sep + mods.mask_mod;
}

}  // namespace

std::vector<uint32_t> ContextImpl::user_spirv(const std::string& build, const Modifiers& mods) {
  std::lock_guard lock(pipeline_mutex);
  auto it = user_words.find(user_module(build, mods));
  return it == user_words.end() ? std::vector<uint32_t>() : it->second;
}

VkPipeline ContextImpl::user_pipeline(const std::string& build, const Modifiers& mods,
                                      const Spec& spec) {
  std::string name = user_module(build, mods);
  std::shared_ptr<KernelCompiler> with;
  {
    std::lock_guard lock(pipeline_mutex);
    if (modules.count(name)) return pipeline(ShaderBlob{name.c_str(), nullptr, 0}, spec, lock);
    with = compiler;
  }
  if (!with)
    throw Error(
        "user-written attention (score_mod, mask_mod) is compiled at run time by "
        "flashvk::flex: link flashvk::flex and call flashvk::flex::enable(ctx) first");
  std::vector<uint32_t> words = with->compile(build, mods);
  std::lock_guard lock(pipeline_mutex);
  ShaderBlob blob{name.c_str(), words.data(), words.size() * 4};
  VkPipeline made = pipeline(blob, spec, lock);
  user_words[name] = driver_spirv(blob);  // for the pipeline report
  return made;
}

void ContextImpl::check_runs(const char* what) const {
  if (compile_only)
    throw Error(std::string(what) +
                " on a compile-only context (ContextOptions::compile_only), "
                "which builds pipelines and runs nothing; create a Context without it");
}

void ContextImpl::submit_and_wait(const std::function<void(VkCommandBuffer)>& fill) {
  check_runs("work submitted");
  std::lock_guard lock(submit_mutex);
  VkCommandBufferAllocateInfo alloc{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  alloc.commandPool = pool;
  alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  alloc.commandBufferCount = 1;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  check(vkAllocateCommandBuffers(device, &alloc, &cmd), "vkAllocateCommandBuffers");
  objects_created();
  struct Free {
    ContextImpl* ctx;
    VkCommandBuffer cmd;
    ~Free() {
      vkFreeCommandBuffers(ctx->device, ctx->pool, 1, &cmd);
      objects_destroyed();
    }
  } free_on_exit{this, cmd};
  VkCommandBufferBeginInfo begin{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
  fill(cmd);
  check(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
  VkSubmitInfo submit{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  submit.commandBufferCount = 1;
  submit.pCommandBuffers = &cmd;
  check(vkResetFences(device, 1, &fence), "vkResetFences");
  VkResult result = injected("vkQueueSubmit");
  check(result ? result : vkQueueSubmit(queue, 1, &submit, fence), "vkQueueSubmit");
  result = injected("vkWaitForFences");
  if (result == VK_SUCCESS) result = vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX);
  if (result != VK_SUCCESS) vkDeviceWaitIdle(device);  // before the command buffer is freed
  check(result, "vkWaitForFences");
}

void compute_barrier(VkCommandBuffer cmd, VkPipelineStageFlags dst_stages,
                     VkAccessFlags dst_access) {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT;
  barrier.dstAccessMask = dst_access;
  vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, dst_stages, 0, 1, &barrier, 0,
                       nullptr, 0, nullptr);
}

// kMatrixShapes, named: "16x16x16 by 32 lanes, 8x16x16 by 16 lanes, ...".
std::string matrix_shapes_text() {
  std::string text;
  for (const MatrixShape& shape : kMatrixShapes)
    text += (text.empty() ? "" : ", ") + matrix_shape_name(shape);
  return text;
}

MatrixShape pick_matrix_shape(const std::vector<VkCooperativeMatrixPropertiesKHR>& listed,
                              const DeviceInfo& info) {
  for (const MatrixShape& shape : kMatrixShapes) {
    bool found =
        std::any_of(listed.begin(), listed.end(), [&](const VkCooperativeMatrixPropertiesKHR& p) {
          return p.MSize == shape.m && p.NSize == shape.n && p.KSize == shape.k &&
                 p.AType == VK_COMPONENT_TYPE_FLOAT16_KHR &&
                 p.BType == VK_COMPONENT_TYPE_FLOAT16_KHR &&
                 p.CType == VK_COMPONENT_TYPE_FLOAT32_KHR &&
                 p.ResultType == VK_COMPONENT_TYPE_FLOAT32_KHR && !p.saturatingAccumulation &&
                 p.scope == VK_SCOPE_SUBGROUP_KHR;
        });
    if (found && can_require_subgroup(info, shape.subgroup)) return shape;
  }
  return {};
}

MatrixApi usable_matrix_api(const DeviceInfo& info, MatrixApi requested, const std::string& who) {
  switch (requested) {
    case MatrixApi::automatic:  // the units, else the stand-in (which runs only where asked for)
      return info.matrix_api != MatrixApi::none ? info.matrix_api
             : info.fp16_storage                ? MatrixApi::emulated
                                                : MatrixApi::none;
    case MatrixApi::none:
      return MatrixApi::none;
    case MatrixApi::khr:
      if (info.matrix_api != MatrixApi::khr)
        throw Error(who + ": matrix_api khr, but " + info.name +
                    " lacks VK_KHR_cooperative_matrix with fp16 products into fp32 in one of the "
                    "kernels' shapes (" + matrix_shapes_text() +
                    ": subgroup sizes VK_EXT_subgroup_size_control can require) in compute "
                    "shaders, shaderFloat16, vulkanMemoryModel and its device scope, or subgroup "
                    "shuffles and votes in compute shaders; "
                    "`flashvk devices` says what it has");
      return MatrixApi::khr;
    case MatrixApi::nv:
      if (!info.nv_cooperative_matrix)
        throw Error(who + ": matrix_api nv, but " + info.name +
                    " lacks VK_NV_cooperative_matrix with 16x16x16 fp16 products into fp32, "
                    "shaderFloat16, vulkanMemoryModel and its device scope, a subgroup of 32, or "
                    "subgroup shuffles and votes in compute shaders");
      return MatrixApi::nv;
    case MatrixApi::nv2:
      if (!info.nv_cooperative_matrix2)
        throw Error(who + ": matrix_api nv2, but " + info.name +
                    " lacks VK_NV_cooperative_matrix2 with cooperativeMatrixReductions, "
                    "cooperativeMatrixConversions and cooperativeMatrixPerElementOperations, "
                    "Vulkan 1.3 with maintenance4, or khr at 16x16x16 by 32; `flashvk devices` "
                    "says what it has");
      return MatrixApi::nv2;
    case MatrixApi::emulated:
    case MatrixApi::emulated_nv2:
      if (!info.fp16_storage)
        throw Error(who + ": matrix_api " + matrix_api_name(requested) +
                    " needs fp16 storage (storageBuffer16BitAccess), which " + info.name +
                    " lacks");
      return requested;
  }
  throw Error(who + ": matrix_api is not one of MatrixApi's values");
}

MatrixShape context_matrix_shape(const DeviceInfo& info, MatrixApi api, MatrixShape emulated,
                                 const std::string& who) {
  if (emulated != MatrixShape{} &&
      std::find(std::begin(kMatrixShapes), std::end(kMatrixShapes), emulated) ==
          std::end(kMatrixShapes))
    throw Error(who + ": emulated_matrix_shape " + matrix_shape_name(emulated) +
                " is not one of the kernels' shapes (" + matrix_shapes_text() + ")");
  if (emulated.m && api != MatrixApi::emulated)
    throw Error(who + ": emulated_matrix_shape is for matrix_api emulated; the context's is " +
                matrix_api_name(api));
  switch (api) {
    case MatrixApi::khr: return info.matrix_shape;
    case MatrixApi::nv:
    case MatrixApi::nv2:
    case MatrixApi::emulated_nv2: return kMatrixShapes[0];
    case MatrixApi::emulated:
      return emulated.m ? emulated : info.matrix_shape.m ? info.matrix_shape : kMatrixShapes[0];
    default: return {};
  }
}

}  // namespace detail

std::string matrix_shape_name(const MatrixShape& shape) {
  if (shape == MatrixShape{}) return "none";
  return std::to_string(shape.m) + "x" + std::to_string(shape.n) + "x" + std::to_string(shape.k) +
         " by " + std::to_string(shape.subgroup) + " lanes";
}

const char* matrix_api_name(MatrixApi api) {
  switch (api) {
    case MatrixApi::automatic: return "auto";
    case MatrixApi::none: return "none";
    case MatrixApi::khr: return "khr";
    case MatrixApi::nv: return "nv";
    case MatrixApi::nv2: return "nv2";
    case MatrixApi::emulated: return "emulated";
    case MatrixApi::emulated_nv2: return "emulated-nv2";
  }
  return "?";
}

bool on_matrix_units(MatrixApi api) {
  return api == MatrixApi::khr || api == MatrixApi::nv || api == MatrixApi::nv2;
}

bool keeps_softmax_in_matrices(MatrixApi api) {
  return api == MatrixApi::nv2 || api == MatrixApi::emulated_nv2;
}

std::vector<DeviceInfo> list_devices() {
  detail::ContextImpl probe;
  probe.instance = detail::make_instance(&probe, false, VK_API_VERSION_1_1);
  probe.owns = true;
  std::vector<DeviceInfo> infos;
  auto devices = detail::physical_devices(probe.instance);
  for (uint32_t i = 0; i < devices.size(); ++i)
    infos.push_back(detail::describe(probe.instance, devices[i], i));
  return infos;
}

uint32_t default_device(const std::vector<DeviceInfo>& infos) {
  for (const auto& info : infos)
    if (info.type == "discrete") return info.index;
  for (const auto& info : infos)
    if (info.type == "integrated") return info.index;
  return 0;
}

Context::Context(std::unique_ptr<detail::ContextImpl> impl) : impl_(std::move(impl)) {}
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;
Context::~Context() = default;

Context Context::create(const ContextOptions& options) {
  auto impl = std::make_unique<detail::ContextImpl>();
  impl->owns = true;
  impl->matrix_skip = detail::matrix_phases(options.matrix_skip);  // before any Vulkan object
  // Vulkan 1.1, or 1.3 for nv2's kernels (SPIR-V 1.6).
  impl->instance = detail::make_instance(
      impl.get(), options.validation,
      options.matrix_api == MatrixApi::nv2 ? VK_API_VERSION_1_3 : VK_API_VERSION_1_1);
  if (options.validation) {
    auto create = reinterpret_cast<PFN_vkCreateDebugUtilsMessengerEXT>(
        vkGetInstanceProcAddr(impl->instance, "vkCreateDebugUtilsMessengerEXT"));
    auto info = detail::messenger_info(impl.get());
    if (create)
      detail::check(create(impl->instance, &info, nullptr, &impl->messenger),
                    "vkCreateDebugUtilsMessengerEXT");
    if (impl->messenger) detail::objects_created();
  }
  auto devices = detail::physical_devices(impl->instance);
  if (devices.empty()) throw Error("no Vulkan device found");
  std::vector<DeviceInfo> infos;
  for (uint32_t i = 0; i < devices.size(); ++i)
    infos.push_back(detail::describe(impl->instance, devices[i], i));
  int index = options.device < 0 ? static_cast<int>(default_device(infos)) : options.device;
  if (index >= static_cast<int>(devices.size()))
    throw Error("device " + std::to_string(index) + " does not exist: " +
                std::to_string(devices.size()) + " Vulkan device(s) found (indices 0.." +
                std::to_string(devices.size() - 1) + "); see `flashvk devices`");
  impl->physical = devices[static_cast<size_t>(index)];
  impl->info = infos[static_cast<size_t>(index)];
  detail::apply_overrides(impl->info, options.limits);
  impl->loop_limited = impl->info.name.rfind("llvmpipe", 0) == 0;
  impl->clear_unroll = impl->loop_limited && detail::unroll_hints_cleared();
  if (VK_API_VERSION_MINOR(impl->info.api_version) < 1 &&
      VK_API_VERSION_MAJOR(impl->info.api_version) == 1)
    throw Error("device " + impl->info.name + " supports only Vulkan 1.0; flashvk needs 1.1");
  if (uint32_t n = options.subgroup_size) {
    const DeviceInfo& d = impl->info;
    if (!d.subgroup_size_control)
      throw Error("ContextOptions::subgroup_size " + std::to_string(n) + ": " + d.name +
                  " cannot require a subgroup size (it lacks VK_EXT_subgroup_size_control with "
                  "subgroupSizeControl and computeFullSubgroups for compute); its subgroups "
                  "have " + std::to_string(d.subgroup_size) + " lanes");
    if (n < d.min_subgroup_size || n > d.max_subgroup_size || (n & (n - 1)) != 0)
      throw Error("ContextOptions::subgroup_size " + std::to_string(n) + ": " + d.name +
                  " allows subgroups of " + std::to_string(d.min_subgroup_size) + " to " +
                  std::to_string(d.max_subgroup_size) + " lanes (powers of two)");
    impl->info.subgroup_size = n;
  }
  impl->compile_only = options.compile_only;
  impl->matrix_api = detail::usable_matrix_api(impl->info, options.matrix_api, "ContextOptions");
  impl->info.matrix_shape = detail::context_matrix_shape(
      impl->info, impl->matrix_api, options.emulated_matrix_shape, "ContextOptions");
  detail::make_device(*impl);
  impl->cache_path = options.pipeline_cache_path;
  impl->init_shared_objects();
  return Context(std::move(impl));
}

Context Context::adopt(const ExternalDevice& external) {
  if (!external.instance || !external.physical_device || !external.device || !external.queue)
    throw Error("Context::adopt: instance, physical_device, device and queue must all be set");
  auto impl = std::make_unique<detail::ContextImpl>();
  impl->owns = false;
  impl->instance = external.instance;
  impl->physical = external.physical_device;
  impl->device = external.device;
  impl->queue = external.queue;
  impl->family = external.queue_family;
  impl->info = detail::describe(external.instance, external.physical_device, 0);
  // flashvk needs Vulkan 1.1 (subgroup and maintenance3 properties, 16-bit storage, SPIR-V 1.3).
  // An instance created with apiVersion 1.0 answers the 1.1 property queries with zeros, which
  // would fail later and elsewhere; say so here.
  if (VK_API_VERSION_MAJOR(impl->info.api_version) == 1 &&
      VK_API_VERSION_MINOR(impl->info.api_version) == 0)
    throw Error("Context::adopt: " + impl->info.name +
                " supports only Vulkan 1.0; flashvk needs Vulkan 1.1 or later");
  if (impl->info.max_allocation == 0 || impl->info.subgroup_size == 0)
    throw Error(
        "Context::adopt: the device's Vulkan 1.1 properties came back empty; create the "
        "VkInstance with VkApplicationInfo::apiVersion VK_API_VERSION_1_1 or later (flashvk "
        "needs Vulkan 1.1)");
  impl->loop_limited = impl->info.name.rfind("llvmpipe", 0) == 0;
  impl->clear_unroll = impl->loop_limited && detail::unroll_hints_cleared();
  // What the application says it enabled must be there to enable: a claim the device cannot
  // back would fail later, in a kernel, with the validation layers' words at best.
  if (external.fp16_storage_enabled && !impl->info.fp16_storage)
    throw Error("Context::adopt: fp16_storage_enabled is set, but " + impl->info.name +
                " does not support storageBuffer16BitAccess (VkPhysicalDevice16BitStorage"
                "Features); leave it false and use DType::f32");
  if ((external.matrix_api == MatrixApi::emulated ||
       external.matrix_api == MatrixApi::emulated_nv2) &&
      !external.fp16_storage_enabled)
    throw Error(std::string("Context::adopt: matrix_api ") + matrix_api_name(external.matrix_api) +
                " needs fp16_storage_enabled");
  impl->matrix_api = external.matrix_api == MatrixApi::automatic
                         ? MatrixApi::none
                         : detail::usable_matrix_api(impl->info, external.matrix_api,
                                                     "Context::adopt");
  impl->info.matrix_shape =
      detail::context_matrix_shape(impl->info, impl->matrix_api, {}, "Context::adopt");
  if (external.fp16_arithmetic_enabled && !impl->info.fp16_arithmetic)
    throw Error("Context::adopt: fp16_arithmetic_enabled is set, but " + impl->info.name +
                " does not support shaderFloat16 (VkPhysicalDeviceShaderFloat16Int8Features); "
                "leave it false");
  if (external.subgroup_size_control_enabled && !impl->info.subgroup_size_control)
    throw Error("Context::adopt: subgroup_size_control_enabled is set, but " + impl->info.name +
                " lacks VK_EXT_subgroup_size_control with subgroupSizeControl and "
                "computeFullSubgroups for compute shaders; leave it false");
  if (on_matrix_units(impl->matrix_api) && !external.subgroup_size_control_enabled)
    throw Error(std::string("Context::adopt: matrix_api ") + matrix_api_name(impl->matrix_api) +
                " needs subgroup_size_control_enabled (subgroupSizeControl and "
                "computeFullSubgroups): the matrix kernels require full subgroups of their "
                "shape's size (" + matrix_shape_name(impl->info.matrix_shape) + ")");
  impl->size_control_enabled = external.subgroup_size_control_enabled;
  impl->fp16_enabled = external.fp16_storage_enabled;
  impl->fp16_arithmetic_enabled =
      external.fp16_arithmetic_enabled || on_matrix_units(impl->matrix_api);
  impl->cache_path = external.pipeline_cache_path;
  uint32_t count = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(external.physical_device, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vkGetPhysicalDeviceQueueFamilyProperties(external.physical_device, &count, families.data());
  if (external.queue_family >= count ||
      !(families[external.queue_family].queueFlags & VK_QUEUE_COMPUTE_BIT))
    throw Error("Context::adopt: queue family " + std::to_string(external.queue_family) +
                " does not support compute");
  impl->timestamp_bits = families[external.queue_family].timestampValidBits;
  impl->init_shared_objects();
  return Context(std::move(impl));
}

EngineStats engine_stats() {
  EngineStats stats;
  uint64_t destroyed = detail::g_destroyed;  // first: a destroy follows its create
  stats.objects_created = detail::g_created;
  stats.objects_live = stats.objects_created - destroyed;
  stats.device_bytes = static_cast<uint64_t>(std::max<int64_t>(detail::g_device_bytes, 0));
  return stats;
}

const DeviceInfo& Context::device() const {
  return impl_->info;
}
ExternalDevice Context::handles() const {
  ExternalDevice h;
  h.instance = impl_->instance;
  h.physical_device = impl_->physical;
  h.device = impl_->device;
  h.queue = impl_->queue;
  h.queue_family = impl_->family;
  h.fp16_storage_enabled = impl_->fp16_enabled;
  h.matrix_api = impl_->matrix_api;
  h.fp16_arithmetic_enabled = impl_->fp16_arithmetic_enabled;
  h.subgroup_size_control_enabled = impl_->size_control_enabled;
  h.pipeline_cache_path = impl_->cache_path;
  return h;
}

bool Context::owns_device() const {
  return impl_->owns;
}

std::vector<std::string> Context::take_validation_messages() {
  std::lock_guard lock(impl_->message_mutex);
  return std::exchange(impl_->messages, {});
}

void Context::set_kernel_compiler(std::shared_ptr<KernelCompiler> compiler) {
  std::lock_guard lock(impl_->pipeline_mutex);
  impl_->compiler = std::move(compiler);
}

}  // namespace flashvk
