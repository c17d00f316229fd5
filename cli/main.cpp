// flashvk: run attention on .npy files, trace a row, benchmark, list devices.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "args.hpp"
#include "bench.hpp"
#include "flashvk.hpp"
#include "flashvk/reference.hpp"
#include "flashvk/trace.hpp"
#include "npy.hpp"
#include "pipelines.hpp"

namespace flashvk::cli {
namespace {

const char* kUsage = R"(flashvk: FlashAttention-family attention on Vulkan

usage: flashvk <command> [options]

commands:
  run       attention on Q, K, V .npy files, writing O (and LSE) as .npy
  trace     the per-key and per-tile state of one query row, as JSON
  bench     time the variants on random inputs
  devices   list the Vulkan devices and their limits
  pipelines what the driver compiles for a call: registers, spills, occupancy

`flashvk <command> --help` shows each command's options and examples.
)";

const char* kRunHelp = R"(usage: flashvk run --q Q.npy --k K.npy --v V.npy --out O.npy [options]

Computes O = softmax(scale * Q K^T) V. Shapes: Q [B, H, Nq, d], K [B, Hkv, Nk, d],
V [B, Hkv, Nk, dv] (or [Nq, d] / [H, Nq, d]); H must be a multiple of Hkv.
Inputs are little-endian float32 or float16 .npy; O is float32 with the rank of Q.

options:
  --lse FILE          also write the log-sum-exp of each row, [B, H, Nq]
  --variant NAME      naive, online, flash1, flash2, flashd or splitkv
                      (default: splitkv when a KV head has at most 16 query rows
                      and Nk >= 1024, else flash2)
  --scale S           score scale (default 1/sqrt(d))
  --splits N          splitkv: number of key chunks (default: from the device)
  --layout auto|shared|registers|coopmat|lanes|blocks
                      where the fused kernels keep K/V tiles (default auto: see
                      docs/engine.md; lanes: splitkv's decoding kernel for GPUs; blocks:
                      GPUs without matrix units); the line
                      printed at the end names what ran
  --block-rows N --block-keys N --group-rows N
                      invocations per workgroup, keys per tile and (coopmat) query rows a
                      subgroup multiplies (default: the engine's; `flashvk bench` with the
                      same options times them)
  --fp16-arithmetic   fp16 products (register blocks, or the matrix units), summed in fp32
                      every 8 products: faster where fp16 math is (phones), within the
                      bound of docs/algorithms.md; needs shaderFloat16 (`flashvk devices`)
  --rope none|interleaved|half   rotate Q and K first (default none)
  --rope-base B       RoPE base (default 10000)
MODIFIERS  --device N          Vulkan device index (see `flashvk devices`)
)" FLASHVK_MATRIX_API_HELP R"(
example:
  flashvk run --q assets/sample/q.npy --k assets/sample/k.npy --v assets/sample/v.npy \
              --out o.npy --lse lse.npy --variant flashd --causal
)";

const char* kTraceHelp =
    R"(usage: flashvk trace --q Q.npy --k K.npy --v V.npy --row R --out trace.json [options]

Records, on the GPU, what the chosen variant holds for one query row after every key (the
seeds' per-key loop) and after every tile (the tiled kernel), plus the final output.

options:
  --row R             query row (required)
  --batch b --head h  which (batch, head) the row is in (default 0, 0)
  --variant NAME      naive, online, flash1, flash2, flashd or splitkv (default flashd)
  --scale S  --device N   as for `run`
MODIFIERS
example:
  flashvk trace --q assets/sample/q.npy --k assets/sample/k.npy --v assets/sample/v.npy \
                --row 5 --variant flashd --out trace.json
)";

const char* kDevicesHelp = R"(usage: flashvk devices

Lists the Vulkan devices the loader finds, with the limits flashvk uses, and marks the default.
)";

[[noreturn]] void usage_fail(const std::string& message) {
  throw UsageError{message};
}

std::vector<std::string> tail(int argc, char** argv) {
  return std::vector<std::string>(argv + 2, argv + argc);
}

bool wants_help(const std::vector<std::string>& args) {
  return std::find_if(args.begin(), args.end(), [](const std::string& a) {
           return a == "--help" || a == "-h";
         }) != args.end();
}

Variant variant_option(const Args& args, const std::string& fallback) {
  try {
    return parse_variant(args.text("variant", fallback));
  } catch (const Error& e) {
    usage_fail(std::string("--variant: ") + e.what());
  }
}

struct Inputs {
  HostTensor q, k, v;
  Dims dims;
};

