// flashvk bench: the timed rounds, the cache flush and the FMA calibration around them, and the
// medians and ratios of the runs.
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>

#include "flashvk/reference.hpp"

#include "bench_cases.hpp"

namespace flashvk::cli {

namespace {

// Of an even count, the mean of the middle two: the upper one alone made a pair's median its
// worse run.
double median(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : 0.5 * (x[h - 1] + x[h]);
}

// Against the float64 reference on the inputs, or, with K and V stored otherwise than Q
// (--kv-dtype), on the values K and V hold once stored, so that the error is the kernel's.
double check_error(Context& ctx, const Inputs& in, const AttentionParams& params,
                   const Storage& storage) {
  HostAttentionResult r = attention(ctx, in.q, in.k, in.v, params, storage);
  reference::Result ref = storage.own_kv()
                              ? reference::direct(in.q, stored_values(in.k, storage.k),
                                                  stored_values(in.v, storage.v), params)
                              : reference::direct(in.q, in.k, in.v, params);
  double err = 0;
  for (size_t i = 0; i < ref.out.size(); ++i)
    err = std::max(err, std::abs(double(r.out.data[i]) - ref.out[i]));
  return err;
}

// The FMA calibration around the runs (--peak). The machine's speed drifts, so a run's peak is
// the mean of a probe just before it and one just after; short runs share their probes, one a
// second at most, so that calibrating does not take longer than the runs it calibrates.
class Calibration {
 public:
  explicit Calibration(Context& ctx) : probe_(ctx) {}
  void before(Row& row) {
    if (!last_ || since_.seconds() > kGapSeconds) take();
    row.runs.back().peak_gflops = *last_;
    pending_.push_back({&row, row.runs.size() - 1});
  }
  void after() {
    if (since_.seconds() > kGapSeconds) take();
  }
  void finish() {
    if (!pending_.empty()) take();
  }

 private:
  static constexpr double kGapSeconds = 1.0;
  void take() {
    double gflops = probe_.gflops();
    for (auto [row, i] : pending_)
      row->runs[i].peak_gflops = 0.5 * (row->runs[i].peak_gflops + gflops);
    pending_.clear();
    last_ = gflops;
    since_ = Clock{};
  }
  FmaProbe probe_;
  std::optional<double> last_;
  Clock since_;
  std::vector<std::pair<Row*, size_t>> pending_;
};

// What the timed runs need next to them: the cache flush and the FMA calibration.
struct Meters {
  std::optional<CacheFlush> flush;
  std::optional<FmaProbe> busy;  // --gpu-warm's work
  std::optional<Calibration> fma;
};

// Medians of a variant's runs; ratios are taken run by run, so that drift cancels: to flash2's
// runs on the same case, and to `base`'s (the same variant on the group's base case).
void summarise(Row& r, const Row* flash2, const Row* base, const Case& c) {
  std::vector<double> ms, peak, fraction, ratio, base_ratio;
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const Run& run = r.runs[i];
    ms.push_back(run.ms);
    peak.push_back(run.peak_gflops);
    if (run.ms > 0 && run.peak_gflops > 0)
      fraction.push_back(case_flops(c) / (run.ms * 1e6) / run.peak_gflops);
    if (flash2 && flash2->runs[i].ms > 0) ratio.push_back(run.ms / flash2->runs[i].ms);
    if (base && base->runs[i].ms > 0) base_ratio.push_back(run.ms / base->runs[i].ms);
  }
  r.ms = median(ms);
  r.gflops = r.ms > 0 ? case_flops(c) / (r.ms * 1e6) : 0;
  r.peak_gflops = median(peak);
  r.peak_fraction = median(fraction);
  r.vs_flash2 = median(ratio);
  r.vs_base = median(base_ratio);
}

// One timed run of `r`'s variant, the cache flushed before it and calibrated around it.
void time_run(Context& ctx, const Case& c, const Tensor* qkv, const Options& o, Meters& meters,
              Row& r) {
  r.runs.emplace_back();
  if (meters.fma) meters.fma->before(r);
  if (meters.flush) meters.flush->run();
  AttentionParams params = case_params(c, r.variant, o);
  AttentionResult res = attention(ctx, qkv[0], qkv[1], qkv[2], params);
  r.fp16_arithmetic = params.hints.fp16_arithmetic;
  if (meters.fma) meters.fma->after();
  r.runs.back().ms = res.gpu_ms;
  r.bytes = res.device_bytes;
  r.layout = res.tile_layout;
  r.block_rows = res.block_rows, r.block_keys = res.block_keys, r.splits = res.splits;
  r.group_rows = o.group_rows ? res.group_rows : 0;
  r.emulated = r.layout == TileLayout::cooperative_matrix &&
               !on_matrix_units(ctx.handles().matrix_api);
}

constexpr int kMaxRounds = 100;

// Rounds each variant runs: --repeat, or more for short runs until they add up to --min-time
// (judged by the first round), and for flashd and flash2 at least --flashd-rounds. flash2 runs
// as many as any other, so every ratio has its pair.
std::vector<int> rounds_per_row(const std::vector<Row>& rows, const Options& o) {
  std::vector<int> rounds;
  int most = o.repeat;
  for (const Row& r : rows) {
    double ms = std::max(r.runs.front().ms, 1e-3);
    double wanted = std::ceil(o.min_time * 1e3 / ms);
    rounds.push_back(
        std::clamp(int(std::min(wanted, 1e6)), o.repeat, std::max(o.repeat, kMaxRounds)));
    if (r.variant == Variant::flashd || r.variant == Variant::flash2)
      rounds.back() = std::max(rounds.back(), o.flashd_rounds);
    most = std::max(most, rounds.back());
  }
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].variant == Variant::flash2) rounds[i] = most;
  return rounds;
}

