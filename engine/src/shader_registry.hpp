#pragma once
// The SPIR-V embedded at build time (cmake/Shaders.cmake writes the table).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashvk::detail {

struct ShaderBlob {
  const char* name;
  const uint32_t* words;
  size_t bytes;
};

const std::vector<ShaderBlob>& shader_blobs();

}  // namespace flashvk::detail
