#include "flashvk/trace.hpp"

#include <cmath>
#include <cstdio>
#include <limits>

#include "plan.hpp"

namespace flashvk {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr uint32_t kFields = 6;  // s, m, l, w, lse, spare; then o (shaders/common.glsl)

struct Kept {
  bool m_l, lse;
};

Kept kept_by(Variant v) {
  const VariantInfo& info = variant_info(v);
  return {info.keeps_max, info.keeps_lse};
}

// Turns raw trace records into a series. A record (or field) the kernel did not write is NaN: the
// key or tile was masked or skipped, so the state carries over unchanged and w is 0.
TraceSeries to_series(const std::vector<float>& raw, uint32_t records, uint32_t dv, Kept kept,
                      uint32_t reset_every) {
  TraceSeries t;
  float m = kNegInf, l = 0.0f, lse = kNegInf;
  std::vector<float> o(dv, 0.0f);
  for (uint32_t r = 0; r < records; ++r) {
    if (reset_every && r % reset_every == 0) {  // a new splitkv chunk starts from scratch
      m = kNegInf, l = 0.0f, lse = kNegInf;
      o.assign(dv, 0.0f);
    }
    const float* rec = raw.data() + size_t(r) * (kFields + dv);
    auto take = [](float value, float& state) {
      if (!std::isnan(value)) state = value;
      return state;
    };
    t.s.push_back(std::isnan(rec[0]) ? kNegInf : rec[0]);
    t.m.push_back(kept.m_l ? take(rec[1], m) : kNaN);
    t.l.push_back(kept.m_l ? take(rec[2], l) : kNaN);
    t.w.push_back(std::isnan(rec[3]) ? 0.0f : rec[3]);
    t.lse.push_back(kept.lse ? take(rec[4], lse) : kNaN);
    for (uint32_t k = 0; k < dv; ++k) take(rec[kFields + k], o[k]);
    t.o.push_back(o);
  }
  return t;
}

struct Run {
  std::unique_ptr<detail::Plan> plan;
  std::vector<float> raw;
};

Run run_traced(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
               const AttentionParams& params, const detail::PlanOptions& options) {
  Run run;
  run.plan = std::make_unique<detail::Plan>(ctx, q, k, v, params, options);
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { run.plan->record(cmd); });
  run.raw = run.plan->trace_records();
  return run;
}

void check_index(uint32_t value, uint32_t size, const char* name, const char* dim) {
  if (value >= size)
    throw Error(std::string(name) + " " + std::to_string(value) +
                " is out of range: the input has " + std::to_string(size) + " " + dim +
                " (valid: 0.." + std::to_string(size - 1) + ")");
}

}  // namespace

Trace trace(Context& ctx, const HostTensor& q, const HostTensor& k, const HostTensor& v,
            const AttentionParams& params, uint32_t batch, uint32_t head, uint32_t row,
            Storage storage) {
  Dims dims = check_shapes(q.shape, k.shape, v.shape);
  check_index(batch, dims.batch, "batch", "batch entries");
  check_index(head, dims.heads, "head", "heads");
  check_index(row, dims.nq, "row", "query rows");
  auto [tq, tk, tv] = upload_qkv(ctx, q, k, v, storage);

  detail::PlanOptions options;
  options.trace = true;
  options.trace_builds = &detail::trace_shader_blobs();
  options.trace_bh = batch * dims.heads + head;
  options.trace_row = row;
  Run tiled = run_traced(ctx, tq, tk, tv, params, options);
  const detail::Plan& tp = *tiled.plan;
  Kept kept = kept_by(params.variant);

  Trace t;
  t.variant = params.variant;
  t.batch = batch;
  t.head = head;
  t.row = row;
  t.keys = dims.nk;
  t.dim = dims.d;
  t.dim_v = dims.dv;
  t.scale = tp.scale();
  t.heads = dims.heads;
  t.mods = params.mods;
  t.device = ctx.device().name;
  bool splitkv = variant_info(params.variant).splits_keys;
  if (variant_info(params.variant).fused) {
    t.tile_size = tp.block_keys();
    uint32_t tiles = (dims.nk + tp.block_keys() - 1) / tp.block_keys();
    t.tiles = to_series(tiled.raw, tiles, dims.dv, kept,
                        splitkv ? tp.keys_per_chunk() / tp.block_keys() : 0);
    t.tiles.s.clear();  // a tile has no single score
    // The same kernels with Bc = 1 run the seeds' per-key loops.
    options.keys = 1;
    options.keys_per_split = tp.keys_per_chunk();
    AttentionParams per_key = params;
    per_key.hints.splits = tp.key_chunks();
    Run keyed = run_traced(ctx, tq, tk, tv, per_key, options);
    t.steps = to_series(keyed.raw, dims.nk, dims.dv, kept, splitkv ? tp.keys_per_chunk() : 0);
  } else {
    t.steps = to_series(tiled.raw, dims.nk, dims.dv, kept, 0);
  }
  if (splitkv) {
    std::vector<float> parts = tp.chunk_outputs(), ml = tp.chunk_states();
    size_t first = (size_t(options.trace_bh) * dims.nq + row) * tp.key_chunks();
    for (uint32_t c = 0; c < tp.key_chunks(); ++c) {
      TraceSplit s;
      s.begin = std::min(dims.nk, c * tp.keys_per_chunk());
      s.end = std::min(dims.nk, s.begin + tp.keys_per_chunk());
      s.m = ml[(first + c) * 2];
      s.l = ml[(first + c) * 2 + 1];
      s.o.assign(parts.begin() + long((first + c) * dims.dv),
                 parts.begin() + long((first + c + 1) * dims.dv));
      t.splits.push_back(s);
    }
  }
  HostTensor out = tp.out().download();
  size_t flat_row = size_t(options.trace_bh) * dims.nq + row;
  t.out.assign(out.data.begin() + long(flat_row * dims.dv),
               out.data.begin() + long((flat_row + 1) * dims.dv));
  t.lse = tp.lse().empty() ? kNaN : tp.lse().download().data[flat_row];
  return t;
}

