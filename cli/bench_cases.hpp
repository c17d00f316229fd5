#pragma once
// flashvk bench's parts, for the files that make it up: the cases and what a run records
// (this header), the suites (bench_suites.cpp), the timed rounds (bench_run.cpp), the table and
// the JSON (bench_output.cpp), and the command's options (bench.cpp).
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "args.hpp"
#include "flashvk.hpp"
#include "flashvk/tools/peak.hpp"

namespace flashvk::cli {

// One shape, and the variants to time on it.
struct Case {
  const char* kind;  // "prefill", "window", "decode", "modifier" or "custom"
  Dims dims;
  Modifiers mods;   // causal, the window, ...
  Storage storage;  // Q's, K's and V's
  std::vector<Variant> variants;
  // Runs in the rounds of the case before it, on the same inputs (a group: --suite modifiers, or
  // a --kv-dtype list, each case in its own storage), so that each of its variants has a run of
  // the group's first case, its base, in every round.
  bool with_previous = false;
  bool fp16_arithmetic = false;  // ExecutionHints::fp16_arithmetic for its fused variants
};

// One timed run, and the FMA calibration around it (--peak): the mean of one just before and
// one just after.
struct Run {
  double ms = 0, peak_gflops = 0;
};

struct Row {
  const Case* c;
  Variant variant;
  std::vector<Run> runs;
  double ms = 0, gflops = 0, max_err = -1;
  double peak_gflops = 0, peak_fraction = 0;  // medians over the runs (--peak)
  double vs_flash2 = 0;  // median over rounds of time / flash2's time in the same round
  double vs_base = 0;  // the same over the base's time (the same variant in the group's first case)
  uint64_t bytes = 0;
  TileLayout layout = TileLayout::shared;               // the kernel that ran
  uint32_t block_rows = 0, block_keys = 0, splits = 1;  // and its tiling
  uint32_t group_rows = 0;  // the matrix kernel's rows a group, where --group-rows asked
  bool fp16_arithmetic = false;                         // --fp16-arithmetic applied to it
  bool emulated = false;  // the matrix kernel without matrix units (MatrixApi::emulated)
  // Its slowest run's time over its fastest's (runs that timed nothing left out; 0 if none).
  double spread() const {
    double lo = 0, hi = 0;
    for (const Run& run : runs)
      if (run.ms > 0) {
        lo = lo > 0 ? std::min(lo, run.ms) : run.ms;
        hi = std::max(hi, run.ms);
      }
    return lo > 0 ? hi / lo : 0;
  }
};

struct Options {
  int repeat = 3;
  double min_time = 0;    // seconds of runs each variant gathers, in extra rounds if need be
  int flashd_rounds = 0;  // rounds flashd and flash2 run at least
  bool check = false;
  bool flush = true;    // fill a cache-sized buffer before every timed run
  double gpu_warm = 0;  // seconds of busy work before each shape (GPU clocks up from idle)
  TileLayout layout = TileLayout::automatic;
  bool fp16_arithmetic = false;
  uint32_t block_rows = 0, block_keys = 0, splits = 0;  // 0: the engine's choice
  uint32_t group_rows = 0;                              // the same
  std::optional<DevicePeak> peak;
  bool vs_base = false;  // the "vs base" column (--suite modifiers, --kv-dtype lists)
  int mask_width = 6;    // the mask column's: its longest text
  int dtype_width = 9;   // the dtype column's
  std::string matrix_skip;  // FLASHVK_MATRIX_SKIP: matrix phases left out (times only)
};

struct Inputs {
  HostTensor q, k, v;
};

struct Clock {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  size_t done = 0, total = 0;
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

constexpr double kSuiteMinTime = 0.5;
constexpr double kUnsteadySpread = 2;  // a row's spread() past which bench says so
constexpr int kSuiteFlashdRounds = 9;
constexpr int kModifierRounds = 9;  // --suite modifiers: each ratio to the base a median of 9 pairs

// bench_suites.cpp
Dims make_dims(uint32_t b, uint32_t h, uint32_t hkv, uint32_t nq, uint32_t nk, uint32_t d,
               uint32_t dv);
/// FLOPs a case computes: 4 d per visible query-key pair.
double case_flops(const Case& c);
Inputs make_inputs(const Dims& d);
/// The prefill, window and decode sets of docs/performance.md (--suite standard).
std::vector<Case> standard_suite();
/// Every kernel the engine picks on its own on a GPU (`flashvk pipelines --suite kernels`):
/// prefill and decode, fp32 and fp16 storage, fp16 arithmetic, K and V in each block format, d = 64,
/// 80, 96, 128 and 256, without modifiers, causal, and with softcap, ALiBi, sinks and a window.
std::vector<Case> kernel_suite();
/// The shape of the options once per storage of K and V that --kv-dtype lists.
std::vector<Case> custom_cases(const Args& args);
/// --suite modifiers: causal attention of the shape, then each modifier's examples.
std::vector<Case> modifier_suite(const Args& args);

// bench_run.cpp
/// The engine's parameters for one variant of a case, with the options' hints.
AttentionParams case_params(const Case& c, Variant variant, const Options& o);
/// Builds the variant's pipeline on a problem of the case's kind (see bench_run.cpp).
void warm_up(Context& ctx, const Case& c, const AttentionParams& params);
/// Every case's variants in rounds, printing each group's rows as they finish.
std::vector<Row> run_cases(Context& ctx, const std::vector<Case>& cases, const Options& o);

// bench_output.cpp
/// The mask column: the modifiers, or "full".
std::string mask_text(const Case& c);
void print_header(const Options& o);
void print_row(const Row& r, const Options& o);
/// The table's time: "45.12 us" below a millisecond, "2.410 ms" from one up.
std::string time_text(double ms);
/// Progress on stderr, on a terminal only: one line, rewritten in place at each run.
void progress(size_t done, size_t total, const Case& c, Variant v, int round, double elapsed_s);
/// docs/formats.md's bench JSON.
std::string json(const DeviceInfo& dev, const Options& o, const std::vector<Row>& rows);

}  // namespace flashvk::cli
