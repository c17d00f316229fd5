// libFuzzer target: the CLI argument parser. The input is split at NUL bytes into arguments and
// parsed (by CLI11) with `flashvk run`'s options; every typed getter and the modifiers' parser are
// exercised on what was parsed.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> argv(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0)
      argv.emplace_back();
    else
      argv.back() += static_cast<char>(data[i]);
  }
  try {
    // The modifiers that take no file: --window L,R, --softcap, --alibi-max-bias.
    flashvk::cli::Args args(argv,
                            {"q", "k", "v", "out", "scale", "splits", "device", "rope-base",
                             "window", "softcap", "alibi-max-bias"},
                            {"causal"});
    flashvk::AttentionParams params;
    flashvk::cli::modifier_options(args, params.mods);
    args.integer("splits", 0, 1, 4096);
    args.integer("device", -1, 0, 1 << 20);
    args.number("scale", 1.0);
    args.number("rope-base", 10000.0, true);
    args.text("q");
    if (args.has("out")) args.required("out");
    args.flag("causal");
  } catch (const flashvk::cli::UsageError&) {
  }
  return 0;
}
