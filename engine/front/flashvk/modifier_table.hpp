#pragma once
// The front ends' table of modifiers (the CLI, bench, the viewer's option parser in io/): each
// modifier's options, how a value sets it, and the settings bench times. Built with the engine
// (engine/src/modifiers.cpp, where each modifier has its one home) but not part of its public
// API: applications set Modifiers' fields; this header is not installed.
#include <string>
#include <utility>
#include <vector>

#include "flashvk/modifiers.hpp"

namespace flashvk {

/// One option of a modifier in a front end: the CLI's `--name VALUE`, its help, and what VALUE is.
struct ModifierOption {
  /// flag: no value; number: a finite number; integers: a comma-separated list; values: an .npy
  /// file of float32 values; mask: an .npy file of float32 (additive) or bool (PyTorch's
  /// attn_mask, true attends) values; source: a text file (GLSL).
  enum class Kind { flag, number, integers, values, mask, source };
  const char* name;   ///< "softcap": the CLI's --softcap
  const char* value;  ///< what the help calls the value ("C", "L,R", "FILE"); "" for a flag
  Kind kind;
  const char* help;  ///< one paragraph, unwrapped
};
/// An option's value as a front end read it.
struct OptionValue {
  double number = 0;
  std::vector<int64_t> integers;
  HostTensor table;        ///< values and mask: the file's tensor (a bool mask as 0 and -inf)
  std::string text, file;  ///< source: the file's text and its name
};
/// What front ends know of one modifier; modifier_table() lists them all.
struct ModifierInfo {
  const char* name;
  std::vector<ModifierOption> options;
  /// Sets the modifier from its option `option` (one of `options`); throws Error (the CLI adds
  /// the option's name) for a value it cannot take.
  void (*set)(Modifiers& mods, const std::string& option, const OptionValue& value);
  /// Whether `mods` has it on.
  bool (*active)(const Modifiers& mods);
  /// Its part of modifier_text(), when active.
  std::string (*text)(const Modifiers& mods);
  /// The score of key `key` after it, from the score before it (score_formula()).
  std::string (*formula)(const Modifiers& mods, const std::string& score, const std::string& key);
  /// Its JSON members (modifier_json()).
  void (*json)(const Modifiers& mods, const TracedRow* row,
               std::vector<std::pair<std::string, std::string>>& members);
  /// Settings of it that `flashvk bench --suite modifiers` times beside causal attention `base`
  /// of shape `dims`; none for causal and the window, whose costs the standard suite shows.
  std::vector<Modifiers> (*examples)(const Modifiers& base, const Dims& dims);
};
const std::vector<ModifierInfo>& modifier_table();

}  // namespace flashvk
