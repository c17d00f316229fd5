// libFuzzer target: the .npy parser on arbitrary bytes. Anything but a clean parse or a
// flashvk::Error (a crash, a leak, a sanitizer report, another exception) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "flashvk/error.hpp"
#include "npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    flashvk::HostTensor t =
        flashvk::npy::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    if (static_cast<int64_t>(t.data.size()) != t.numel()) __builtin_trap();
  } catch (const flashvk::Error&) {
  }
  return 0;
}
