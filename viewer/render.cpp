#include "render.hpp"

#include <imgui.h>
#include <imgui_impl_vulkan.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

namespace flashvk::viewer {
namespace {

void check(VkResult r, const char* call) {
  if (r != VK_SUCCESS) throw VulkanError(r, call);
}

uint32_t memory_type(VkPhysicalDevice physical, uint32_t bits, VkMemoryPropertyFlags want) {
  VkPhysicalDeviceMemoryProperties props;
  vkGetPhysicalDeviceMemoryProperties(physical, &props);
  for (uint32_t i = 0; i < props.memoryTypeCount; ++i)
    if ((bits & (1u << i)) && (props.memoryTypes[i].propertyFlags & want) == want) return i;
  throw Error("no suitable memory type for the viewer's image");
}

}  // namespace

Device::Device(const std::vector<const char*>& extensions, bool swapchain, int index) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "flashvk-viewer";
  app.apiVersion = VK_API_VERSION_1_1;
  VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ii.pApplicationInfo = &app;
  ii.enabledExtensionCount = uint32_t(extensions.size());
  ii.ppEnabledExtensionNames = extensions.data();
  check(vkCreateInstance(&ii, nullptr, &instance), "vkCreateInstance");
  uint32_t count = 0;
  vkEnumeratePhysicalDevices(instance, &count, nullptr);
  std::vector<VkPhysicalDevice> devices(count);
  vkEnumeratePhysicalDevices(instance, &count, devices.data());
  if (devices.empty()) throw Error("no Vulkan device found");
  if (index >= int(devices.size()))
    throw Error("device " + std::to_string(index) + " does not exist");
  physical = devices[size_t(std::max(0, index))];
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, nullptr);
  std::vector<VkQueueFamilyProperties> families(count);
  vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, families.data());
  const VkQueueFlags want = VK_QUEUE_GRAPHICS_BIT | VK_QUEUE_COMPUTE_BIT;
  while (family < count && (families[family].queueFlags & want) != want) ++family;
  if (family == count) throw Error("the device has no queue for both graphics and compute");
  // The engine traces on a worker thread while the window draws: it gets a queue of its own, the
  // family's second, or where there is one queue (lavapipe) a second device's.
  const float priorities[2] = {1.0f, 1.0f};
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = family;
  qi.queueCount = std::min(2u, families[family].queueCount);
  qi.pQueuePriorities = priorities;
  // The engine's fp16 storage path needs this feature on the device we lend it.
  VkPhysicalDevice16BitStorageFeatures f16{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
  f16.storageBuffer16BitAccess = VK_TRUE;
  // And its subgroup kernels need to require their subgroup size (ExternalDevice::
  // subgroup_size_control_enabled), where the engine finds the device can (DeviceInfo).
  VkPhysicalDeviceSubgroupSizeControlFeaturesEXT size_control{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
  size_control.subgroupSizeControl = size_control.computeFullSubgroups = VK_TRUE;
  subgroup_size_control = list_devices()[size_t(std::max(0, index))].subgroup_size_control;
  std::vector<const char*> device_extensions;
  if (swapchain) device_extensions.push_back(VK_KHR_SWAPCHAIN_EXTENSION_NAME);
  if (subgroup_size_control) {
    device_extensions.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    f16.pNext = &size_control;
  }
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.pNext = &f16;
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  di.enabledExtensionCount = uint32_t(device_extensions.size());
  di.ppEnabledExtensionNames = device_extensions.data();
  check(vkCreateDevice(physical, &di, nullptr, &device), "vkCreateDevice");
  vkGetDeviceQueue(device, family, 0, &queue);
  engine_device = device;
  if (qi.queueCount == 2) {
    vkGetDeviceQueue(device, family, 1, &engine_queue);
  } else {
    if (swapchain) device_extensions.erase(device_extensions.begin());  // no window there
    di.enabledExtensionCount = uint32_t(device_extensions.size());
    di.ppEnabledExtensionNames = device_extensions.data();
    check(vkCreateDevice(physical, &di, nullptr, &engine_device), "vkCreateDevice (the engine's)");
    vkGetDeviceQueue(engine_device, family, 0, &engine_queue);
  }
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = family;
  check(vkCreateCommandPool(device, &pi, nullptr, &pool), "vkCreateCommandPool");
  VkDescriptorPoolSize size{VK_DESCRIPTOR_TYPE_COMBINED_IMAGE_SAMPLER, 16};
  VkDescriptorPoolCreateInfo dp{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  dp.flags = VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT;
  dp.maxSets = 16;
  dp.poolSizeCount = 1;
  dp.pPoolSizes = &size;
  check(vkCreateDescriptorPool(device, &dp, nullptr, &imgui_pool), "vkCreateDescriptorPool");
}

Device::~Device() {
  if (engine_device && engine_device != device) {
    vkDeviceWaitIdle(engine_device);
    vkDestroyDevice(engine_device, nullptr);
  }
  if (device) {
    vkDeviceWaitIdle(device);
    vkDestroyDescriptorPool(device, imgui_pool, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
    vkDestroyDevice(device, nullptr);
  }
  if (instance) vkDestroyInstance(instance, nullptr);
}

void Device::submit(const std::function<void(VkCommandBuffer)>& fill) const {
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cmd;
  check(vkAllocateCommandBuffers(device, &ai, &cmd), "vkAllocateCommandBuffers");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vkBeginCommandBuffer(cmd, &bi);
  fill(cmd);
  vkEndCommandBuffer(cmd);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  check(vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE), "vkQueueSubmit");
  check(vkQueueWaitIdle(queue), "vkQueueWaitIdle");
  vkFreeCommandBuffers(device, pool, 1, &cmd);
}

Offscreen::Offscreen(const Device& dev, uint32_t width, uint32_t height, VkFormat format)
    : dev_(dev), width_(width), height_(height), format_(format) {
  VkImageCreateInfo ii{VK_STRUCTURE_TYPE_IMAGE_CREATE_INFO};
  ii.imageType = VK_IMAGE_TYPE_2D;
  ii.format = format;
  ii.extent = {width, height, 1};
  ii.mipLevels = 1;
  ii.arrayLayers = 1;
  ii.samples = VK_SAMPLE_COUNT_1_BIT;
  ii.tiling = VK_IMAGE_TILING_OPTIMAL;
  ii.usage = VK_IMAGE_USAGE_COLOR_ATTACHMENT_BIT | VK_IMAGE_USAGE_TRANSFER_SRC_BIT;
  check(vkCreateImage(dev.device, &ii, nullptr, &image_), "vkCreateImage");
  VkMemoryRequirements req;
  vkGetImageMemoryRequirements(dev.device, image_, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex =
      memory_type(dev.physical, req.memoryTypeBits, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  check(vkAllocateMemory(dev.device, &ai, nullptr, &memory_), "vkAllocateMemory");
  vkBindImageMemory(dev.device, image_, memory_, 0);
  VkImageViewCreateInfo vi{VK_STRUCTURE_TYPE_IMAGE_VIEW_CREATE_INFO};
  vi.image = image_;
  vi.viewType = VK_IMAGE_VIEW_TYPE_2D;
  vi.format = format;
  vi.subresourceRange = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 1, 0, 1};
  check(vkCreateImageView(dev.device, &vi, nullptr, &view_), "vkCreateImageView");
  // Same format and sample count as a swapchain pass, so ImGui's pipeline is compatible.
  VkAttachmentDescription color{};
  color.format = format;
  color.samples = VK_SAMPLE_COUNT_1_BIT;
  color.loadOp = VK_ATTACHMENT_LOAD_OP_CLEAR;
  color.storeOp = VK_ATTACHMENT_STORE_OP_STORE;
  color.stencilLoadOp = VK_ATTACHMENT_LOAD_OP_DONT_CARE;
  color.stencilStoreOp = VK_ATTACHMENT_STORE_OP_DONT_CARE;
  color.initialLayout = VK_IMAGE_LAYOUT_UNDEFINED;
  color.finalLayout = VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL;
  VkAttachmentReference ref{0, VK_IMAGE_LAYOUT_COLOR_ATTACHMENT_OPTIMAL};
  VkSubpassDescription sub{};
  sub.pipelineBindPoint = VK_PIPELINE_BIND_POINT_GRAPHICS;
  sub.colorAttachmentCount = 1;
  sub.pColorAttachments = &ref;
  VkSubpassDependency dep{};  // the copy after the pass waits for the colour writes
  dep.srcSubpass = 0;
  dep.dstSubpass = VK_SUBPASS_EXTERNAL;
  dep.srcStageMask = VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT;
  dep.dstStageMask = VK_PIPELINE_STAGE_TRANSFER_BIT;
  dep.srcAccessMask = VK_ACCESS_COLOR_ATTACHMENT_WRITE_BIT;
  dep.dstAccessMask = VK_ACCESS_TRANSFER_READ_BIT;
  VkRenderPassCreateInfo rp{VK_STRUCTURE_TYPE_RENDER_PASS_CREATE_INFO};
  rp.attachmentCount = 1;
  rp.pAttachments = &color;
  rp.subpassCount = 1;
  rp.pSubpasses = &sub;
  rp.dependencyCount = 1;
  rp.pDependencies = &dep;
  check(vkCreateRenderPass(dev.device, &rp, nullptr, &pass_), "vkCreateRenderPass");
  VkFramebufferCreateInfo fb{VK_STRUCTURE_TYPE_FRAMEBUFFER_CREATE_INFO};
  fb.renderPass = pass_;
  fb.attachmentCount = 1;
  fb.pAttachments = &view_;
  fb.width = width;
  fb.height = height;
  fb.layers = 1;
  check(vkCreateFramebuffer(dev.device, &fb, nullptr, &framebuffer_), "vkCreateFramebuffer");
}

Offscreen::~Offscreen() {
  vkDeviceWaitIdle(dev_.device);
  vkDestroyFramebuffer(dev_.device, framebuffer_, nullptr);
  vkDestroyRenderPass(dev_.device, pass_, nullptr);
  vkDestroyImageView(dev_.device, view_, nullptr);
  vkDestroyImage(dev_.device, image_, nullptr);
  vkFreeMemory(dev_.device, memory_, nullptr);
}

std::vector<uint8_t> Offscreen::render() {
  VkDeviceSize bytes = VkDeviceSize(width_) * height_ * 4;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = bytes;
  bi.usage = VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  VkBuffer buffer;
  check(vkCreateBuffer(dev_.device, &bi, nullptr, &buffer), "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(dev_.device, buffer, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
  ai.allocationSize = req.size;
  ai.memoryTypeIndex =
      memory_type(dev_.physical, req.memoryTypeBits,
                  VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT);
  VkDeviceMemory memory;
  check(vkAllocateMemory(dev_.device, &ai, nullptr, &memory), "vkAllocateMemory");
  vkBindBufferMemory(dev_.device, buffer, memory, 0);
  dev_.submit([&](VkCommandBuffer cmd) {
    VkClearValue clear{};
    clear.color = {{0.07f, 0.07f, 0.09f, 1.0f}};
    VkRenderPassBeginInfo rb{VK_STRUCTURE_TYPE_RENDER_PASS_BEGIN_INFO};
    rb.renderPass = pass_;
    rb.framebuffer = framebuffer_;
    rb.renderArea.extent = {width_, height_};
    rb.clearValueCount = 1;
    rb.pClearValues = &clear;
    vkCmdBeginRenderPass(cmd, &rb, VK_SUBPASS_CONTENTS_INLINE);
    ImGui_ImplVulkan_RenderDrawData(ImGui::GetDrawData(), cmd);
    vkCmdEndRenderPass(cmd);
    VkBufferImageCopy region{};
    region.imageSubresource = {VK_IMAGE_ASPECT_COLOR_BIT, 0, 0, 1};
    region.imageExtent = {width_, height_, 1};
    vkCmdCopyImageToBuffer(cmd, image_, VK_IMAGE_LAYOUT_TRANSFER_SRC_OPTIMAL, buffer, 1, &region);
    VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    mb.srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_HOST_READ_BIT;
    vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb,
                         0, nullptr, 0, nullptr);
  });
  std::vector<uint8_t> pixels(bytes);
  void* mapped = nullptr;
  vkMapMemory(dev_.device, memory, 0, bytes, 0, &mapped);
  std::memcpy(pixels.data(), mapped, bytes);
  vkUnmapMemory(dev_.device, memory);
  vkDestroyBuffer(dev_.device, buffer, nullptr);
  vkFreeMemory(dev_.device, memory, nullptr);
  if (format_ == VK_FORMAT_B8G8R8A8_UNORM || format_ == VK_FORMAT_B8G8R8A8_SRGB)
    for (size_t i = 0; i < pixels.size(); i += 4) std::swap(pixels[i], pixels[i + 2]);
  return pixels;
}

void write_png(const std::string& path, const std::vector<uint8_t>& rgba, uint32_t width,
               uint32_t height, const float* rect) {
  uint32_t x = 0, y = 0, w = width, h = height;
  if (rect) {
    x = uint32_t(std::clamp(rect[0], 0.0f, float(width - 1)));
    y = uint32_t(std::clamp(rect[1], 0.0f, float(height - 1)));
    w = std::min(width - x, uint32_t(rect[2]));
    h = std::min(height - y, uint32_t(rect[3]));
  }
  const uint8_t* start = rgba.data() + (size_t(y) * width + x) * 4;
  std::string tmp = path + ".tmp.png";
  if (!stbi_write_png(tmp.c_str(), int(w), int(h), 4, start, int(width * 4)) ||
      std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write PNG '" + path + "'");
  }
}

void init_imgui_vulkan(Device& dev, VkRenderPass pass, uint32_t image_count) {
  ImGui_ImplVulkan_LoadFunctions(
      [](const char* name, void* instance) {
        return vkGetInstanceProcAddr(static_cast<VkInstance>(instance), name);
      },
      dev.instance);
  ImGui_ImplVulkan_InitInfo info{};
  info.Instance = dev.instance;
  info.PhysicalDevice = dev.physical;
  info.Device = dev.device;
  info.QueueFamily = dev.family;
  info.Queue = dev.queue;
  info.DescriptorPool = dev.imgui_pool;
  info.MinImageCount = std::max(2u, image_count);
  info.ImageCount = std::max(2u, image_count);
  info.MSAASamples = VK_SAMPLE_COUNT_1_BIT;
  ImGui_ImplVulkan_Init(&info, pass);
  dev.submit([](VkCommandBuffer cmd) { ImGui_ImplVulkan_CreateFontsTexture(cmd); });
  ImGui_ImplVulkan_DestroyFontUploadObjects();
}

}  // namespace flashvk::viewer
