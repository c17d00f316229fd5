#include "args.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>

#include "flashvk/error.hpp"
#include "npy.hpp"

namespace flashvk::cli {

// CLI11 parses: `--name value` and `--name=value`, unknown and repeated options, missing values.
// The typed getters below check the values, lazily, as each command's defaults depend on others.
Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& values,
           const std::set<std::string>& flags) {
  CLI::App app;
  app.set_help_flag();  // each command prints its own help
  std::map<std::string, std::string> got;
  std::map<std::string, CLI::Option*> value_options, flag_options;
  for (const std::string& name : values)
    value_options[name] = app.add_option("--" + name, got[name])
                              ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
                              ->allow_extra_args(false);
  for (const std::string& name : flags)
    flag_options[name] = app.add_flag("--" + name)->disable_flag_override();  // no --flag=x
  std::vector<std::string> reversed(argv.rbegin(), argv.rend());  // CLI11 takes them backwards
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    throw UsageError{std::string(e.what()) + " (see --help)"};
  }
  for (const auto& [name, option] : value_options)
    if (option->count()) values_[name] = got[name];
  for (const auto& [name, option] : flag_options)
    if (option->count()) flags_.insert(name);
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

namespace {
// The name write_text writes before renaming into place: in the same folder, this process's own.
std::string temp_name(const std::string& path) {
  return path + ".tmp." + std::to_string(::getpid());
}
}  // namespace

void check_writable(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error("output file '" + path + "': is a folder");
  std::string tmp = temp_name(path);
  bool ok = std::ofstream(tmp).good();
  std::remove(tmp.c_str());
  if (!ok) throw Error("output file '" + path + "': cannot write");
}

void write_text(const std::string& path, const std::string& text) {
  std::string tmp = temp_name(path);
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

const std::set<std::string> kModifierOptions = {
    "window", "softcap", "alibi-max-bias", "alibi-slopes", "sinks", "mask", "dtype", "kv-dtype"};

const char* kModifierHelp =
    R"(  --window L,R        sliding window: query i sees keys i + Nk - Nq - L .. i + Nk - Nq + R
                      (-1: unbounded on that side; with --causal R is 0); keys outside it
                      are never read (the fused variants)
  --softcap C         logit softcapping: s = C tanh(s / C), before ALiBi (Gemma 2)
  --alibi-max-bias B  ALiBi with ggml's slopes from max_bias B: s -= slope_h |i + Nk - Nq - j|
  --alibi-slopes FILE
                      ALiBi with these slopes (.npy, [H] or [B, H])
  --sinks FILE        attention sinks (gpt-oss): one logit per query head (.npy, [H]), in the
                      softmax's denominator only
  --mask FILE         a mask (.npy, [Nq, Nk] or [B or 1, H or 1, Nq, Nk]): float32 is added
                      to the scores (-inf hides a key), bool as PyTorch's attn_mask (true
                      attends)
  --dtype f32|f16     storage of Q, and of K and V unless --kv-dtype (default f32;
                      accumulation is always fp32; with f16 on GPUs with cooperative
                      matrices the softmax weights are rounded to fp16 for the P V product:
                      up to 2^-11 max|v| more error)
  --kv-dtype T        storage of K and V: f32, f16, bf16, q8_0 or q4_0 (ggml's blocks of 32
                      values with an fp16 scale, quantised on upload: d and dv multiples
                      of 32); default --dtype. bench takes a list (f16,q8_0,q4_0): the
                      shape in each, in the same rounds, "vs base" against the first
)";

std::set<std::string> with_modifiers(std::set<std::string> names) {
  names.insert(kModifierOptions.begin(), kModifierOptions.end());
  return names;
}