// Every variant of a group of cases on the same inputs (one case, --suite modifiers' cases, or a
// shape in each storage of a --kv-dtype list; qkv[g]: Q, K and V uploaded in group[g]'s storage),
// in rounds: each round runs each (case, variant) once, each first in turn, so that all of them
// see the same drift of the machine's speed, and their ratios are fair.
std::vector<Row> run_group(Context& ctx, const std::vector<const Case*>& group,
                           const std::vector<const Tensor*>& qkv, const Inputs& in,
                           const Options& o, Meters& meters, Clock& clock) {
  std::vector<Row> rows;
  for (const Case* c : group)
    for (Variant v : c->variants) {
      rows.push_back(Row{c, v});
      warm_up(ctx, *c, case_params(*c, v, o));
    }
  if (o.gpu_warm > 0) {
    if (!meters.busy) meters.busy.emplace(ctx);
    auto start = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           o.gpu_warm)
      meters.busy->gflops();
  }
  const size_t n = rows.size();
  std::vector<int> rounds(n, o.repeat);
  for (int round = 0; round < *std::max_element(rounds.begin(), rounds.end()); ++round) {
    for (size_t k = 0; k < n; ++k) {
      size_t i = (size_t(round) + k) % n;
      if (round >= rounds[i]) continue;
      progress(clock.done++, clock.total, *rows[i].c, rows[i].variant, round, clock.seconds());
      size_t g = size_t(std::find(group.begin(), group.end(), rows[i].c) - group.begin());
      time_run(ctx, *rows[i].c, qkv[g], o, meters, rows[i]);
    }
    if (round > 0) continue;
    rounds = rounds_per_row(rows, o);
    if (group.size() > 1)  // every run has its base's run of the same round
      rounds.assign(n, *std::max_element(rounds.begin(), rounds.end()));
    for (int r : rounds) clock.total += size_t(r - o.repeat);
  }
  if (meters.fma) meters.fma->finish();
  // The matrix units' peak bounds the cooperative-matrix kernels, not the FMA units'.
  for (Row& r : rows)
    if (o.peak && r.layout == TileLayout::cooperative_matrix)
      for (Run& run : r.runs) run.peak_gflops = o.peak->coopmat_gflops;
  auto find = [&](const Case* c, Variant v) -> const Row* {
    for (const Row& r : rows)
      if (r.c == c && r.variant == v) return &r;
    return nullptr;
  };
  for (Row& r : rows) {
    const Row* base = group.size() > 1 ? find(group.front(), r.variant) : nullptr;
    summarise(r, find(r.c, Variant::flash2), base, *r.c);
    if (o.check) r.max_err = check_error(ctx, in, case_params(*r.c, r.variant, o), r.c->storage);
  }
  return rows;
}

