// An application that already has a Vulkan device hands it to the engine (Context::adopt), runs
// attention both ways (engine-submitted and recorded into its own command buffer), and keeps
// using its handles after the engine is gone.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

struct AppVulkan {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;
  VkCommandPool pool = VK_NULL_HANDLE;

  explicit AppVulkan(uint32_t api_version = VK_API_VERSION_1_1) {
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = api_version;
    VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ii.pApplicationInfo = &app;
    EXPECT_EQ(vkCreateInstance(&ii, nullptr, &instance), VK_SUCCESS);
    uint32_t n = 1;
    vkEnumeratePhysicalDevices(instance, &n, &physical);
    uint32_t count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, nullptr);
    std::vector<VkQueueFamilyProperties> families(count);
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, families.data());
    while (!(families[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkPhysicalDevice16BitStorageFeatures f16{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    f16.storageBuffer16BitAccess = VK_TRUE;
    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    di.pNext = &f16;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    EXPECT_EQ(vkCreateDevice(physical, &di, nullptr, &device), VK_SUCCESS);
    vkGetDeviceQueue(device, family, 0, &queue);
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = family;
    EXPECT_EQ(vkCreateCommandPool(device, &pi, nullptr, &pool), VK_SUCCESS);
  }
  ~AppVulkan() {
    vkDestroyCommandPool(device, pool, nullptr);
    vkDestroyDevice(device, nullptr);
    vkDestroyInstance(instance, nullptr);
  }
  ExternalDevice external() const { return {instance, physical, device, queue, family, true}; }

  // The application's own frame: allocate, let `fill` record, submit, wait.
  void submit(const std::function<void(VkCommandBuffer)>& fill) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cmd = VK_NULL_HANDLE;
    ASSERT_EQ(vkAllocateCommandBuffers(device, &ai, &cmd), VK_SUCCESS);
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    vkBeginCommandBuffer(cmd, &bi);
    fill(cmd);
    vkEndCommandBuffer(cmd);
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    ASSERT_EQ(vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE), VK_SUCCESS);
    ASSERT_EQ(vkQueueWaitIdle(queue), VK_SUCCESS);
    vkFreeCommandBuffers(device, pool, 1, &cmd);
  }
};

TEST(Embedding, AdoptedDeviceRunsAttentionAndSurvivesTheEngine) {
  AppVulkan app;
  HostTensor q = random_tensor({1, 2, 10, 16}, 1), k = random_tensor({1, 2, 50, 16}, 2),
             v = random_tensor({1, 2, 50, 16}, 3);
  AttentionParams params;
  params.causal = true;
  reference::Result ref = reference::direct(q, k, v, params);
  {
    Context ctx = Context::adopt(app.external());
    EXPECT_FALSE(ctx.owns_device());
    HostAttentionResult r = attention(ctx, q, k, v, params, DType::f16);
    EXPECT_LE(max_error(r.out.data, ref.out), tolerance(q, k, v, params, std::ldexp(1.0, -11)));

    // Recorded into the application's command buffer, submitted by the application.
    Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k, DType::f32),
           tv = Tensor::upload(ctx, v, DType::f32);
    AttentionRecording rec(ctx, tq, tk, tv, params);
    app.submit([&](VkCommandBuffer cmd) { rec.record(cmd); });
    EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(q, k, v, params));
  }
  // The engine is gone; the application's device and queue still work.
  EXPECT_EQ(vkDeviceWaitIdle(app.device), VK_SUCCESS);
  bool ran = false;
  app.submit([&](VkCommandBuffer) { ran = true; });
  EXPECT_TRUE(ran);
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = 64;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buffer = VK_NULL_HANDLE;
  EXPECT_EQ(vkCreateBuffer(app.device, &bi, nullptr, &buffer), VK_SUCCESS);
  vkDestroyBuffer(app.device, buffer, nullptr);
}

TEST(Embedding, AdoptRefusesMissingHandles) {
  EXPECT_THROW(Context::adopt(ExternalDevice{}), Error);
}

// An application whose instance asked for Vulkan 1.0 is told so at adopt(), by name, instead of
// failing at its first buffer ("exceeds maxMemoryAllocationSize (0 bytes)").
TEST(Embedding, AdoptRefusesAVulkan10InstanceByName) {
  AppVulkan app(VK_API_VERSION_1_0);
  try {
    Context ctx = Context::adopt(app.external());
    ADD_FAILURE() << "adopt() took an instance created for Vulkan 1.0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apiVersion VK_API_VERSION_1_1"), std::string::npos)
        << e.what();
  }
}

TEST(Devices, ListsAtLeastOneDeviceWithTheGuaranteedLimits) {
  std::vector<DeviceInfo> devices = list_devices();
  ASSERT_FALSE(devices.empty());
  for (const DeviceInfo& d : devices) {
    EXPECT_GE(d.max_shared_memory, 16384u);
    EXPECT_GE(d.max_workgroup_invocations, 128u);
    EXPECT_FALSE(d.name.empty());
  }
  EXPECT_THROW(Context::create({int(devices.size()), false}), Error);
}

}  // namespace
}  // namespace flashvk::test
