#include "bench.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "bench_cases.hpp"
#ifdef FLASHVK_CLI_FLEX
#include "flashvk/flex.hpp"
#endif

namespace flashvk::cli {

Context open_device(const Args& args, const std::string& matrix_skip) {
  ContextOptions options;
  options.matrix_skip = matrix_skip;
  options.device = static_cast<int>(args.integer("device", -1, 0, 1 << 20));
  options.matrix_api = parse_matrix_api(args.text("matrix-api", "auto"));
  options.pipeline_cache_path = default_pipeline_cache();
  Context ctx = Context::create(options);
#ifdef FLASHVK_CLI_FLEX
  flex::enable(ctx);
#endif
  return ctx;
}

namespace {

const char* kBenchHelp = R"(usage: flashvk bench [options]

Times each variant on random inputs with GPU timestamp queries, after a warm-up on the same keys
with at most 512 query rows (which builds the pipeline). The variants of a shape run in --repeat
rounds, each variant once per round, so that they all see the same drift of the machine's speed;
a variant's time is the median of its runs, and "vs flash2" the median, over rounds, of its time
over flash2's in the same round. Before every run a 128 MiB buffer is filled on the device, so
that the inputs come from device memory and not from a cache warmed by the run before (a decode
step finds its KV cache cold). GFLOP/s counts 4 * B * H * Nq * Nk * d, only of the pairs
attention computes (inside the causal limit and the window, and not hidden by a mask; a
--mask-mod file's hidden pairs are counted, the host cannot run GLSL). Memory
is what the call allocated on the device: outputs and scratch (S for naive); the inputs are not
counted.

options:
  --variant LIST|all  one variant, several separated by commas (flash2,flashd), or all six
                      (default all)
  --batch B --heads H --kv-heads Hk --nq N --nk N --d D --dv D
                      shape (default 1, 8, H, 1024, Nq, 64, d)
MODIFIERS  --layout auto|shared|registers|coopmat|lanes|blocks
                      where the fused kernels keep K/V tiles (default auto; coopmat: the
                      tile products on the matrix units, fp16 Q; lanes: splitkv's
                      decoding kernel, a key's head dimension over a few lanes, with
                      --variant splitkv; blocks: GPUs without matrix units, 4-row blocks
                      of S and O per invocation from vector reads; the last column,
                      tiles, names the layout that ran, its query rows per workgroup x keys
                      per tile and, for splitkv, its number of key chunks)
  --fp16-arithmetic   fp16 products in the fused variants (register blocks, or the matrix
                      units), summed in fp32 every 8; needs shaderFloat16 (`flashvk devices`);
                      naive runs fp32 (the tiles column says which rows ran it)
  --block-rows N      invocations per workgroup (default: the engine's choice; with register
                      tiles a multiple of the subgroup size, each invocation working on R rows;
                      coopmat: query rows, 64, 128 (twice the groups, each K/V tile staged
                      once for them all), or 32 to split each row block's head dims over two
                      groups)
  --group-rows N      coopmat: query rows each subgroup multiplies (default 16, a matrix's;
                      32: each K and V matrix read from shared memory feeds two products,
                      d <= 128; 128 rows a workgroup, 64 past d = 64)
  --block-keys N      keys per K/V tile (shared tiles: at most what fits in shared memory;
                      register tiles: the subgroup size; coopmat: 16, 32 or 64)
  --splits N          splitkv's number of key chunks (default: from the device); these three
                      tune one shape: the tiles column shows what ran
  --suite standard    the fixed set of docs/performance.md instead of one shape: prefill
                      (B=1 H=8 N=512..4096, d=64 and 128, full and causal), a sliding window
                      (N=16384 d=64, window 1023,0, beside causal at 16384) and decode
                      (Nq=1 H=32 Hkv=8 Nk=4096..65536 d=128), fp32 and fp16 (decode also
                      with q8_0 K and V)
  --suite modifiers   what each modifier costs: one shape (default B=1 H=8 N=2048 d=64,
                      --variant flash2,flashd; the shape options, --variant, --dtype,
                      --kv-dtype, --layout and the tiling options change it) in causal
                      attention, its base, then with softcap 30, ALiBi (max_bias 8), a sink
                      per head, an additive mask of the causal pattern in --causal's place,
                      and a sparse one (the first Nk/32 keys and a window of Nk/8: tiles it
                      hides are skipped), all in the same rounds; "vs base" is the median
                      over rounds of a row's time over its variant's base run in the same
                      round
  --peak              measure the device's FMA throughput and read bandwidth with calibration
                      shaders first, then the FMA throughput again around the runs (at most
                      once a second: short runs share their probes), and report each variant
                      as the median of its runs' fractions of the mean of the probes just
                      before and just after it; on devices with cooperative matrices also
                      their fp16 peak, which the cooperative_matrix rows are a fraction of
  --repeat N          rounds: timed runs per variant (default 3; 1 with --suite standard, 9
                      with --suite modifiers)
  --min-time S        more rounds for short runs: a variant whose first run is shorter than
                      S / --repeat seconds runs ceil(S / first run) rounds, at most 100, and
                      flash2 as many as the most (default 0; 0.5 with --suite standard)
  --flashd-rounds N   flashd and flash2 run at least N rounds, so that their ratio, which
                      FLASH-D's target names, is a median of N pairs (default 0; 9 with
                      --suite standard: on a noisy machine the median of 3 pairs misses by a
                      tenth)
  --warm-cache        skip the cache flush before each run
  --gpu-warm S        before each shape's timed runs, keep the device busy for S seconds
                      (the FMA calibration, back to back), so that a GPU has raised its clocks
                      from idle: an H100 ran its first seconds of work about 4x slower
                      (default 1 on GPUs, 0 on CPU drivers)
  --check             also report the max error against the float64 reference (slow)
  --decode-loop       instead, a decode loop as an app runs it: a KV cache of --nk tokens
                      (default 4096; H 32, Hkv 8, d 128 unless given; --variant one,
                      default splitkv), filled one token a step by a recording made once
                      that appends the token's K and V and attends over the cache, submitted
                      every step after set_position(). Reports the host's time per step
                      (set_position + vkQueueSubmit), the GPU's (timestamps around the
                      recording), beside one attention() over the full cache, and the Vulkan
                      objects the engine created after the first step (exit status 1 if any)
  --rope interleaved|half
                      with --decode-loop: rotate each K as it is appended, and Q
  --json FILE         write every figure as JSON
  --device N          Vulkan device index
)" FLASHVK_MATRIX_API_HELP R"(
FLASHVK_MATRIX_SKIP=LIST (a timing diagnostic: docs/performance.md) builds the matrix kernels
with phases left out: staging, scores, softmax, pv (wrong results), prefetch, queries (the same
results, data held otherwise).

examples:
  flashvk bench --nq 512 --d 64 --causal --repeat 5 --json bench.json
  flashvk bench --suite standard --peak --json suite.json
  flashvk bench --suite modifiers --dtype f16
  flashvk bench --variant flash2 --nq 2048 --layout shared --block-rows 128 --block-keys 32
  flashvk bench --decode-loop --dtype f16 --rope interleaved
)";

}  // namespace