// What a case's inputs depend on: its shape.
auto input_key(const Case& c) {
  const Dims& d = c.dims;
  return std::make_tuple(d.batch, d.heads, d.kv_heads, d.nq, d.nk, d.d, d.dv);
}

auto storage_key(const Storage& s) {
  return std::make_tuple(s.q, s.k, s.v);
}

}  // namespace

AttentionParams case_params(const Case& c, Variant variant, const Options& o) {
  AttentionParams params;
  params.mods = c.mods;
  params.variant = variant;
  params.want_lse = false;
  if (variant_info(variant).fused) {
    params.hints.tile_layout = o.layout;
    params.hints.fp16_arithmetic = o.fp16_arithmetic || c.fp16_arithmetic;
    params.hints.group_rows = o.group_rows;  // (the matrix kernel's: naive has none)
  }
  params.hints.block_rows = o.block_rows;
  params.hints.block_keys = o.block_keys;
  if (variant_info(variant).splits_keys) params.hints.splits = o.splits;
  return params;
}

// Builds the variant's pipeline on a problem of the same kind with at most 512 query rows, so the
// timed runs measure the kernel and not the driver's compiler (llvmpipe compiles at the first
// dispatch). 512, not fewer: register tiles size their workgroups by the rows of a KV head below
// 256 (64 invocations x 4 rows), so a smaller warm-up would build another pipeline. The keys stay
// as they are: K and V are texel buffers for the register-tile kernels, and llvmpipe compiles
// another variant of a shader for textures of another size class (a warm-up on 64 keys left the
// first timed run at N = 300 with a 10 s compile).
void warm_up(Context& ctx, const Case& c, const AttentionParams& params) {
  Dims small = c.dims;
  small.nq = std::min(small.nq, 512u);
  Inputs in = make_inputs(small);
  AttentionParams p = params;
  if (p.mods.has_mask() && small.nq < c.dims.nq) {  // the mask's first rows of each slice
    std::vector<int64_t> shape = p.mods.mask.shape;
    int64_t slices = numel(shape) / (int64_t(c.dims.nq) * c.dims.nk);
    shape[shape.size() - 2] = small.nq;
    HostTensor rows(shape);
    for (int64_t s = 0; s < slices; ++s)
      std::copy_n(p.mods.mask.data.begin() + s * int64_t(c.dims.nq) * c.dims.nk,
                  int64_t(small.nq) * c.dims.nk,
                  rows.data.begin() + s * int64_t(small.nq) * c.dims.nk);
    p.mods.mask = std::move(rows);
  }
  auto start = std::chrono::steady_clock::now();
  attention(ctx, in.q, in.k, in.v, p, c.storage);
  if (p.mods.user_functions())  // glslang's compile, outside the timed runs
    std::fprintf(stderr, "flashvk: %s with %s built and warmed up in %.2f s (not timed)\n",
                 variant_name(p.variant), modifier_text(p.mods).c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

std::vector<Row> run_cases(Context& ctx, const std::vector<Case>& cases, const Options& o) {
  Clock clock;
  for (const Case& c : cases) clock.total += c.variants.size() * size_t(o.repeat);
  Meters meters;
  if (o.flush) meters.flush.emplace(ctx);
  if (o.peak) meters.fma.emplace(ctx);
  std::vector<Row> rows;
  print_header(o);
  for (size_t first = 0, end = 0; first < cases.size(); first = end) {
    std::vector<const Case*> group;  // a case and those that run with it
    for (end = first; end < cases.size() && (end == first || cases[end].with_previous); ++end)
      group.push_back(&cases[end]);
    const Case& c = cases[first];
    for (const Case* g : group)  // they share c's inputs
      if (input_key(*g) != input_key(c))
        throw std::logic_error("bench: a case of a group has another shape");
    Inputs in = make_inputs(c.dims);
    // The inputs in each storage of the group, uploaded once each.
    std::vector<std::array<Tensor, 3>> uploads(group.size());
    std::vector<const Tensor*> qkv(group.size());
    try {
      for (size_t g = 0; g < group.size(); ++g) {
        for (size_t h = 0; h < g && !qkv[g]; ++h)
          if (storage_key(group[h]->storage) == storage_key(group[g]->storage)) qkv[g] = qkv[h];
        if (qkv[g]) continue;
        uploads[g] = upload_qkv(ctx, in.q, in.k, in.v, group[g]->storage);
        qkv[g] = uploads[g].data();
      }
    } catch (const Error& e) {
      // A shape given alone, or a group of several cases (today always the whole list), is
      // refused; one shape beyond this device's limits does not cost the rest of a long suite.
      if (cases.size() == group.size()) throw;
      std::printf("%-8s %-*s %6u %6u %5u %-*s  not run: %s\n", c.kind, o.dtype_width,
                  storage_text(c.storage).c_str(), c.dims.nq, c.dims.nk, c.dims.d, o.mask_width,
                  mask_text(c).c_str(), e.what());
      for (const Case* g : group) clock.done += g->variants.size() * size_t(o.repeat);
      continue;
    }
    std::vector<Row> case_rows = run_group(ctx, group, qkv, in, o, meters, clock);
    if (isatty(2)) std::fprintf(stderr, "\r\033[K");
    for (const Row& r : case_rows) print_row(r, o);
    rows.insert(rows.end(), case_rows.begin(), case_rows.end());
  }
  std::fprintf(stderr, "%zu runs in %.1f s\n", clock.done, clock.seconds());
  // Runs of one variant on one case far apart: the GPU's clocks (or another load) changed
  // while they ran (an H200 read 5x slow part-way through a suite), which a median may mix.
  const Row* widest = nullptr;
  size_t unsteady = 0;
  for (const Row& r : rows)
    if (r.spread() > kUnsteadySpread) {
      ++unsteady;
      if (!widest || r.spread() > widest->spread()) widest = &r;
    }
  if (widest)
    std::fprintf(stderr,
                 "flashvk: note: %zu of %zu rows have a run over %.0fx slower than their fastest "
                 "(at most %.1fx: %s, %s, Nq=%u Nk=%u d=%u): the GPU's clocks or another load "
                 "changed while they ran; the JSON's runs_ms has every run, and the ratios are "
                 "taken run by run\n",
                 unsteady, rows.size(), kUnsteadySpread, widest->spread(),
                 variant_name(widest->variant), mask_text(*widest->c).c_str(), widest->c->dims.nq,
                 widest->c->dims.nk, widest->c->dims.d);
  if (o.peak && !rows.empty()) {
    auto [lo, hi] = std::minmax_element(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      return a.peak_gflops < b.peak_gflops;
    });
    std::printf(
        "peak around the runs (median per case): %.2f to %.2f GFLOP/s%s\n", lo->peak_gflops,
        hi->peak_gflops,
        o.peak->coopmat_gflops > 0 ? " (cooperative_matrix rows: of the fp16 matrix peak)" : "");
  }
  return rows;
}

}  // namespace flashvk::cli
