// The interactive viewer: GLFW window, swapchain (ImGui's Vulkan helpers), frame loop.
#define GLFW_INCLUDE_VULKAN
#include "window.hpp"

#include <GLFW/glfw3.h>
#include <imgui.h>
#include <imgui_impl_glfw.h>
#include <imgui_impl_vulkan.h>

#include <chrono>
#include <cstdio>

#include "render.hpp"

namespace flashvk::viewer {
namespace {

void check(VkResult r, const char* call) {
  if (r != VK_SUCCESS && r != VK_SUBOPTIMAL_KHR) throw VulkanError(r, call);
}

struct Swapchain {
  ImGui_ImplVulkanH_Window wd;
  bool rebuild = false;
};

void setup_swapchain(Device& dev, Swapchain& sc, VkSurfaceKHR surface, int w, int h) {
  sc.wd.Surface = surface;
  VkBool32 supported = VK_FALSE;
  vkGetPhysicalDeviceSurfaceSupportKHR(dev.physical, dev.family, surface, &supported);
  if (!supported) throw Error("the device's queue cannot present to this window");
  const VkFormat formats[] = {VK_FORMAT_B8G8R8A8_UNORM, VK_FORMAT_R8G8B8A8_UNORM};
  sc.wd.SurfaceFormat = ImGui_ImplVulkanH_SelectSurfaceFormat(dev.physical, surface, formats, 2,
                                                              VK_COLORSPACE_SRGB_NONLINEAR_KHR);
  VkPresentModeKHR fifo = VK_PRESENT_MODE_FIFO_KHR;
  sc.wd.PresentMode = ImGui_ImplVulkanH_SelectPresentMode(dev.physical, surface, &fifo, 1);
  ImGui_ImplVulkanH_CreateOrResizeWindow(dev.instance, dev.physical, dev.device, &sc.wd, dev.family,
                                         nullptr, w, h, 2);
}

void render_frame(Device& dev, Swapchain& sc) {
  ImGui_ImplVulkanH_Window* wd = &sc.wd;
  VkSemaphore acquired = wd->FrameSemaphores[wd->SemaphoreIndex].ImageAcquiredSemaphore;
  VkSemaphore done = wd->FrameSemaphores[wd->SemaphoreIndex].RenderCompleteSemaphore;
  VkResult r = vkAcquireNextImageKHR(dev.device, wd->Swapchain, UINT64_MAX, acquired,
                                     VK_NULL_HANDLE, &wd->FrameIndex);
  if (r == VK_ERROR_OUT_OF_DATE_KHR || r == VK_SUBOPTIMAL_KHR) {
    sc.rebuild = true;
    return;
  }
  check(r, "vkAcquireNextImageKHR");
  ImGui_ImplVulkanH_Frame* fd = &wd->Frames[wd->FrameIndex];
  check(vkWaitForFences(dev.device, 1, &fd->Fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(vkResetFences(dev.device, 1, &fd->Fence), "vkResetFences");
  check(vkResetCommandPool(dev.device, fd->CommandPool, 0), "vkResetCommandPool");
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  vkBeginCommandBuffer(fd->CommandBuffer, &bi);
  VkClearValue clear{};
  clear.color = {{0.07f, 0.07f, 0.09f, 1.0f}};
  VkRenderPassBeginInfo rb{VK_STRUCTURE_TYPE_RENDER_PASS_BEGIN_INFO};
  rb.renderPass = wd->RenderPass;
  rb.framebuffer = fd->Framebuffer;
  rb.renderArea.extent = {uint32_t(wd->Width), uint32_t(wd->Height)};
  rb.clearValueCount = 1;
  rb.pClearValues = &clear;
  vkCmdBeginRenderPass(fd->CommandBuffer, &rb, VK_SUBPASS_CONTENTS_INLINE);
  ImGui_ImplVulkan_RenderDrawData(ImGui::GetDrawData(), fd->CommandBuffer);
  vkCmdEndRenderPass(fd->CommandBuffer);
  vkEndCommandBuffer(fd->CommandBuffer);
  VkPipelineStageFlags wait = VK_PIPELINE_STAGE_COLOR_ATTACHMENT_OUTPUT_BIT;
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.waitSemaphoreCount = 1;
  si.pWaitSemaphores = &acquired;
  si.pWaitDstStageMask = &wait;
  si.commandBufferCount = 1;
  si.pCommandBuffers = &fd->CommandBuffer;
  si.signalSemaphoreCount = 1;
  si.pSignalSemaphores = &done;
  check(vkQueueSubmit(dev.queue, 1, &si, fd->Fence), "vkQueueSubmit");
  VkPresentInfoKHR pi{VK_STRUCTURE_TYPE_PRESENT_INFO_KHR};
  pi.waitSemaphoreCount = 1;
  pi.pWaitSemaphores = &done;
  pi.swapchainCount = 1;
  pi.pSwapchains = &wd->Swapchain;
  pi.pImageIndices = &wd->FrameIndex;
  r = vkQueuePresentKHR(dev.queue, &pi);
  if (r == VK_ERROR_OUT_OF_DATE_KHR || r == VK_SUBOPTIMAL_KHR)
    sc.rebuild = true;
  else
    check(r, "vkQueuePresentKHR");
  wd->SemaphoreIndex = (wd->SemaphoreIndex + 1) % wd->ImageCount;
}

// Saves the whole window or one panel through an offscreen pass of the swapchain's format.
void export_png(Device& dev, Swapchain& sc, UiState& ui) {
  ui.png_requested = false;
  try {
    Offscreen target(dev, uint32_t(sc.wd.Width), uint32_t(sc.wd.Height),
                     sc.wd.SurfaceFormat.format);
    std::vector<uint8_t> pixels = target.render();
    float rect[4];
    bool crop = ui.png_panel > 0 && panel_rect(ui.png_panel, rect);
    write_png(ui.png_path, pixels, target.width(), target.height(), crop ? rect : nullptr);
    ui.status = std::string("wrote ") + ui.png_path;
  } catch (const Error& e) {
    ui.status = e.what();
  }
}

}  // namespace

bool display_available() {
  if (!glfwInit()) return false;
  bool ok = glfwVulkanSupported();
  glfwTerminate();
  return ok;
}

int run_window(int device, Inputs inputs, UiState ui, const std::vector<Variant>& variants,
               int step, const std::string& screenshot) {
  if (!glfwInit())
    throw Error("GLFW could not start (no display?); use --headless --screenshot FILE");
  glfwWindowHint(GLFW_CLIENT_API, GLFW_NO_API);
  GLFWwindow* window = glfwCreateWindow(1600, 1000, "flashvk viewer", nullptr, nullptr);
  if (!window) throw Error("could not open a window; use --headless --screenshot FILE");
  uint32_t ext_count = 0;
  const char** ext = glfwGetRequiredInstanceExtensions(&ext_count);
  Device dev(std::vector<const char*>(ext, ext + ext_count), true, device);
  Context ctx = Context::adopt(dev.external());  // the engine runs on the viewer's device
  Model model(ctx);
  model.selected = variants;
  // The first trace runs on the worker as every later one does: the window draws meanwhile
  // (draw_opening), which on a machine that has not compiled the kernels yet is a while.
  Request first;
  first.inputs = std::move(inputs);
  first.selected = variants;
  first.fresh = true;
  model.submit(std::move(first));
  bool opened = false;
  std::string failed;  // the first trace's error: nothing to show, so the viewer ends with it
  VkSurfaceKHR surface;
  check(glfwCreateWindowSurface(dev.instance, window, nullptr, &surface),
        "glfwCreateWindowSurface");
  Swapchain sc;
  int w, h;
  glfwGetFramebufferSize(window, &w, &h);
  setup_swapchain(dev, sc, surface, w, h);
  ImGui::CreateContext();
  ImGui::GetIO().IniFilename = nullptr;
  ImGui::StyleColorsDark();
  ImGui_ImplGlfw_InitForVulkan(window, true);
  init_imgui_vulkan(dev, sc.wd.RenderPass, sc.wd.ImageCount);
  auto last = std::chrono::steady_clock::now();
  int frames = 0, settle = 3;
  if (!screenshot.empty()) std::snprintf(ui.png_path, sizeof ui.png_path, "%s", screenshot.c_str());
  while (!glfwWindowShouldClose(window)) {
    if (!opened) {
      try {
        if (model.poll()) opened = true, open_at_step(model, step);
      } catch (const std::exception& e) {
        failed = e.what();
        break;
      }
    }
    if (!screenshot.empty() && opened && ++frames == 4) ui.png_requested = true;  // settled
    if (!screenshot.empty() && frames == 6) break;
    // Idle (nothing plays, nothing is traced): wait for input, so that an idle window costs
    // no CPU; a few frames after each event let ImGui settle (hover, double clicks).
    if (opened && (ui.playing || !screenshot.empty())) {
      glfwPollEvents();
    } else if (model.busy()) {
      glfwWaitEventsTimeout(kBusyFrame);  // the progress line moves; input is still answered
    } else if (settle > 0) {
      --settle;
      glfwPollEvents();
    } else {
      auto waited = std::chrono::steady_clock::now();
      glfwWaitEventsTimeout(1.0);
      bool event = std::chrono::steady_clock::now() - waited < std::chrono::milliseconds(990);
      settle = event ? 3 : 0;
    }
    if (sc.rebuild) {
      glfwGetFramebufferSize(window, &w, &h);
      if (w > 0 && h > 0) {
        ImGui_ImplVulkan_SetMinImageCount(2);
        ImGui_ImplVulkanH_CreateOrResizeWindow(dev.instance, dev.physical, dev.device, &sc.wd,
                                               dev.family, nullptr, w, h, 2);
        sc.wd.FrameIndex = 0;
        sc.rebuild = false;
      }
    }
    auto now = std::chrono::steady_clock::now();
    double dt = std::chrono::duration<double>(now - last).count();
    last = now;
    ImGui_ImplVulkan_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();
    if (opened)
      draw_ui(model, ui, dt);
    else
      draw_opening(model);
    ImGui::Render();
    if (ImGui::GetDrawData()->DisplaySize.x > 0) render_frame(dev, sc);
    if (ui.png_requested) export_png(dev, sc, ui);
  }
  glfwHideWindow(window);
  model.wait();  // the worker's queue is the device's too: vkDeviceWaitIdle needs it idle
  vkDeviceWaitIdle(dev.device);
  ImGui_ImplVulkan_Shutdown();
  ImGui_ImplGlfw_Shutdown();
  ImGui::DestroyContext();
  ImGui_ImplVulkanH_DestroyWindow(dev.instance, dev.device, &sc.wd, nullptr);
  glfwDestroyWindow(window);
  glfwTerminate();
  if (!failed.empty()) throw Error(failed);
  return 0;
}

}  // namespace flashvk::viewer