Inputs read_inputs(const Args& args) {
  Inputs in{npy::read(args.required("q"), "Q"),
            npy::read(args.required("k"), "K"),
            npy::read(args.required("v"), "V"),
            {}};
  in.dims = check_shapes(in.q.shape, in.k.shape, in.v.shape);
  return in;
}

AttentionParams attention_options(const Args& args) {
  AttentionParams p;
  if (args.has("scale")) p.scale = static_cast<float>(args.number("scale", 0.0));
  p.hints.splits = static_cast<uint32_t>(args.integer("splits", 0, 1, 4096));
  p.hints.tile_layout = parse_layout(args.text("layout", "auto"));
  p.hints.fp16_arithmetic = args.flag("fp16-arithmetic");
  p.hints.block_rows = static_cast<uint32_t>(args.integer("block-rows", 0, 1, 1 << 16));
  p.hints.group_rows = static_cast<uint32_t>(args.integer("group-rows", 0, 1, 1 << 16));
  p.hints.block_keys = static_cast<uint32_t>(args.integer("block-keys", 0, 1, 1 << 16));
  try {
    p.rope = parse_rope(args.text("rope", "none"));
  } catch (const Error& e) {
    usage_fail(std::string("--rope: ") + e.what());
  }
  p.rope_base = args.number("rope-base", 10000.0, true);
  if (p.rope_base <= 1.0) usage_fail("--rope-base must be greater than 1");
  modifier_options(args, p.mods);
  return p;
}

// The fastest correct variant for the shape (see docs/performance.md): Flash-Decoding when
// there are few query rows per KV head and many keys, else FlashAttention-2.
Variant default_variant(const Dims& d) {
  uint64_t rows = uint64_t(d.heads / d.kv_heads) * d.nq;
  return rows <= 16 && d.nk >= 1024 ? Variant::splitkv : Variant::flash2;
}

int cmd_run(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return std::cout << with_modifier_help(kRunHelp), 0;
  Args args(argv,
            with_modifiers({"q", "k", "v", "out", "lse", "variant", "scale", "splits", "rope",
                            "rope-base", "device", "matrix-api", "layout", "block-rows",
                            "block-keys", "group-rows"}),
            with_modifier_flags({"fp16-arithmetic"}));
  std::string out_path = args.required("out");
  AttentionParams params = attention_options(args);
  Storage storage = storage_options(args, "run");
  if (args.has("variant")) params.variant = variant_option(args, "");
  params.want_lse = args.has("lse");
  Inputs in = read_inputs(args);
  if (!args.has("variant")) params.variant = default_variant(in.dims);
  Context ctx = open_device(args);
  auto start = std::chrono::steady_clock::now();
  HostAttentionResult r = attention(ctx, in.q, in.k, in.v, params, storage);
  double wall =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  npy::write(out_path, r.out);
  if (params.want_lse) npy::write(args.required("lse"), r.lse);
  std::string tiles = tiling_text(params.variant, r.tile_layout, r.block_rows, r.block_keys,
                                  r.splits, params.hints.group_rows ? r.group_rows : 0);
  if (r.tile_layout == TileLayout::cooperative_matrix && !on_matrix_units(ctx.handles().matrix_api))
    tiles += ", emulated";
  std::string mods = params_text(params);
  if (!mods.empty()) tiles += ", " + mods;
  std::fprintf(stderr, "flashvk: %s (%s, %s) on %s: O %s in %.3f ms GPU, %.1f ms total\n",
               variant_name(params.variant), storage_text(storage).c_str(), tiles.c_str(),
               ctx.device().name.c_str(), shape_string(r.out.shape).c_str(), r.gpu_ms, wall);
  return 0;
}

int cmd_trace(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return std::cout << with_modifier_help(kTraceHelp), 0;
  Args args(
      argv,
      with_modifiers({"q", "k", "v", "out", "row", "batch", "head", "variant", "scale", "device"}),
      with_modifier_flags({}));
  std::string out_path = args.required("out");
  if (!args.has("row")) usage_fail("missing required option --row");
  AttentionParams params;
  if (args.has("scale")) params.scale = static_cast<float>(args.number("scale", 0.0));
  modifier_options(args, params.mods);
  params.variant = variant_option(args, "flashd");
  Storage storage = storage_options(args, "trace");
  auto row = static_cast<uint32_t>(args.integer("row", 0, 0, INT32_MAX));
  auto batch = static_cast<uint32_t>(args.integer("batch", 0, 0, INT32_MAX));
  auto head = static_cast<uint32_t>(args.integer("head", 0, 0, INT32_MAX));
  Inputs in = read_inputs(args);
  if (row >= in.dims.nq)
    usage_fail("--row " + std::to_string(row) + " is out of range: Q has " +
               std::to_string(in.dims.nq) + " rows (0.." + std::to_string(in.dims.nq - 1) + ")");
  if (head >= in.dims.heads)
    usage_fail("--head " + std::to_string(head) + " is out of range: Q has " +
               std::to_string(in.dims.heads) + " heads");
  if (batch >= in.dims.batch)
    usage_fail("--batch " + std::to_string(batch) + " is out of range: Q has batch " +
               std::to_string(in.dims.batch));
  Context ctx = open_device(args);
  Trace t = trace(ctx, in.q, in.k, in.v, params, batch, head, row, storage);
  write_text(out_path, trace_to_json(t));
  std::fprintf(stderr,
               "flashvk: traced row %u of (batch %u, head %u) with %s: %u keys, %zu tiles of %u\n",
               row, batch, head, variant_name(params.variant), t.keys, t.tiles.size(), t.tile_size);
  return 0;
}

