// Failures injected into the engine's Vulkan calls (testing.hpp), compiled into the engine of
// test builds only (FLASHVK_FAULT_INJECTION): vk.hpp's injected() is a constant VK_SUCCESS
// elsewhere.
#include "testing.hpp"

#include <atomic>
#include <mutex>
#include <string>

#include "vk.hpp"

namespace flashvk {

namespace {
struct Fault {
  std::mutex mutex;
  std::string call;
  VkResult result = VK_SUCCESS;
  int skip = 0;
};
Fault& fault() {
  static Fault f;
  return f;
}
}  // namespace

namespace detail {
std::atomic<bool>& unroll_hints_cleared() {
  static std::atomic<bool> clear{false};
  return clear;
}

VkResult injected(const char* call) {
  Fault& f = fault();
  std::lock_guard lock(f.mutex);
  if (f.call.empty() || f.call != call) return VK_SUCCESS;
  if (f.skip-- > 0) return VK_SUCCESS;
  VkResult r = f.result;
  f.call.clear();
  return r;
}
}  // namespace detail

namespace testing {
void inject_failure(const std::string& call, VkResult result, int skip) {
  Fault& f = fault();
  std::lock_guard lock(f.mutex);
  f.call = call;
  f.result = result;
  f.skip = skip;
}
void clear_failures() {
  inject_failure("", VK_SUCCESS, 0);
}
void clear_unroll_hints_on_llvmpipe(bool clear) {
  detail::unroll_hints_cleared() = clear;
}
}  // namespace testing

}  // namespace flashvk
