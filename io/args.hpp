#pragma once
// Command-line options: `--name value` and `--flag`, parsed by CLI11 and checked strictly so a typo
// is an error.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "flashvk/attention.hpp"
#include "flashvk/error.hpp"
#include "flashvk/modifier_table.hpp"

namespace flashvk::cli {

/// Thrown for anything the user typed wrong; main() prints it and exits with status 2.
struct UsageError {
  std::string message;
};

class Args {
 public:
  /// `values` are options that take a value, `flags` those that do not.
  Args(const std::vector<std::string>& argv, const std::set<std::string>& values,
       const std::set<std::string>& flags);

  bool flag(const std::string& name) const { return flags_.count(name) > 0; }
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string text(const std::string& name, const std::string& fallback = "") const;
  std::string required(const std::string& name) const;
  /// Integer in [min, max]; the message names the option and the range.
  int64_t integer(const std::string& name, int64_t fallback, int64_t min, int64_t max) const;
  /// Finite number; positive if asked.
  double number(const std::string& name, double fallback, bool positive = false) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> flags_;
};

/// The options of the score modifiers (modifier_table()), which run, trace and bench share:
/// `values` and `flags` with the modifiers' options added, and the storage options (--dtype,
/// --kv-dtype) to `values`.
std::set<std::string> with_modifiers(std::set<std::string> values);
std::set<std::string> with_modifier_flags(std::set<std::string> flags);
/// The modifiers' option names alone (without the storage options).
std::vector<std::string> modifier_option_names();
/// Reads every modifier's options into `mods` (.npy files for tables and masks); a value the
/// modifier refuses is a UsageError naming the option.
void modifier_options(const Args& args, Modifiers& mods);
/// A comma-separated list of `option`'s values ("flash2,flashd"), each parsed by `parse` (which
/// throws Error) and named at most once (`name` gives a value's name).
template <typename T, typename Parse, typename Name>
std::vector<T> parse_list(const std::string& option, const std::string& text, Parse parse,
                          Name name) {
  std::vector<T> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    T v;
    try {
      v = parse(text.substr(start, comma - start));
    } catch (const Error& e) {
      throw UsageError{option + ": " + e.what()};
    }
    if (std::find(values.begin(), values.end(), v) != values.end())
      throw UsageError{option + ": '" + std::string(name(v)) + "' is named twice"};
    values.push_back(v);
    start = comma + 1;
  }
  return values;
}

/// --dtype (Q's storage, f32 or f16, and by default K's and V's) and --kv-dtype (K's and V's:
/// dtype_list()); a list is refused, naming `where` ("run", "--suite modifiers").
Storage storage_options(const Args& args, const std::string& where);
/// The same with --kv-dtype a list (bench: "f16,q8_0"), one Storage per entry.
std::vector<Storage> storage_list(const Args& args);
/// "f16" when Q, K and V share a dtype, else "f16/q8_0" (Q/K and V), or "Q/K/V".
std::string storage_text(const Storage& storage);
/// The help text of the modifiers' and storage options, built from modifier_table().
std::string modifier_help();
/// A command's help text with modifier_help() where it says MODIFIERS.
std::string with_modifier_help(const char* help);
/// How a run is named in tables and closing lines: its modifiers (modifier_text()), and
/// "fp16 arithmetic" when asked for; "" for none.
std::string params_text(const AttentionParams& params);

/// --layout: auto, shared, registers or coopmat.
TileLayout parse_layout(const std::string& text);
/// --matrix-api: auto, khr, nv, nv2, emulated, emulated-nv2 or none (matrix_api_name()).
MatrixApi parse_matrix_api(const std::string& text);
/// --matrix-api's lines of the help of every command that takes it (a string literal).
#define FLASHVK_MATRIX_API_HELP                                                                   \
  "  --matrix-api API    how the matrix kernels reach matrix units: auto (the device's, see\n"   \
  "                      `flashvk devices`; else emulated), khr, nv, nv2 (NVIDIA's second\n"      \
  "                      extension: the softmax in matrices, d up to 128), emulated or\n"       \
  "                      emulated-nv2 (no matrix units needed; slow; runs only where --layout\n" \
  "                      coopmat asks) or none\n"

/// Writes text to a temporary name in the same folder, then renames it into place, so a failed
/// write leaves no output file behind; throws Error naming the file.
void write_text(const std::string& path, const std::string& text);
/// Throws write_text's Error now if it could not write `path` (a long run checks before it starts).
void check_writable(const std::string& path);

/// Where the commands keep the driver's compiled pipelines between runs:
/// $FLASHVK_PIPELINE_CACHE if set (empty turns the cache off), else
/// $XDG_CACHE_HOME/flashvk/pipelines.bin or ~/.cache/flashvk/pipelines.bin. "" if none works.
std::string default_pipeline_cache();

}  // namespace flashvk::cli
