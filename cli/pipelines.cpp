// flashvk pipelines: every pipeline the engine builds for the calls `bench` would time, and what
// the driver compiled of each (describe_pipelines), as a table, JSON, SPIR-V files and
// disassembly. On Mesa's RADV with RADV_FORCE_FAMILY it is AMD's compiler on any machine
// (scripts/pipelines.sh).
#include "pipelines.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "bench_cases.hpp"
#include "commit.hpp"
#ifdef FLASHVK_CLI_FLEX
#include "flashvk/flex.hpp"
#endif

namespace flashvk::cli {

namespace {

using Json = nlohmann::ordered_json;

const char* kPipelinesHelp = R"(usage: flashvk pipelines [options]

Lists every pipeline the engine builds for the calls `flashvk bench` would time with the same
options (one shape, or a suite), without running any: the shader, the tile layout and sizes,
the specialization constants, and what the driver compiled (VK_KHR_pipeline_executable_
properties: registers, spills, scratch, shared memory, occupancy (on RDNA by whole workgroups:
rdna_subgroups_per_simd), instructions, code size, read from each driver's own names for them,
RADV's, AMD's or NVIDIA's; '-' where the driver gives none; every statistic by its own name in
the JSON). Where the driver gives its disassembly (RADV), the kernel's largest loop (the key
loop): its FMA share (v_fma*, v_pk_fma*, v_dot2* among the VALU instructions) and its matrix
instructions (loop MMA: v_wmma*, v_swmmac*, v_mfma*, v_smfmac*). A pipeline that several
calls build is listed once. With --score-mod or --mask-mod the kernels have the functions
compiled in (their shaders' names end in +flex), after mask_mod's tile pass (flex_tiles). The
context only compiles (no memory, no queue work), so it runs on Mesa's null devices: with
Mesa 25,
  RADV_FORCE_FAMILY=navi31 flashvk pipelines --suite kernels
reports AMD's compiler for RDNA3 on a machine without an AMD GPU (scripts/pipelines.sh sets
that up for RDNA2, RDNA3 and RDNA3.5).

options:
  --variant LIST|all  --batch B --heads H --kv-heads Hk --nq N --nk N --d D --dv D
  --dtype, --kv-dtype LIST, the modifiers, --layout, --fp16-arithmetic, --block-rows,
  --group-rows, --block-keys, --splits
                      the call, as for `flashvk bench` (default: its defaults)
  --suite standard    bench's standard suite: its prefill, window and decode sets
  --suite kernels     every kernel the engine picks on its own on a GPU: prefill (all six
                      variants, B=1 H=8 N=2048) in fp32, fp16, fp16 with --fp16-arithmetic,
                      and fp16 Q with K and V in each block format; decode (flash2, flashd,
                      splitkv, Nq=1 H=32 Hkv=8 Nk=16384) in fp32, fp16 and the same; d = 64, 80,
                      96, 128 and 256; without modifiers, causal, and causal with a window,
                      softcap, ALiBi and sinks
  --json FILE         every pipeline with its constants and statistics (docs/formats.md)
  --spirv DIR         each pipeline's SPIR-V as DIR/<shader>.spv (its constants: the table,
                      or the JSON)
  --disassembly DIR   the driver's representations of each pipeline as DIR/<n>-<shader>.txt
                      (n: its row in the table)
  --check             exit with status 1 if a pipeline spills registers or uses scratch
                      memory (statistics whose names say spill or scratch, and NVIDIA's
                      Local Memory Size, above 0), or a matrix kernel on the matrix units
                      has none of their instructions in its key loop (loop MMA 0; checked
                      where the disassembly shows a key loop)
  --device N          Vulkan device index
)" FLASHVK_MATRIX_API_HELP R"(  --subgroup-size N   build the subgroup kernels for subgroups of N lanes and require it
                      (the device's `flashvk devices` range: 32 or 64 on AMD); default the
                      device's own size
  --skip-listed FILE  leave out, without compiling, the pipelines an earlier run's --json
                      FILE lists (the same shader, constants and required subgroup size, which
                      the driver compiles as it did then): FILE must come from this build of
                      flashvk on the same device and driver, and the call have no --score-mod or
                      --mask-mod. scripts/pipelines.sh's wave32 runs skip what its wave64 runs
                      compiled

The subgroup column: the size a pipeline requires, every subgroup full ("32 full": its kernel
uses subgroup operations built for that size), or where it assumes none the size the driver
compiled it at ("any" where the driver does not say). --check also fails where a driver
compiled a pipeline at another size than it required.

FLASHVK_MATRIX_SKIP=LIST builds the matrix kernels as bench does under it (their registers with
phases left out, or with prefetch or queries: flashvk bench --help).

examples:
  flashvk pipelines --variant flash2 --nq 4096 --d 128 --dtype f16 --fp16-arithmetic
  RADV_FORCE_FAMILY=vangogh flashvk pipelines --suite kernels --check --json vangogh.json
)";

// One pipeline, and the calls that build it.
struct Entry {
  PipelineDescription p;
  std::vector<std::string> calls;
};

std::string call_text(const Case& c, Variant v) {
  const Dims& d = c.dims;
  std::string mods = modifier_text(c.mods);
  char text[200];
  std::snprintf(text, sizeof(text), "%s %s %s Nq=%u Nk=%u d=%u%s%s%s", c.kind, variant_name(v),
                storage_text(c.storage).c_str(), d.nq, d.nk, d.d, mods.empty() ? "" : " ",
                mods.c_str(), c.fp16_arithmetic ? " fp16-arithmetic" : "");
  return text;
}

// A pipeline's build: its shader, constants and required subgroup size.
std::string key_of(const std::string& shader, const std::vector<uint32_t>& values,
                   uint32_t required_subgroup) {
  std::string key = shader;
  for (uint32_t value : values) {
    key += ',';  // not "," + to_string(): GCC 12 at -O3 warns of a false overlap (-Wrestrict)
    key += std::to_string(value);
  }
  key += ",@";
  key += std::to_string(required_subgroup);
  return key;
}

std::string key_of(const PipelineDescription& p) {
  std::vector<uint32_t> values;
  for (auto [id, value] : p.spec_constants) values.push_back(value);
  return key_of(p.shader, values, p.required_subgroup);
}

// An earlier report (--json), read for --skip-listed.
Json listed_report(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw Error("--skip-listed: cannot read " + file);
  std::string why;
  try {
    Json doc = Json::parse(in);
    if (doc.at("pipelines").is_array() && doc.at("device").at("name").is_string()) return doc;
    why = "its pipelines are not a list";
  } catch (const nlohmann::json::exception& e) {
    why = e.what();
  }
  throw Error("--skip-listed: " + file + " is not a report of `flashvk pipelines --json` (" +
              why + ")");
}

// The builds a report lists, if it comes from this build of flashvk on this device and driver:
// what --skip-listed leaves out.
std::set<std::string> listed_builds(const Json& doc, const std::string& file,
                                    const DeviceInfo& dev) {
  std::set<std::string> keys;
  try {
    std::string name = doc.at("device").at("name"), driver = doc.at("device").at("driver"),
                commit = doc.at("commit");
    if (name != dev.name || driver != dev.driver || commit != FLASHVK_COMMIT)
      throw Error("--skip-listed: " + file + " is a report of " + name + " (driver " + driver +
                  ") by flashvk " + commit + "; this run is " + dev.name + " (driver " +
                  dev.driver + ") by flashvk " + FLASHVK_COMMIT);
    for (const Json& p : doc.at("pipelines")) {
      std::vector<uint32_t> values;
      for (const Json& c : p.at("spec_constants")) values.push_back(c.at("value").get<uint32_t>());
      keys.insert(key_of(p.at("shader").get<std::string>(), values,
                         p.at("required_subgroup").get<uint32_t>()));
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error("--skip-listed: " + file + " is not a report of `flashvk pipelines --json` (" +
                e.what() + ")");
  }
  return keys;
}

bool spill_or_scratch(const PipelineStatistic& s) {
  std::string name = s.name;
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  // NVIDIA's "Local Memory Size" is its spilled registers (local memory in CUDA's sense, not
  // OpenCL's, where it would be shared memory).
  return (name.find("spill") != std::string::npos || name.find("scratch") != std::string::npos ||
          name == "local memory size") &&
         s.number() > 0;
}

Json statistic_value(const PipelineStatistic& s) {
  return std::visit([](auto v) { return Json(v); }, s.value);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool holds(const std::string& name, const std::vector<const char*>& words) {
  for (const char* w : words)
    if (name.find(w) != std::string::npos) return true;
  return false;
}

}  // namespace

const std::vector<StatisticColumn>& statistic_columns() {
  // Names: RADV (Mesa), AMDVLK / AMD's Windows driver (numUsedVgprs ...), NVIDIA's driver
  // (Register Count, Binary Size). Words are lower case.
  static const std::vector<StatisticColumn> columns = {
      {"registers", "regs", 5, {"VGPRs", "numUsedVgprs", "Register Count", "Registers"},
       {"register", "vgpr"}, {"spill", "scalar", "sgpr", "avail", "max", "limit"}},
      {"scalar_registers", "SGPRs", 5, {"SGPRs", "numUsedSgprs"}, {}, {}},
      {"spilled_registers", "spill V", 7, {"Spilled VGPRs"}, {"spill"}, {"sgpr", "scalar"}},
      {"spilled_scalar_registers", "spill S", 7, {"Spilled SGPRs"}, {}, {}},
      {"scratch_bytes", "scratch", 7, {"Scratch size", "scratchMemUsageInBytes"},
       {"scratch", "local memory"}, {}},
      {"shared_bytes", "LDS", 6, {"LDS size", "ldsUsageSizeInBytes", "Shared Memory Size"},
       {"shared memory"}, {"avail", "max", "limit"}},
      {"subgroups_per_simd", "waves", 5, {"Subgroups per SIMD"}, {}, {}},
      {"instructions", "instrs", 6, {"Instructions", "Instruction Count"}, {}, {}},
      {"binary_bytes", "bytes", 6, {"Code size", "Binary Size"}, {}, {}},
  };
  return columns;
}

std::vector<std::optional<double>> column_values(const std::vector<PipelineStatistic>& stats) {
  std::vector<std::optional<double>> values;
  for (const StatisticColumn& col : statistic_columns()) {
    std::optional<double> value;
    for (const PipelineStatistic& s : stats)
      for (const char* name : col.names)
        if (!value && lower(s.name) == lower(name)) value = s.number();
    if (!value && !col.words.empty()) {
      int matches = 0;
      for (const PipelineStatistic& s : stats) {
        std::string name = lower(s.name);
        if (holds(name, col.words) && !holds(name, col.unless)) ++matches, value = s.number();
      }
      if (matches != 1) value.reset();  // none, or ambiguous
    }
    values.push_back(value);
  }
  return values;
}

bool lacks_matrix_loop(const IsaMix& mix) {
  return mix.loop_valu > 0 && mix.loop_matrix == 0;
}

IsaMix isa_mix(const std::string& assembly) {
  // ACO's assembly: an instruction a line ("  v_fma_f32 v1, v2, v3, v4 ; d2..."), blocks
  // labelled "BB<n>:", branches naming them ("s_cbranch_scc1 BB3", "s_branch BB2"). A branch
  // to a block at or before it closes a loop; the loop with the most VALU instructions is the
  // kernel's key loop.
  struct Line {
    bool valu = false, fma = false, matrix = false;
  };
  std::vector<Line> lines;
  std::map<std::string, size_t> labels;
  std::vector<std::pair<size_t, size_t>> loops;  // [first, last] line indices
  std::istringstream in(assembly);
  std::string line;
  std::vector<std::pair<size_t, std::string>> branches;
  IsaMix mix;
  // The line's first word, past leading blanks ("" for none).
  auto first_word = [](const std::string& text) {
    size_t begin = text.find_first_not_of(" \t");
    if (begin == std::string::npos) return std::string();
    size_t end = text.find_first_of(" \t", begin);
    return text.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  };
  auto starts = [](const std::string& text, const char* prefix) {
    return text.rfind(prefix, 0) == 0;
  };
  while (std::getline(in, line)) {
    std::string word = first_word(line);
    if (starts(word, "BB") && word.back() == ':') {  // "BB3:"
      labels[word.substr(0, word.size() - 1)] = lines.size();
      continue;
    }
    if (starts(word, "s_branch") || starts(word, "s_cbranch")) {  // "s_cbranch_scc1 BB3"
      std::string target = first_word(line.substr(line.find(word) + word.size()));
      if (starts(target, "BB")) branches.emplace_back(lines.size(), target);
    }
    Line l;
    l.valu = starts(word, "v_") && !starts(word, "v_readlane") &&
             !starts(word, "v_readfirstlane") && !starts(word, "v_writelane");
    l.fma = l.valu && (starts(word, "v_fma") || starts(word, "v_pk_fma") ||
                       starts(word, "v_dot2") || starts(word, "v_mac"));
    l.matrix = starts(word, "v_wmma") || starts(word, "v_swmmac") || starts(word, "v_mfma") ||
               starts(word, "v_smfmac");
    mix.valu += l.valu;
    mix.fma += l.fma;
    mix.matrix += l.matrix;
    lines.push_back(l);
  }
  for (auto [at, target] : branches) {
    auto it = labels.find(target);
    if (it == labels.end() || it->second > at) continue;
    uint64_t valu = 0, fma = 0, matrix = 0;
    for (size_t i = it->second; i <= at && i < lines.size(); ++i)
      valu += lines[i].valu, fma += lines[i].fma, matrix += lines[i].matrix;
    if (valu > mix.loop_valu) mix.loop_valu = valu, mix.loop_fma = fma, mix.loop_matrix = matrix;
  }
  return mix;
}

int cmd_pipelines(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--help") != argv.end())
    return std::cout << with_modifier_help(kPipelinesHelp), 0;
  Args args(argv,
            with_modifiers({"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv", "json",
                            "device", "matrix-api", "subgroup-size", "suite", "layout",
                            "block-rows", "block-keys", "splits", "spirv", "disassembly",
                            "skip-listed", "group-rows"}),
            with_modifier_flags({"check", "fp16-arithmetic"}));
  if (args.has("json")) check_writable(args.text("json"));
  // The builds of user functions are named for the build alone: a report of other functions
  // would match them.
  if (args.has("skip-listed") && (args.has("score-mod") || args.has("mask-mod")))
    throw UsageError{"--skip-listed cannot tell the builds of --score-mod or --mask-mod apart"};
  Json report;
  if (args.has("skip-listed")) report = listed_report(args.text("skip-listed"));
  std::vector<Case> cases;
  std::string suite = args.text("suite");
  if (suite == "standard" || suite == "kernels") {
    for (const std::string& option :
         with_modifiers({"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv"}))
      if (args.has(option))
        throw UsageError{"--suite " + suite + " fixes its shapes and modifiers; drop --" + option};
    if (args.flag("causal")) throw UsageError{"--suite " + suite + " fixes its modifiers"};
    cases = suite == "standard" ? standard_suite() : kernel_suite();
  } else if (args.has("suite")) {
    throw UsageError{"--suite must be 'standard' or 'kernels', got '" + suite + "'"};
  } else {
    cases = custom_cases(args);
  }
  Options o;
  o.layout = parse_layout(args.text("layout", "auto"));
  o.fp16_arithmetic = args.flag("fp16-arithmetic");
  o.block_rows = static_cast<uint32_t>(args.integer("block-rows", 0, 1, 1 << 16));
  o.group_rows = static_cast<uint32_t>(args.integer("group-rows", 0, 1, 1 << 16));
  o.block_keys = static_cast<uint32_t>(args.integer("block-keys", 0, 1, 1 << 16));
  o.splits = static_cast<uint32_t>(args.integer("splits", 0, 1, 1 << 16));
  for (const char* dir : {"spirv", "disassembly"})
    if (args.has(dir)) std::filesystem::create_directories(args.text(dir));

  ContextOptions options;
  options.device = static_cast<int>(args.integer("device", -1, 0, 1 << 20));
  options.matrix_api = parse_matrix_api(args.text("matrix-api", "auto"));
  options.subgroup_size = static_cast<uint32_t>(args.integer("subgroup-size", 0, 1, 1024));
  options.compile_only = true;
  const char* skip = std::getenv("FLASHVK_MATRIX_SKIP");  // the pipelines bench would time
  options.matrix_skip = skip ? skip : "";
  if (!options.matrix_skip.empty())
    std::printf("FLASHVK_MATRIX_SKIP=%s: the matrix kernels leave these phases out\n",
                options.matrix_skip.c_str());
  Context ctx = Context::create(options);
#ifdef FLASHVK_CLI_FLEX
  flex::enable(ctx);  // --score-mod, --mask-mod: their kernels, and mask_mod's tile pass
#endif
  const DeviceInfo& dev = ctx.device();
  // The matrix kernels run on the device's matrix units (not emulated).
  const MatrixApi api = ctx.handles().matrix_api;
  const bool matrix_units = on_matrix_units(api);
  if (args.flag("check") && !dev.pipeline_statistics)
    throw Error(
        "--check needs the driver's statistics (VK_KHR_pipeline_executable_properties), "
        "which " +
        dev.name + " does not give");

  std::set<std::string> listed, skipped;
  if (args.has("skip-listed")) listed = listed_builds(report, args.text("skip-listed"), dev);
  std::vector<Entry> entries;
  std::map<std::string, size_t> seen;
  auto start = std::chrono::steady_clock::now();
  size_t total = 0, done = 0;
  const bool tty = isatty(fileno(stderr)) != 0;
  for (const Case& c : cases) total += c.variants.size();
  for (const Case& c : cases)
    for (Variant v : c.variants) {
      PipelineCall call;
      call.batch = c.dims.batch, call.heads = c.dims.heads, call.kv_heads = c.dims.kv_heads;
      call.nq = c.dims.nq, call.nk = c.dims.nk, call.d = c.dims.d, call.dv = c.dims.dv;
      call.params = case_params(c, v, o);
      call.storage = c.storage;
      if (!listed.empty())
        call.only = [&](const PipelineDescription& p) {
          std::string key = key_of(p);
          if (!listed.count(key)) return true;
          skipped.insert(key);
          return false;
        };
      ++done;
      if (tty) {
        std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", done, total, call_text(c, v).c_str());
        std::fflush(stderr);
      }
      for (PipelineDescription& p : describe_pipelines(ctx, call)) {
        std::string key = key_of(p);
        auto [it, fresh] = seen.emplace(key, entries.size());
        if (fresh) entries.push_back({std::move(p), {}});
        entries[it->second].calls.push_back(call_text(c, v));
      }
    }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (tty) std::fprintf(stderr, "\r\033[K");

  // What the driver gave the first pipeline (every one skipped: whether it gives any).
  bool statistics =
      entries.empty() ? dev.pipeline_statistics : !entries[0].p.executables.empty();
  std::printf("device: %s (driver %s), subgroup kernels at %u lanes (%s)\n", dev.name.c_str(),
              dev.driver.c_str(), dev.subgroup_size,
              dev.subgroup_shuffle ? "required, full subgroups"
                                   : "none: the device cannot require a subgroup size");
  std::printf("%zu pipeline%s for %zu call%s, compiled in %.1f s", entries.size(),
              entries.size() == 1 ? "" : "s", total, total == 1 ? "" : "s", seconds);
  if (args.has("skip-listed"))
    std::printf("; %zu more as listed in %s, not compiled", skipped.size(),
                args.text("skip-listed").c_str());
  std::printf("\n");
  if (!statistics)
    std::printf(
        "the driver gives no statistics (it lacks VK_KHR_pipeline_executable_properties): "
        "shaders and constants only\n");
  // RDNA: waves by whole workgroups (rdna_subgroups_per_simd), from the LDS column.
  const bool rdna = statistics && is_rdna(dev);
  size_t lds = 0, waves = 0;
  for (size_t c = 0; c < statistic_columns().size(); ++c) {
    std::string key = statistic_columns()[c].key;
    if (key == "shared_bytes") lds = c;
    if (key == "subgroups_per_simd") waves = c;
  }
  if (rdna)
    std::printf(
        "waves: subgroups of 32 a SIMD by whole workgroups in a WGP's 128 KiB of LDS (the "
        "driver's own figure, in the JSON's statistics, may round up)\n");
  std::printf("\n%3s %-34s %-20s %-8s", "#", "shader", "tiles", "subgroup");
  if (statistics) {
    for (const StatisticColumn& col : statistic_columns())
      std::printf(" %*s", col.width, col.title);
    std::printf(" %9s %8s", "loop FMA", "loop MMA");
  }
  std::printf("\n");
  int spills = 0, wrong_sizes = 0, no_matrix = 0;
  Json list = Json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    const PipelineDescription& p = entries[i].p;
    std::string tiles = tile_layout_name(p.layout);
    if (p.block_keys)
      tiles += ' ' + std::to_string(p.block_rows) + 'x' + std::to_string(p.block_keys);
    // The size it requires, else the one the driver compiled it at.
    uint32_t compiled = p.executables.empty() ? 0 : p.executables[0].subgroup_size;
    std::string subgroup = p.required_subgroup ? std::to_string(p.required_subgroup) + " full"
                           : compiled          ? std::to_string(compiled)
                                               : "any";
    std::printf("%3zu %-34s %-20s %-8s", i, p.shader.c_str(), tiles.c_str(), subgroup.c_str());
    bool wrong_size = p.required_subgroup && compiled && compiled != p.required_subgroup;
    bool matrixless = false;  // set below, from the disassembly
    Json x;
    x["shader"] = p.shader;
    x["source"] = p.source;
    x["program"] = p.program;
    x["layout"] = tile_layout_name(p.layout);
    x["block_rows"] = p.block_rows;
    x["block_keys"] = p.block_keys;
    x["required_subgroup"] = p.required_subgroup;
    Json constants = Json::array();
    for (size_t k = 0; k < p.spec_constants.size(); ++k)
      constants.push_back({{"id", p.spec_constants[k].first},
                           {"name", p.spec_names[k]},
                           {"value", p.spec_constants[k].second}});
    x["spec_constants"] = constants;
    x["calls"] = entries[i].calls;
    Json stats = Json::object(), executables = Json::array();
    bool spilled = false;
    for (const PipelineExecutable& e : p.executables) {
      Json es = Json::object();
      for (const PipelineStatistic& s : e.statistics) {
        es[s.name] = statistic_value(s);
        spilled = spilled || spill_or_scratch(s);
      }
      if (stats.empty()) stats = es;
      executables.push_back(
          {{"name", e.name}, {"subgroup_size", e.subgroup_size}, {"statistics", es}});
    }
    x["statistics"] = stats;
    if (executables.size() > 1) x["executables"] = executables;
    if (!p.executables.empty()) {
      const PipelineExecutable& e = p.executables[0];
      std::vector<std::optional<double>> values = column_values(e.statistics);
      if (rdna) {  // the driver's subgroups a SIMD, by whole workgroups
        uint32_t invocations = 0;
        for (size_t k = 0; k < p.spec_names.size(); ++k)
          if (p.spec_names[k] == "local_size_x") invocations = p.spec_constants[k].second;
        uint32_t lanes = p.required_subgroup ? p.required_subgroup : compiled;
        if (values[waves] && values[lds] && invocations)
          values[waves] =
              rdna_subgroups_per_simd(uint64_t(*values[lds]), invocations, lanes, *values[waves]);
      }
      Json summary = Json::object();
      for (size_t c = 0; c < values.size(); ++c) {
        const StatisticColumn& col = statistic_columns()[c];
        summary[col.key] = values[c] ? Json(*values[c]) : Json(nullptr);
        if (values[c])  // whole numbers, but for waves by whole workgroups (1.5: 3 over 2)
          std::printf(" %*.*f", col.width, *values[c] == std::floor(*values[c]) ? 0 : 1,
                      *values[c]);
        else
          std::printf(" %*s", col.width, "-");
      }
      x["summary"] = summary;
      IsaMix mix = isa_mix(e.representation("Assembly"));
      if (mix.valu == 0) {  // no disassembly, or one its disassembler could not read
        std::printf(" %9s %8s", "-", "-");
      } else {
        x["isa"] = {{"valu", mix.valu},
                    {"fma", mix.fma},
                    {"matrix", mix.matrix},
                    {"loop_valu", mix.loop_valu},
                    {"loop_fma", mix.loop_fma},
                    {"loop_matrix", mix.loop_matrix}};
        if (mix.loop_valu)
          std::printf(" %8.1f%% %8llu", 100.0 * double(mix.loop_fma) / double(mix.loop_valu),
                      static_cast<unsigned long long>(mix.loop_matrix));
        else
          std::printf(" %9s %8s", "-", "-");
        matrixless =
            p.layout == TileLayout::cooperative_matrix && matrix_units && lacks_matrix_loop(mix);
      }
    } else if (statistics) {  // a driver that gave this pipeline nothing: the row stays aligned
      for (const StatisticColumn& col : statistic_columns()) std::printf(" %*s", col.width, "-");
      std::printf(" %9s %8s", "-", "-");
    }
    if (spilled) {
      ++spills;
      std::printf("  SPILLS");
    }
    if (wrong_size) {
      ++wrong_sizes;
      std::printf("  COMPILED AT %u LANES", compiled);
    }
    if (matrixless) {
      ++no_matrix;
      std::printf("  NO MATRIX INSTRUCTIONS IN ITS LOOP");
    }
    x["spills"] = spilled;
    std::printf("\n");
    list.push_back(x);
    if (args.has("spirv")) {
      std::ofstream f(args.text("spirv") + "/" + p.shader + ".spv", std::ios::binary);
      f.write(reinterpret_cast<const char*>(p.spirv.data()),
              static_cast<std::streamsize>(p.spirv.size() * 4));
      if (!f) throw Error("could not write " + args.text("spirv") + "/" + p.shader + ".spv");
    }
    if (args.has("disassembly") && !p.executables.empty()) {
      std::string text;
      for (const auto& [name, body] : p.executables[0].representations)
        text += "; " + name + "\n" + body + "\n";
      write_text(args.text("disassembly") + "/" + std::to_string(i) + "-" + p.shader + ".txt",
                 text);
    }
  }
  if (statistics)
    std::printf("\n%d of %zu pipelines spill registers or use scratch memory\n", spills,
                entries.size());
  if (wrong_sizes)
    std::printf("%d pipelines compiled at another subgroup size than they require\n",
                wrong_sizes);
  if (no_matrix)
    std::printf("%d matrix kernels without matrix instructions in their key loop\n", no_matrix);
  if (args.has("json")) {
    Json doc;
    doc["device"] = {{"name", dev.name},
                     {"driver", dev.driver},
                     {"subgroup_size", dev.subgroup_size},
                     {"subgroup_kernels", dev.subgroup_shuffle},
                     {"max_shared_memory", dev.max_shared_memory}};
    doc["commit"] = FLASHVK_COMMIT;
    doc["command"] = "flashvk pipelines";
    doc["statistics"] = statistics;
    doc["calls"] = total;
    doc["compile_seconds"] = seconds;
    if (args.has("skip-listed")) doc["skipped_as_listed"] = skipped.size();
    doc["pipelines"] = list;
    write_text(args.text("json"), doc.dump(1) + "\n");
  }
  return args.flag("check") && (spills > 0 || wrong_sizes > 0 || no_matrix > 0) ? 1 : 0;
}

}  // namespace flashvk::cli
