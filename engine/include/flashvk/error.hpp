#pragma once
// Every failure the engine reports is a flashvk::Error with a message a user can act on.
#include <stdexcept>
#include <string>

#include <vulkan/vulkan.h>

namespace flashvk {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A Vulkan call failed; the message names the call and the VkResult.
class VulkanError : public Error {
 public:
  VulkanError(VkResult result, const std::string& call);
  VkResult result() const { return result_; }

 private:
  VkResult result_;
};

/// The printable name of a VkResult ("VK_ERROR_DEVICE_LOST").
const char* result_name(VkResult result);

}  // namespace flashvk