namespace {

void put_number(std::string& s, double x) {
  if (!std::isfinite(x)) {
    s += "null";  // JSON has no infinities: -inf (nothing seen, masked) and NaN become null
    return;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  s += buf;
}

void put_array(std::string& s, const std::vector<float>& xs) {
  s += '[';
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i) s += ',';
    put_number(s, xs[i]);
  }
  s += ']';
}

void put_series(std::string& s, const TraceSeries& t, bool with_s) {
  s += '{';
  if (with_s) {
    s += "\"s\":";
    put_array(s, t.s);
    s += ',';
  }
  const std::pair<const char*, const std::vector<float>*> fields[] = {
      {"m", &t.m}, {"l", &t.l}, {"w", &t.w}, {"lse", &t.lse}};
  for (const auto& [name, values] : fields) {
    s += std::string("\"") + name + "\":";
    put_array(s, *values);
    s += ',';
  }
  s += "\"o\":[";
  for (size_t i = 0; i < t.o.size(); ++i) {
    if (i) s += ',';
    put_array(s, t.o[i]);
  }
  s += "]}";
}

}  // namespace

std::string trace_to_json(const Trace& t) {
  std::string s = "{\"variant\":\"";
  s += variant_name(t.variant);
  s += "\",\"batch\":" + std::to_string(t.batch) + ",\"head\":" + std::to_string(t.head) +
       ",\"row\":" + std::to_string(t.row) + ",\"keys\":" + std::to_string(t.keys) +
       ",\"dim\":" + std::to_string(t.dim) + ",\"dim_v\":" + std::to_string(t.dim_v) +
       ",\"scale\":";
  put_number(s, t.scale);
  TracedRow row{t.heads, t.batch, t.head};
  for (const auto& [name, value] : modifier_json(t.mods, &row)) s += ",\"" + name + "\":" + value;
  s += ",\"device\":\"";
  for (char c : t.device)
    if (c != '"' && c != '\\') s += c;
  s += "\",\"steps\":";
  put_series(s, t.steps, true);
  s += ",\"tiles\":";
  put_series(s, t.tiles, false);
  s.insert(s.size() - 1, ",\"size\":" + std::to_string(t.tile_size));
  s += ",\"splits\":[";
  for (size_t i = 0; i < t.splits.size(); ++i) {
    const TraceSplit& sp = t.splits[i];
    s += std::string(i ? "," : "") + "{\"begin\":" + std::to_string(sp.begin) +
         ",\"end\":" + std::to_string(sp.end) + ",\"m\":";
    put_number(s, sp.m);
    s += ",\"l\":";
    put_number(s, sp.l);
    s += ",\"o\":";
    put_array(s, sp.o);
    s += '}';
  }
  s += "],\"out\":";
  put_array(s, t.out);
  s += ",\"lse\":";
  put_number(s, t.lse);
  s += "}\n";
  return s;
}

}  // namespace flashvk