void modifier_options(const Args& args, AttentionParams& p) {
  if (args.has("window")) {
    std::string text = args.text("window");
    size_t comma = text.find(',');
    auto side = [&](const std::string& part) {
      int64_t value = 0;
      auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
      if (part.empty() || ec != std::errc() || end != part.data() + part.size() || value < -1)
        throw UsageError{
            "--window must be L,R with integers of at least -1 (-1: unbounded), "
            "got '" +
            text + "'"};
      return value;
    };
    if (comma == std::string::npos)
      throw UsageError{"--window must be L,R (keys before and after the diagonal), got '" + text +
                       "'"};
    p.window_left = side(text.substr(0, comma));
    p.window_right = side(text.substr(comma + 1));
  }
  p.softcap = static_cast<float>(args.number("softcap", 0.0, true));
  p.alibi_max_bias = static_cast<float>(args.number("alibi-max-bias", 0.0, true));
  if (args.has("alibi-max-bias") && args.has("alibi-slopes"))
    throw UsageError{"give --alibi-max-bias or --alibi-slopes, not both"};
  // One value per query head ([H]), or for the slopes per batch and head ([B, H]); the engine
  // checks the counts against the shapes.
  auto per_head = [&](const char* option, const char* what, size_t max_rank) {
    HostTensor t = npy::read(args.text(option), what);
    if (t.shape.empty() || t.shape.size() > max_rank)
      throw UsageError{std::string("--") + option + " must hold " +
                       (max_rank == 1 ? "[H]" : "[H] or [B, H]") + " values, got shape " +
                       shape_string(t.shape)};
    return t.data;
  };
  if (args.has("alibi-slopes")) p.alibi_slopes = per_head("alibi-slopes", "ALiBi slopes", 2);
  if (args.has("sinks")) p.sinks = per_head("sinks", "sinks", 1);
  if (args.has("mask")) p.mask = npy::read(args.text("mask"), "mask", true);
}

std::vector<Storage> storage_list(const Args& args) {
  std::string q = args.text("dtype", "f32");
  if (q != "f32" && q != "f16") throw UsageError{"--dtype must be f32 or f16, got '" + q + "'"};
  Storage s(parse_dtype(q));
  if (!args.has("kv-dtype")) return {s};
  std::vector<Storage> list;
  for (DType kv : parse_list<DType>("--kv-dtype", args.text("kv-dtype"), parse_dtype, dtype_name))
    list.push_back(Storage(s.q, kv, kv));
  return list;
}

Storage storage_options(const Args& args, const std::string& where) {
  std::vector<Storage> list = storage_list(args);
  if (list.size() > 1)
    throw UsageError{"--kv-dtype takes one storage with " + where +
                     " (a list is for bench on one shape)"};
  return list.front();
}

std::string storage_text(const Storage& s) {
  std::string text = dtype_name(s.q);
  if (s.own_kv()) text += std::string("/") + dtype_name(s.k);
  if (s.v != s.k) text += std::string("/") + dtype_name(s.v);
  return text;
}

std::string with_modifier_help(const char* help) {
  std::string text = help;
  size_t at = text.find("MODIFIERS");
  return at == std::string::npos ? text : text.replace(at, 9, kModifierHelp);
}

std::string modifier_text(const AttentionParams& p, const std::string& mask_name) {
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : " ") + part; };
  if (p.window_left >= 0 || p.window_right >= 0)
    add("window " + std::to_string(p.window_left) + "," + std::to_string(p.window_right));
  if (p.softcap > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "softcap %g", double(p.softcap));
    add(buf);
  }
  if (p.alibi_max_bias > 0 || !p.alibi_slopes.empty()) add("alibi");
  if (!p.sinks.empty()) add("sinks");
  if (!p.mask.data.empty())
    add(mask_name.empty() ? "mask " + shape_string(p.mask.shape) : "mask (" + mask_name + ")");
  if (p.fp16_arithmetic) add("fp16 arithmetic");
  return s;
}

TileLayout parse_layout(const std::string& text) {
  if (text == "auto") return TileLayout::automatic;
  if (text == "shared") return TileLayout::shared;
  if (text == "registers") return TileLayout::registers;
  if (text == "coopmat") return TileLayout::cooperative_matrix;
  if (text == "lanes") return TileLayout::lanes;
  if (text == "blocks") return TileLayout::blocks;
  throw UsageError{"--layout must be auto, shared, registers, coopmat, lanes or blocks, got '" +
                   text + "'"};
}

}  // namespace flashvk::cli
