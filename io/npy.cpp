#include "npy.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "flashvk/error.hpp"

namespace flashvk::npy {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr int64_t kMaxElements = int64_t(1) << 40;

[[noreturn]] void fail(const std::string& what, const std::string& message) {
  throw Error(what + ": " + message);
}

// The value of `key` in the header dict, as raw text up to the next top-level comma or brace.
std::string dict_value(const std::string& header, const std::string& key, const std::string& what) {
  size_t at = header.find("'" + key + "'");
  if (at == std::string::npos) fail(what, "header has no '" + key + "' entry");
  size_t colon = header.find(':', at);
  if (colon == std::string::npos) fail(what, "malformed header near '" + key + "'");
  size_t start = colon + 1;
  int depth = 0;
  size_t end = start;
  for (; end < header.size(); ++end) {
    char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  if (depth != 0) fail(what, "malformed header near '" + key + "'");
  std::string value = header.substr(start, end - start + (header[end] == ')' ? 1 : 0));
  size_t a = value.find_first_not_of(" \t"), b = value.find_last_not_of(" \t");
  return a == std::string::npos ? "" : value.substr(a, b - a + 1);
}

std::vector<int64_t> parse_shape(std::string text, const std::string& what) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')')
    fail(what, "header shape '" + text + "' is not a tuple");
  text = text.substr(1, text.size() - 2);
  std::vector<int64_t> shape;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t a = item.find_first_not_of(" \t"), b = item.find_last_not_of(" \t");
    if (a == std::string::npos) continue;  // "(3,)" has an empty last item
    item = item.substr(a, b - a + 1);
    int64_t value = 0;
    for (char c : item) {
      if (c < '0' || c > '9') fail(what, "header shape has a non-integer entry '" + item + "'");
      if (value > kMaxElements) fail(what, "header shape entry " + item + " is too large");
      value = value * 10 + (c - '0');
    }
    shape.push_back(value);
  }
  return shape;
}

}  // namespace

HostTensor parse(const std::string& bytes, const std::string& what, bool mask) {
  if (bytes.empty()) fail(what, "file is empty");
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0)
    fail(what, "not a .npy file (no \\x93NUMPY magic)");
  int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = size_t(uint8_t(bytes[8])) | size_t(uint8_t(bytes[9])) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail(what, "file is truncated inside the header");
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(bytes[8 + size_t(i)])) << (8 * i);
    header_start = 12;
  } else {
    fail(what,
         "unsupported .npy format version " + std::to_string(major) + " (expected 1.0 or 2.0)");
  }
  if (header_start + header_len > bytes.size()) fail(what, "file is truncated inside the header");
  std::string header = bytes.substr(header_start, header_len);
  std::string descr = dict_value(header, "descr", what);
  std::string order = dict_value(header, "fortran_order", what);
  std::vector<int64_t> shape = parse_shape(dict_value(header, "shape", what), what);
  size_t item = 0;
  if (descr == "'<f4'" || descr == "'=f4'") {
    item = 4;
  } else if (descr == "'<f2'" || descr == "'=f2'") {
    item = 2;
  } else if (mask && (descr == "'|b1'" || descr == "'<b1'" || descr == "'=b1'")) {
    item = 1;
  } else {
    fail(what,
         "unsupported dtype " + descr + " (expected little-endian float32 '<f4' or float16 '<f2')");
  }
  if (order != "False") fail(what, "Fortran-ordered arrays are not supported (save with C order)");
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d != 0 && count > kMaxElements / d)
      fail(what, "shape " + shape_string(shape) + " is too large");
    count *= d;
  }
  size_t data_start = header_start + header_len;
  size_t need = size_t(count) * item;
  size_t have = bytes.size() - data_start;
  if (have < need)
    fail(what, "header promises shape " + shape_string(shape) + " (" + std::to_string(need) +
                   " bytes of data) but the file holds only " + std::to_string(have));
  if (have > need)
    fail(what, "file has " + std::to_string(have - need) + " bytes after the data of shape " +
                   shape_string(shape));
  HostTensor t;
  t.shape = shape;
  t.data.resize(size_t(count));
  const char* data = bytes.data() + data_start;
  if (need == 0) return t;  // a zero-sized dimension: no data (and no memcpy from null)
  if (item == 4) {
    std::memcpy(t.data.data(), data, need);
  } else if (item == 1) {  // a boolean mask: true attends (0), false hides (-inf)
    t = bool_mask(std::vector<uint8_t>(data, data + count), shape);
  } else {
    for (size_t i = 0; i < size_t(count); ++i) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      t.data[i] = half_to_float(h);
    }
  }
  return t;
}

HostTensor read(const std::string& path, const std::string& what, bool mask) {
  std::string label = what + " file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(label, std::string("cannot open: ") + std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(label, "read error");
  return parse(buffer.str(), label, mask);
}

void write(const std::string& path, const HostTensor& tensor) {
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape.size(); ++i)
    shape += std::to_string(tensor.shape[i]) +
             (tensor.shape.size() == 1 || i + 1 < tensor.shape.size() ? "," : "");
  shape += ")";
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error("output file '" + path + "': cannot create: " + std::strerror(errno));
    out.write(kMagic, 6);
    char version[2] = {1, 0};
    out.write(version, 2);
    char len[2] = {char(header.size() & 0xff), char(header.size() >> 8)};
    out.write(len, 2);
    out.write(header.data(), std::streamsize(header.size()));
    out.write(reinterpret_cast<const char*>(tensor.data.data()),
              std::streamsize(tensor.data.size() * 4));
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error("output file '" + path + "': write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    throw Error("output file '" + path + "': cannot rename into place: " + std::strerror(err));
  }
}

}  // namespace flashvk::npy
