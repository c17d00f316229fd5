#pragma once
// The viewer's Vulkan objects: one device, created here and lent to the engine through
// Context::adopt, and an offscreen colour target that ImGui draws into for PNGs.
#include <functional>
#include <string>
#include <vector>

#include <vulkan/vulkan.h>

#include "flashvk.hpp"

namespace flashvk::viewer {

struct Device {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;  ///< the window's and the PNGs'
  uint32_t family = 0;
  /// What the engine gets (external()): a second queue of `device`, or where the family has one
  /// queue a second device, so that traces on a worker thread never share the window's queue.
  VkDevice engine_device = VK_NULL_HANDLE;
  VkQueue engine_queue = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkDescriptorPool imgui_pool = VK_NULL_HANDLE;

  /// `instance_extensions` are what the window system needs (none when headless).
  Device(const std::vector<const char*>& instance_extensions, bool swapchain, int index);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  bool subgroup_size_control = false;  // enabled on both devices (the engine's subgroup kernels)

  ExternalDevice external() const {
    ExternalDevice e{instance, physical, engine_device, engine_queue, family, true};
    e.subgroup_size_control_enabled = subgroup_size_control;
    return e;
  }
  /// Records with `fill`, submits on the shared queue and waits.
  void submit(const std::function<void(VkCommandBuffer)>& fill) const;
};

/// A colour image with a render pass and framebuffer, read back as RGBA8.
class Offscreen {
 public:
  Offscreen(const Device& dev, uint32_t width, uint32_t height, VkFormat format);
  ~Offscreen();
  Offscreen(const Offscreen&) = delete;
  Offscreen& operator=(const Offscreen&) = delete;

  VkRenderPass render_pass() const { return pass_; }
  /// Draws the current ImGui draw data and returns the pixels, RGBA, row-major.
  std::vector<uint8_t> render();
  uint32_t width() const { return width_; }
  uint32_t height() const { return height_; }

 private:
  const Device& dev_;
  uint32_t width_, height_;
  VkFormat format_;
  VkImage image_ = VK_NULL_HANDLE;
  VkDeviceMemory memory_ = VK_NULL_HANDLE;
  VkImageView view_ = VK_NULL_HANDLE;
  VkRenderPass pass_ = VK_NULL_HANDLE;
  VkFramebuffer framebuffer_ = VK_NULL_HANDLE;
};

/// Writes RGBA pixels (optionally a sub-rectangle) as PNG; throws Error on failure.
void write_png(const std::string& path, const std::vector<uint8_t>& rgba, uint32_t width,
               uint32_t height, const float* rect = nullptr);

/// ImGui's Vulkan backend on `dev`, drawing with `pass`; uploads the font.
void init_imgui_vulkan(Device& dev, VkRenderPass pass, uint32_t image_count);

}  // namespace flashvk::viewer
