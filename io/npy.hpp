#pragma once
// NumPy .npy files (format 1.0 and 2.0): little-endian float32 or float16, C order.
// Every field of the header is checked against the file before anything is allocated.
#include <string>

#include "flashvk/tensor.hpp"

namespace flashvk::npy {

/// Reads `path` as float32 (float16 is widened). `what` names the tensor in error messages.
/// Throws flashvk::Error ("Q file 'q.npy': ...") on anything unexpected. With `mask`, boolean
/// arrays are read too, as an additive mask: true 0 (attend), false -inf (hidden).
HostTensor read(const std::string& path, const std::string& what, bool mask = false);

/// Parses an in-memory .npy image (what read() does after loading the file).
HostTensor parse(const std::string& bytes, const std::string& what, bool mask = false);

/// Writes float32 .npy to a temporary name in the same folder, then renames it over `path`,
/// so a failure never leaves a partial file behind.
void write(const std::string& path, const HostTensor& tensor);

}  // namespace flashvk::npy
