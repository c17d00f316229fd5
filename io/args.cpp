#include "args.hpp"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

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

namespace {

const std::set<std::string> kStorageOptions = {"dtype", "kv-dtype"};

// One option's help: "  --name VALUE" in a column of 22, then the text wrapped at 94 columns
// (on a line of its own when the option is wider than its column).
std::string option_help(const std::string& name, const std::string& value, const std::string& help) {
  const size_t column = 22, width = 94;
  std::string head = "  --" + name + (value.empty() ? "" : " " + value);
  std::string out = head;
  if (head.size() + 2 > column)
    out += "\n" + std::string(column, ' ');
  else
    out += std::string(column - head.size(), ' ');
  size_t line = column;
  std::string text = help, word;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i < text.size() && text[i] != ' ') {
      word += text[i];
      continue;
    }
    if (word.empty()) continue;
    if (line > column && line + 1 + word.size() > width) {
      out += "\n" + std::string(column, ' ');
      line = column;
    }
    if (line > column) out += ' ', ++line;
    out += word;
    line += word.size();
    word.clear();
  }
  return out + "\n";
}

std::string option_help(const ModifierOption& o) {
  return option_help(o.name, o.value, o.help);
}

// --dtype and --kv-dtype, their choices from the table of formats.
std::string storage_help() {
  std::string queries;
  for (DType t : dtypes(DTypeUse::query)) queries += (queries.empty() ? "" : "|") + std::string(dtype_name(t));
  return option_help("dtype", queries,
                     "storage of Q, and of K and V unless --kv-dtype (default f32; accumulation is "
                     "always fp32; with f16 on GPUs with cooperative matrices the softmax weights "
                     "are rounded to fp16 for the P V product: up to 2^-11 max|v| more error)") +
         option_help("kv-dtype", "T",
                     "storage of K and V: " + dtype_list() +
                         " (the block formats: ggml's blocks of 32 values, quantised on upload: d "
                         "and dv multiples of 32); default --dtype. bench takes a list "
                         "(f16,q8_0): the shape in each, in the same rounds, \"vs base\" "
                         "against the first");
}

// A comma-separated list of integers ("7,2"); nullopt if it is not one.
std::optional<std::vector<int64_t>> integer_list(const std::string& text) {
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string part = text.substr(start, comma - start);
    int64_t value = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) return std::nullopt;
    values.push_back(value);
    start = comma + 1;
  }
  return values;
}

}  // namespace

std::vector<std::string> modifier_option_names() {
  std::vector<std::string> names;
  for (const ModifierInfo& info : modifier_table())
    for (const ModifierOption& o : info.options) names.push_back(o.name);
  return names;
}

std::set<std::string> with_modifiers(std::set<std::string> values) {
  for (const ModifierInfo& info : modifier_table())
    for (const ModifierOption& o : info.options)
      if (o.kind != ModifierOption::Kind::flag) values.insert(o.name);
  values.insert(kStorageOptions.begin(), kStorageOptions.end());
  return values;
}

std::set<std::string> with_modifier_flags(std::set<std::string> flags) {
  for (const ModifierInfo& info : modifier_table())
    for (const ModifierOption& o : info.options)
      if (o.kind == ModifierOption::Kind::flag) flags.insert(o.name);
  return flags;
}

std::string modifier_help() {
  std::string text;
  for (const ModifierInfo& info : modifier_table())
    for (const ModifierOption& o : info.options) text += option_help(o);
  return text + storage_help();
}

void modifier_options(const Args& args, Modifiers& mods) {
  using Kind = ModifierOption::Kind;
  for (const ModifierInfo& info : modifier_table())
    for (const ModifierOption& o : info.options) {
      std::string name = o.name;
      if (o.kind == Kind::flag ? !args.flag(name) : !args.has(name)) continue;
      OptionValue value;
      std::string text = args.text(name);
      switch (o.kind) {
        case Kind::flag:
          break;
        case Kind::number:
          value.number = args.number(name, 0.0);
          break;
        case Kind::integers:
          if (auto list = integer_list(text))
            value.integers = *list;
          else
            throw UsageError{"--" + name + " must be " + o.value + " with integers, got '" + text +
                             "'"};
          break;
        case Kind::values:
        case Kind::mask:
          value.table = npy::read(text, name, o.kind == Kind::mask);
          break;
        case Kind::source: {
          std::ifstream in(text, std::ios::binary);
          std::ostringstream all;
          all << in.rdbuf();
          if (!in || all.str().empty())
            throw UsageError{"--" + name + ": cannot read '" + text + "' (a GLSL file)"};
          value.text = all.str();
          value.file = text;
          break;
        }
      }
      try {
        info.set(mods, name, value);
      } catch (const Error& e) {
        throw UsageError{"--" + name + " " + e.what() +
                         (text.empty() ? "" : ", got '" + text + "'")};
      }
    }
  for (const ModifierInfo& a : modifier_table())  // options of one modifier that exclude each other
    if (a.options.size() > 1) {
      std::vector<std::string> given;
      for (const ModifierOption& o : a.options)
        if (args.has(o.name)) given.push_back(std::string("--") + o.name);
      if (given.size() > 1) throw UsageError{"give " + given[0] + " or " + given[1] + ", not both"};
    }
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
  return at == std::string::npos ? text : text.replace(at, 9, modifier_help());
}

std::string params_text(const AttentionParams& p) {
  std::string s = modifier_text(p.mods);
  if (p.hints.fp16_arithmetic) s += std::string(s.empty() ? "" : " ") + "fp16 arithmetic";
  return s;
}

TileLayout parse_layout(const std::string& text) {
  std::vector<TileLayout> all = all_tile_layouts();
  for (TileLayout layout : all)
    if (text == tile_layout_info(layout).option) return layout;
  std::string options;
  for (size_t i = 0; i < all.size(); ++i)
    options += std::string(i == 0 ? "" : i + 1 == all.size() ? " or " : ", ") +
               tile_layout_info(all[i]).option;
  throw UsageError{"--layout must be " + options + ", got '" + text + "'"};
}

MatrixApi parse_matrix_api(const std::string& text) {
  for (MatrixApi api : {MatrixApi::automatic, MatrixApi::khr, MatrixApi::nv, MatrixApi::nv2,
                        MatrixApi::emulated, MatrixApi::emulated_nv2, MatrixApi::none})
    if (text == matrix_api_name(api)) return api;
  throw UsageError{
      "--matrix-api must be auto, khr, nv, nv2, emulated, emulated-nv2 or none, got '" + text +
      "'"};
}

}  // namespace flashvk::cli
