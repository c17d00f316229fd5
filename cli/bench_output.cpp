// flashvk bench: the table on stdout, progress on stderr, and the JSON.
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "bench.hpp"
#include "commit.hpp"

#include "bench_cases.hpp"

namespace flashvk::cli {

std::string tiling_text(Variant variant, TileLayout layout, uint32_t block_rows,
                        uint32_t block_keys, uint32_t splits, uint32_t group_rows) {
  std::string s = tile_layout_name(layout);
  if (block_keys == 0) return s;  // naive: no tiles
  // Appended piece by piece: GCC 12's -O3 flags " " + std::string with a false -Wrestrict.
  s += ' ';
  s += std::to_string(block_rows);
  s += 'x';
  s += std::to_string(block_keys);
  if (variant_info(variant).splits_keys) {
    s += ", ";
    s += std::to_string(splits);
    s += splits == 1 ? " split" : " splits";
  }
  if (group_rows) {
    s += ", ";
    s += std::to_string(group_rows);
    s += " rows a group";
  }
  return s;
}

namespace {

using Json = nlohmann::ordered_json;

std::string tiles_text(const Row& r) {
  return tiling_text(r.variant, r.layout, r.block_rows, r.block_keys, r.splits, r.group_rows) +
         (r.emulated ? ", emulated" : "") + (r.fp16_arithmetic ? ", fp16 arithmetic" : "");
}

std::vector<double> run_list(const std::vector<Run>& runs, double Run::*field) {
  std::vector<double> out;
  for (const Run& r : runs) out.push_back(r.*field);
  return out;
}

}  // namespace

// The mask column: the modifiers, or "full".
std::string mask_text(const Case& c) {
  std::string mods = modifier_text(c.mods);
  return mods.empty() ? "full" : mods;
}

// To 10 ns below a millisecond and to 1 us above: decoding's 45 and 54 us must not both read
// 0.05 ms.
std::string time_text(double ms) {
  char buf[32];
  if (ms < 1.0)
    std::snprintf(buf, sizeof buf, "%.2f us", ms * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

void print_header(const Options& o) {
  std::printf("%-8s %-*s %6s %6s %5s %-*s %-8s %13s %9s %s%9s%s %11s%s  %s\n", "kind",
              o.dtype_width, "dtype", "Nq", "Nk", "d", o.mask_width, "mask", "variant", "time",
              "GFLOP/s", o.peak ? " of peak " : "", "vs flash2", o.vs_base ? "  vs base" : "",
              "memory MiB", o.check ? "  max error" : "", "tiles");
}

void print_row(const Row& r, const Options& o) {
  const Dims& d = r.c->dims;
  std::printf("%-8s %-*s %6u %6u %5u %-*s %-8s %13s %9.2f", r.c->kind, o.dtype_width,
              storage_text(r.c->storage).c_str(), d.nq, d.nk, d.d, o.mask_width,
              mask_text(*r.c).c_str(), variant_name(r.variant), time_text(r.ms).c_str(), r.gflops);
  if (o.peak) std::printf(" %7.1f%% ", 100.0 * r.peak_fraction);
  auto ratio = [](double x) {
    if (x > 0)
      std::printf(" %8.3f", x);
    else
      std::printf(" %8s", "-");
  };
  ratio(r.vs_flash2);
  if (o.vs_base) ratio(r.vs_base);
  std::printf(" %11.2f", double(r.bytes) / (1 << 20));
  if (r.max_err >= 0) std::printf("  %9.2e", r.max_err);
  std::printf("  %s\n", tiles_text(r).c_str());
  std::fflush(stdout);
}

// A file or a pipe gets the table alone, not a line per run.
void progress(size_t done, size_t total, const Case& c, Variant v, int round, double elapsed_s) {
  if (!isatty(2)) return;
  std::fprintf(stderr, "\r\033[K[%zu/%zu] %s %s N=%u/%u d=%u %s %s round %d  (%.0f s so far)",
               done + 1, total, c.kind, variant_name(v), c.dims.nq, c.dims.nk, c.dims.d,
               storage_text(c.storage).c_str(), mask_text(c).c_str(), round + 1, elapsed_s);
  std::fflush(stderr);
}

// docs/formats.md's bench JSON, keys in that order.
std::string json(const DeviceInfo& dev, const Options& o, const std::vector<Row>& rows) {
  Json j;
  j["device"] = dev.name;
  j["driver"] = dev.driver;
  j["commit"] = FLASHVK_COMMIT;
  if (o.peak)
    j["peak"] = {{"fma_gflops", o.peak->fma_gflops},
                 {"bandwidth_gbs", o.peak->bandwidth_gbs},
                 {"coopmat_gflops", o.peak->coopmat_gflops}};
  j["runs"] = o.repeat;
  j["min_time"] = o.min_time;
  j["flashd_rounds"] = o.flashd_rounds;
  j["cache_flush"] = o.flush;
  j["gpu_warm"] = o.gpu_warm;
  if (!o.matrix_skip.empty()) j["matrix_skip"] = o.matrix_skip;
  Json results = Json::array();
  for (const Row& r : rows) {
    const Dims& d = r.c->dims;
    Json x;
    x["kind"] = r.c->kind;
    x["variant"] = variant_name(r.variant);
    x["batch"] = d.batch;
    x["heads"] = d.heads;
    x["kv_heads"] = d.kv_heads;
    x["nq"] = d.nq;
    x["nk"] = d.nk;
    x["d"] = d.d;
    x["dv"] = d.dv;
    for (const auto& [name, value] : modifier_json(r.c->mods)) x[name] = Json::parse(value);
    x["dtype"] = dtype_name(r.c->storage.q);
    x["kv_dtype"] = dtype_name(r.c->storage.k);
    x["ms"] = r.ms;
    x["gflops"] = r.gflops;
    x["device_bytes"] = r.bytes;
    x["tile_layout"] = tile_layout_name(r.layout);
    x["block_rows"] = r.block_rows;
    if (r.group_rows) x["group_rows"] = r.group_rows;
    x["block_keys"] = r.block_keys;
    x["splits"] = r.splits;
    x["fp16_arithmetic"] = r.fp16_arithmetic;
    if (o.peak) {
      x["peak_gflops"] = r.peak_gflops;
      x["peak_fraction"] = r.peak_fraction;
    }
    if (r.vs_flash2 > 0) x["vs_flash2"] = r.vs_flash2;
    if (r.vs_base > 0) x["vs_base"] = r.vs_base;
    x["runs_ms"] = run_list(r.runs, &Run::ms);
    if (o.peak) x["runs_peak_gflops"] = run_list(r.runs, &Run::peak_gflops);
    if (r.max_err >= 0) x["max_err"] = r.max_err;
    results.push_back(std::move(x));
  }
  j["results"] = std::move(results);
  return j.dump(1) + "\n";
}

}  // namespace flashvk::cli
