#include "args.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "flashvk/error.hpp"

namespace flashvk::cli {

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& values,
           const std::set<std::string>& flags) {
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    if (arg.rfind("--", 0) != 0) throw UsageError{"unexpected argument '" + arg + "'"};
    std::string name = arg.substr(2);
    if (flags.count(name)) {
      if (has_inline) throw UsageError{"option --" + name + " takes no value"};
      flags_.insert(name);
    } else if (values.count(name)) {
      if (values_.count(name)) throw UsageError{"option --" + name + " is given twice"};
      if (!has_inline && i + 1 >= argv.size())
        throw UsageError{"option --" + name + " needs a value"};
      values_[name] = has_inline ? inline_value : argv[++i];
    } else {
      throw UsageError{"unknown option '" + arg + "' (see --help)"};
    }
  }
}

std::string Args::text(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

std::string Args::required(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || it->second.empty())
    throw UsageError{"missing required option --" + name};
  return it->second;
}

int64_t Args::integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& s = it->second;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size())
    throw UsageError{"--" + name + " expects an integer, got '" + s + "'"};
  if (value < min || value > max)
    throw UsageError{"--" + name + " must be between " + std::to_string(min) + " and " +
                     std::to_string(max) + ", got " + s};
  return value;
}

double Args::number(const std::string& name, double fallback, bool positive) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  const std::string& s = it->second;
  double value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value))
    throw UsageError{"--" + name + " expects a finite number, got '" + s + "'"};
  if (positive && !(value > 0)) throw UsageError{"--" + name + " must be positive, got " + s};
  return value;
}

std::string default_pipeline_cache() {
  if (const char* env = std::getenv("FLASHVK_PIPELINE_CACHE")) return env;
  std::filesystem::path dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    dir = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    dir = std::filesystem::path(home) / ".cache";
  else
    return "";
  dir /= "flashvk";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  return ec ? "" : (dir / "pipelines.bin").string();
}

void write_text(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw Error("output file '" + path + "': cannot write");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("output file '" + path + "': cannot rename into place");
  }
}

TileLayout parse_layout(const std::string& text) {
  if (text == "auto") return TileLayout::automatic;
  if (text == "shared") return TileLayout::shared;
  if (text == "registers") return TileLayout::registers;
  if (text == "coopmat") return TileLayout::cooperative_matrix;
  if (text == "lanes") return TileLayout::lanes;
  throw UsageError{"--layout must be auto, shared, registers, coopmat or lanes, got '" + text +
                   "'"};
}

}  // namespace flashvk::cli