int cmd_devices(const std::vector<std::string>& argv) {
  if (wants_help(argv)) return std::cout << kDevicesHelp, 0;
  Args args(argv, {}, {});
  std::vector<DeviceInfo> devices = list_devices();
  if (devices.empty()) throw Error("no Vulkan device found");
  uint32_t chosen = default_device(devices);  // Context::create's choice
  for (const DeviceInfo& d : devices) {
    bool is_default = d.index == chosen;
    std::printf("%u: %s (%s)%s\n", d.index, d.name.c_str(), d.type.c_str(),
                is_default ? "  [default]" : "");
    std::printf("   Vulkan %u.%u.%u, driver %s\n", VK_API_VERSION_MAJOR(d.api_version),
                VK_API_VERSION_MINOR(d.api_version), VK_API_VERSION_PATCH(d.api_version),
                d.driver.c_str());
    std::string sizes = d.subgroup_size_control
                            ? ", may require " + std::to_string(d.min_subgroup_size) + " to " +
                                  std::to_string(d.max_subgroup_size)
                            : ", cannot require a size";
    std::printf("   shared memory %u B, workgroup %u invocations, subgroup %u%s\n",
                d.max_shared_memory, d.max_workgroup_invocations, d.subgroup_size,
                sizes.c_str());
    std::printf("   storage buffer range %llu MiB, allocation %llu MiB, device memory %llu MiB\n",
                static_cast<unsigned long long>(d.max_storage_buffer_range >> 20),
                static_cast<unsigned long long>(d.max_allocation >> 20),
                static_cast<unsigned long long>(d.device_local_memory >> 20));
    std::string texels =
        d.texel_buffers ? std::to_string(d.max_texel_buffer_elements >> 20) + " Mi texels" : "no";
    std::printf("   fp16 storage %s, timestamps %s, subgroup shuffles %s, RGBA texel buffers %s\n",
                d.fp16_storage ? "yes" : "no", d.timestamps ? "yes" : "no",
                d.subgroup_shuffle ? "yes" : "no", texels.c_str());
    std::string matrices = matrix_api_name(d.matrix_api);
    if (d.matrix_api != MatrixApi::none) matrices += ", " + matrix_shape_name(d.matrix_shape);
    if (d.matrix_api == MatrixApi::khr && d.nv_cooperative_matrix) matrices += " (nv too)";
    if (d.nv_cooperative_matrix2) matrices += ", nv2 (--matrix-api nv2)";
    std::printf("   fp16 arithmetic %s, cooperative matrices (fp16 into fp32) %s\n",
                d.fp16_arithmetic ? "yes" : "no", matrices.c_str());
    std::printf("   pipeline statistics (flashvk pipelines) %s",
                d.pipeline_statistics ? "yes" : "no");
    if (d.registers_per_simd) std::printf(", %u registers a SIMD", d.registers_per_simd);
    std::printf("\n");
  }
  return 0;
}

int dispatch(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  std::string verb = argv[1];
  std::vector<std::string> rest = tail(argc, argv);
  if (verb == "run") return cmd_run(rest);
  if (verb == "pipelines") return cmd_pipelines(rest);
  if (verb == "trace") return cmd_trace(rest);
  if (verb == "bench") return cmd_bench(rest);
  if (verb == "devices") return cmd_devices(rest);
  usage_fail("unknown command '" + verb + "'; expected run, trace, bench or devices");
}

}  // namespace
}  // namespace flashvk::cli

int main(int argc, char** argv) {
  try {
    return flashvk::cli::dispatch(argc, argv);
  } catch (const flashvk::cli::UsageError& e) {
    std::fprintf(stderr, "flashvk: error: %s\n", e.message.c_str());
    return 2;
  } catch (const flashvk::Error& e) {
    std::fprintf(stderr, "flashvk: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashvk: error: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashvk: error: %s\n", e.what());
    return 1;
  }
}