int cmd_bench(const std::vector<std::string>& argv) {
  if (std::find(argv.begin(), argv.end(), "--help") != argv.end())
    return std::cout << with_modifier_help(kBenchHelp), 0;
  Args args(
      argv,
      with_modifiers(
          {"variant",   "batch",  "heads",      "kv-heads",      "nq",     "nk",       "d",
           "dv",        "repeat", "min-time",   "flashd-rounds", "json",   "device",   "matrix-api",
           "suite",     "layout", "block-rows", "block-keys",    "splits", "gpu-warm", "rope",
           "group-rows"}),
      with_modifier_flags({"check", "peak", "warm-cache", "decode-loop", "fp16-arithmetic"}));
  if (args.has("json")) check_writable(args.text("json"));  // before a long run, not after
  if (args.flag("decode-loop")) return run_decode_loop(args);
  if (args.has("rope"))
    throw UsageError{"--rope is for --decode-loop (bench times attention without RoPE)"};
  std::vector<Case> cases;
  std::string suite = args.text("suite");
  if (suite == "standard") {
    for (const std::string& shape_option :
         with_modifiers({"variant", "batch", "heads", "kv-heads", "nq", "nk", "d", "dv",
                         "block-rows", "block-keys", "splits", "group-rows"}))
      if (args.has(shape_option))
        throw UsageError{
            std::string("--suite standard fixes its shapes, storages and modifiers and runs the "
                        "engine's own tiles; drop --") +
            shape_option};
    if (args.flag("causal")) throw UsageError{"--suite standard fixes its shapes; drop --causal"};
    cases = standard_suite();
  } else if (suite == "modifiers") {
    if (args.flag("causal"))
      throw UsageError{"--suite modifiers runs causal attention as its base; drop --causal"};
    for (const std::string& option : modifier_option_names())
      if (args.has(option))
        throw UsageError{"--suite modifiers times its own modifiers on causal attention; drop --" +
                         option};
    cases = modifier_suite(args);
  } else if (args.has("suite")) {
    throw UsageError{"--suite must be 'standard' or 'modifiers', got '" + suite + "'"};
  } else {
    cases = custom_cases(args);
  }
  bool standard = suite == "standard";
  Options o;
  o.repeat = static_cast<int>(args.integer("repeat",
                                           standard               ? 1
                                           : suite == "modifiers" ? kModifierRounds
                                                                  : 3,
                                           1, 1000));
  o.min_time = args.number("min-time", standard ? kSuiteMinTime : 0);
  if (o.min_time < 0) throw UsageError{"--min-time must be at least 0 seconds"};
  o.flashd_rounds =
      static_cast<int>(args.integer("flashd-rounds", standard ? kSuiteFlashdRounds : 0, 0, 1000));
  o.vs_base =
      std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.with_previous; });
  for (const Case& c : cases) {
    o.mask_width = std::max(o.mask_width, int(mask_text(c).size()));
    o.dtype_width = std::max(o.dtype_width, int(storage_text(c.storage).size()));
  }
  o.check = args.flag("check");
  o.flush = !args.flag("warm-cache");
  o.gpu_warm = args.number("gpu-warm", -1);
  if (args.has("gpu-warm") && o.gpu_warm < 0)
    throw UsageError{"--gpu-warm must be at least 0 seconds"};
  o.layout = parse_layout(args.text("layout", "auto"));
  o.fp16_arithmetic = args.flag("fp16-arithmetic");
  o.block_rows = static_cast<uint32_t>(args.integer("block-rows", 0, 1, 1 << 16));
  o.group_rows = static_cast<uint32_t>(args.integer("group-rows", 0, 1, 1 << 16));
  o.block_keys = static_cast<uint32_t>(args.integer("block-keys", 0, 1, 1 << 16));
  o.splits = static_cast<uint32_t>(args.integer("splits", 0, 1, 1 << 16));

  const char* skip = std::getenv("FLASHVK_MATRIX_SKIP");  // a timing diagnostic
  o.matrix_skip = skip ? skip : "";
  Context ctx = open_device(args, o.matrix_skip);
  if (o.gpu_warm < 0) o.gpu_warm = ctx.device().type == "cpu" ? 0.0 : 1.0;
  if (o.layout == TileLayout::cooperative_matrix && ctx.handles().matrix_api == MatrixApi::none)
    throw Error(
        "--layout coopmat needs cooperative matrices (VK_KHR_cooperative_matrix or "
        "VK_NV_cooperative_matrix with fp16 products into fp32 in one of the kernels' shapes, or "
        "their emulation, "
        "which needs fp16 storage); " +
        ctx.device().name + " has none (see `flashvk devices`)");
  // Layouts and tile sizes (and fp16 arithmetic) the device or a variant cannot run are refused
  // before any output, by the engine's message (the first case, and those of its group: --suite
  // modifiers): `--layout lanes` over the default variants, which only splitkv runs, was refused
  // after the table's header.
  if (o.layout != TileLayout::automatic || o.block_rows || o.group_rows || o.block_keys ||
      o.fp16_arithmetic)
    for (size_t i = 0; i < cases.size() && (i == 0 || cases[i].with_previous); ++i)
      for (Variant v : cases[i].variants) warm_up(ctx, cases[i], case_params(cases[i], v, o));
  std::printf("device: %s (driver %s), median of %s%d\n", ctx.device().name.c_str(),
              ctx.device().driver.c_str(), o.min_time > 0 || o.flashd_rounds > 0 ? "at least " : "",
              o.repeat);
  if (args.flag("peak")) {
    std::fprintf(stderr, "measuring the device's peak ...\n");
    o.peak = measure_peak(ctx);
    std::printf("peak: %.2f GFLOP/s fp32 FMA, %.2f GB/s read bandwidth", o.peak->fma_gflops,
                o.peak->bandwidth_gbs);
    if (o.peak->coopmat_gflops > 0)
      std::printf(", %.2f GFLOP/s fp16 cooperative matrix", o.peak->coopmat_gflops);
    std::printf("\n");
  }
  if (cases.size() == 1 || o.vs_base) {  // one shape (a group's cases share it)
    const Dims& d = cases[0].dims;
    std::printf("shape: B=%u H=%u Hkv=%u Nq=%u Nk=%u d=%u dv=%u\n", d.batch, d.heads, d.kv_heads,
                d.nq, d.nk, d.d, d.dv);
  }
  if (!o.matrix_skip.empty())
    std::printf(
        "FLASHVK_MATRIX_SKIP=%s: the matrix kernel leaves these phases out (a timing "
        "diagnostic: staging, scores, softmax or pv make its results wrong)\n",
        o.matrix_skip.c_str());
  std::printf("\n");
  std::vector<Row> rows = run_cases(ctx, cases, o);
  if (args.has("json")) write_text(args.text("json"), json(ctx.device(), o, rows));
  return 0;
}

}  // namespace flashvk::cli
