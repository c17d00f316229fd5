#pragma once
// The SPIR-V embedded at build time: a table per library (cmake/Shaders.cmake writes them from
// shaders/builds.def).
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

const std::vector<ShaderBlob>& shader_blobs();        ///< the engine's (flashvk)
const std::vector<ShaderBlob>& trace_shader_blobs();  ///< the TRACE builds (flashvk_trace)
const std::vector<ShaderBlob>& peak_shader_blobs();   ///< the calibrations (flashvk_peak)
/// The build `name` of `blobs`; throws Error ("internal: ...") if it is not there.
const ShaderBlob& find_build(const std::vector<ShaderBlob>& blobs, const std::string& name);

}  // namespace flashvk::detail
