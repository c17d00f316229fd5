#include "model.hpp"

#ifdef FLASHVK_VIEWER_FLEX
#include "flashvk/flex.hpp"
#endif

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <limits>

namespace flashvk::viewer {
namespace {

// The output the state after step i stands for: FA2 and splitkv keep o unnormalised.
std::vector<std::vector<double>> normalised(Variant v, const TraceSeries& s) {
  std::vector<std::vector<double>> out;
  for (size_t i = 0; i < s.o.size(); ++i) {
    double div = variant_info(v).lazy_output && s.l[i] > 0 ? s.l[i] : 1.0;
    std::vector<double> o(s.o[i].begin(), s.o[i].end());
    for (double& x : o) x /= div;
    out.push_back(o);
  }
  return out;
}

// Per step, the largest difference between the output the GPU's state stands for and the one
// the same variant's float64 state stands for (FA2 and splitkv divided by their own l), so that
// the error plot and the Output panel measure the same quantity.
std::vector<double> step_errors(Variant v, const std::vector<std::vector<double>>& gpu,
                                const reference::RowTrace& ref) {
  std::vector<double> err;
  bool lazy = variant_info(v).lazy_output;
  for (size_t i = 0; i < gpu.size() && i < ref.o.size(); ++i) {
    double e = 0.0, div = lazy && ref.l[i] > 0 ? ref.l[i] : 1.0;
    for (size_t c = 0; c < gpu[i].size(); ++c) {
      double d = std::abs(gpu[i][c] - ref.o[i][c] / div);
      e = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(e, d);
    }
    err.push_back(e);
  }
  return err;
}

}  // namespace

namespace {

// The row's float64 output on q, k, v as stored in `storage` (max |difference| from `given`).
double row_cost(const HostTensor& q, const HostTensor& k, const HostTensor& v, const Dims& dims,
                const AttentionParams& params, uint32_t b, uint32_t h, uint32_t i,
                const Storage& storage, const reference::Vec& given) {
  HostTensor sq = stored_values(q, storage.q), sk = stored_values(k, storage.k);
  reference::Vec out =
      reference::direct_row(reference::row_scores(sq, sk, dims, params, b, h, i),
                            reference::value_rows(stored_values(v, storage.v), dims, b, h),
                            reference::row_sink(params, h))
          .out;
  double cost = 0;
  for (size_t c = 0; c < out.size() && c < given.size(); ++c)
    cost = std::max(cost, std::abs(out[c] - given[c]));
  return cost;
}

// Rows [first, first + count) of the flattened tensor x of rows of `width` values.
HostTensor rows_of(const HostTensor& x, size_t first, size_t count, size_t width,
                   std::vector<int64_t> shape) {
  auto from = x.data.begin() + long(first * width);
  return HostTensor(std::move(shape), std::vector<float>(from, from + long(count * width)));
}

}  // namespace

std::optional<RowCall> row_call(const Inputs& in, uint32_t b, uint32_t h, uint32_t row) {
  const Modifiers& m = in.params.mods;
  if (m.user_functions() || m.alibi()) return std::nullopt;
  Dims d = check_shapes(in.q.shape, in.k.shape, in.v.shape);
  if (b >= d.batch || h >= d.heads || row >= d.nq) return std::nullopt;
  const int64_t nk = d.nk;
  uint32_t kv = h / (d.heads / d.kv_heads);
  RowCall c;
  c.q = rows_of(in.q, (size_t(b) * d.heads + h) * d.nq + row, 1, d.d, {1, 1, 1, d.d});
  c.k = rows_of(in.k, (size_t(b) * d.kv_heads + kv) * d.nk, d.nk, d.d, {1, 1, nk, d.d});
  c.v = rows_of(in.v, (size_t(b) * d.kv_heads + kv) * d.nk, d.nk, d.dv, {1, 1, nk, d.dv});
  c.params = in.params;
  Modifiers& r = c.params.mods;
  // The keys the causal limit, the window and the chunk leave the row, and its mask row, as one
  // additive row: the kernels read the same keys (none outside its finite entries).
  std::vector<float> mask(size_t(nk), 0.0f);
  if (m.has_mask()) {
    const auto& s = m.mask.shape;
    size_t bm = 0, hm = 0;
    if (s.size() == 4) {
      bm = s[0] == 1 ? 0 : b;
      hm = s[1] == 1 ? 0 : h;
    } else if (s.size() != 2) {
      return std::nullopt;
    }
    size_t heads = s.size() == 4 ? size_t(s[1]) : 1;
    auto from = m.mask.data.begin() + long(((bm * heads + hm) * d.nq + row) * size_t(nk));
    mask.assign(from, from + nk);
  }
  KeyRange keys = window_keys(m, d.nq, d.nk, row);
  for (int64_t j = 0; j < nk; ++j)
    if (j < keys.begin || j >= keys.end) mask[size_t(j)] = -std::numeric_limits<float>::infinity();
  r.mask = HostTensor({1, nk}, std::move(mask));
  r.causal = false;
  r.window_left = r.window_right = -1;
  r.chunk_size = 0;
  if (!m.key_mask.empty())
    r.key_mask.assign(m.key_mask.begin() + long(size_t(b) * d.nk),
                      m.key_mask.begin() + long(size_t(b + 1) * d.nk));
  if (!m.sinks.empty()) r.sinks = {m.sinks[h]};
  if (in.params.rope != RopeLayout::none)
    c.params.query_position = in.params.query_position.value_or(nk - int64_t(d.nq)) + row;
  return c;
}

// Everything one request computes: what the panels show.
struct Traced {
  Request request;
  Dims dims;
  /// The request's params with twins for the user's functions where the inputs lack them:
  /// their values on the device (flex::DeviceTwins), since the host cannot run GLSL.
  AttentionParams ref_params;
  bool device_twins = false;  // ref_params' twins are flex::DeviceTwins'
  HostTensor q, k, v;         // the values the device holds (stored_values): what float64 sees
  double storage_cost = 0, fp16_cost = 0;
  std::vector<VariantTrace> traces;
  reference::Vec scores, raw_scores;
  reference::RowTrace direct, fa1, fa2, fd, literal_fd;
  std::vector<double> heat_s, heat_p;
  std::string error;
};

namespace {

// S and P of (batch, head) for the heatmap, too large to draw past 4M pairs, or 1M whose user
// functions' values come from the device (DeviceTwins keeps each pair asked).
void build_heatmap(Traced& t) {
  size_t nq = t.dims.nq, nk = t.dims.nk;
  if (nq * nk > (t.device_twins ? 1'000'000u : 4'000'000u)) return;
  t.heat_s.assign(nq * nk, 0.0);
  t.heat_p.assign(nq * nk, 0.0);
  for (uint32_t i = 0; i < nq; ++i) {
    reference::Vec s = reference::row_scores(t.q, t.k, t.dims, t.ref_params, t.request.batch,
                                             t.request.head, i);
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (double x : s) m = std::max(m, x);
    for (double x : s) sum += std::isinf(x) ? 0.0 : std::exp(x - m);
    for (size_t j = 0; j < nk; ++j) {
      t.heat_s[i * nk + j] = s[j];
      t.heat_p[i * nk + j] = std::isinf(s[j]) || sum == 0 ? 0.0 : std::exp(s[j] - m) / sum;
    }
  }
}

// Everything the float64 reference computes from the row's scores (t.ref_params).
void reference_rows(Traced& t) {
  const Request& rq = t.request;
  const Inputs& in = rq.inputs;
  t.scores = reference::row_scores(t.q, t.k, t.dims, t.ref_params, rq.batch, rq.head, rq.row);
  t.raw_scores.clear();
  if (t.ref_params.mods.softcap > 0) {
    AttentionParams raw = t.ref_params;
    raw.mods.softcap = 0;
    t.raw_scores = reference::row_scores(t.q, t.k, t.dims, raw, rq.batch, rq.head, rq.row);
  }
  std::vector<reference::Vec> values = reference::value_rows(t.v, t.dims, rq.batch, rq.head);
  double sink = reference::row_sink(t.ref_params, rq.head);
  t.direct = reference::direct_row(t.scores, values, sink);
  t.storage_cost = t.fp16_cost = 0;
  if (in.storage.q != DType::f32 || in.storage.k != DType::f32 || in.storage.v != DType::f32) {
    reference::Vec given =
        reference::direct_row(
            reference::row_scores(in.q, in.k, t.dims, t.ref_params, rq.batch, rq.head, rq.row),
            reference::value_rows(in.v, t.dims, rq.batch, rq.head), sink)
            .out;
    for (size_t c = 0; c < given.size(); ++c)
      t.storage_cost = std::max(t.storage_cost, std::abs(t.direct.out[c] - given[c]));
    t.fp16_cost = row_cost(in.q, in.k, in.v, t.dims, t.ref_params, rq.batch, rq.head, rq.row,
                           Storage(DType::f16), given);
  }
  build_heatmap(t);
}

// Traces the request's row with each of its variants (`stage` counts them) beside float64.
std::unique_ptr<Traced> trace_request(Context& ctx, Request request, std::atomic<int>* stage) {
  auto t = std::make_unique<Traced>();
  t->request = std::move(request);
  Request& rq = t->request;
  Inputs& in = rq.inputs;
  t->dims = check_shapes(in.q.shape, in.k.shape, in.v.shape);
#ifdef FLASHVK_VIEWER_FLEX
  if (in.params.mods.user_functions()) flex::enable(ctx);  // glslang compiles them
#endif
  const Dims& dims = t->dims;
  rq.batch = std::min(rq.batch, dims.batch - 1);
  rq.head = std::min(rq.head, dims.heads - 1);
  rq.row = std::min(rq.row, dims.nq - 1);
  // The float64 reference sees the values the device holds, so that its comparison isolates the
  // kernels; what the storage itself costs is measured apart (storage_cost).
  try {
    t->q = stored_values(in.q, in.storage.q);
    t->k = stored_values(in.k, in.storage.k);
    t->v = stored_values(in.v, in.storage.v);
  } catch (const Error& e) {
    t->error = e.what();
    in.storage = Storage();
    t->q = in.q, t->k = in.k, t->v = in.v;
  }
  try {
    t->ref_params = in.params;
#ifdef FLASHVK_VIEWER_FLEX
    const Modifiers& m = in.params.mods;
    if ((!m.score_mod.empty() && !m.score_twin) || (!m.mask_mod.empty() && !m.mask_twin)) {
      t->device_twins = true;
      flex::DeviceTwins twins(ctx, m, dims.nq, dims.nk);
      t->ref_params.mods = twins.noting();
      reference_rows(*t);  // notes what the reference asks of the functions
      t->ref_params.mods = twins.answering();
    }
#endif
    reference_rows(*t);
  } catch (const Error& e) {  // a function the device refuses: nothing to compare with
    t->error = e.what();
    t->ref_params = in.params;
    t->ref_params.mods.score_mod.clear();
    t->ref_params.mods.mask_mod.clear();
    reference_rows(*t);
  }
  std::vector<reference::Vec> values = reference::value_rows(t->v, dims, rq.batch, rq.head);
  double sink = reference::row_sink(in.params, rq.head);
  t->fa1 = reference::flash1_row(t->scores, values, sink);
  t->fa2 = reference::flash2_row(t->scores, values, sink);
  t->fd = reference::flashd_row(t->scores, values, sink);
  t->literal_fd = reference::flashd_seed_row(t->scores, values, true);
  // Only the row shown is traced: one row's call where it can be cut out, else the whole call;
  // the variants side by side (the engine's context serves several threads).
  std::optional<RowCall> one = row_call(in, rq.batch, rq.head, rq.row);
  auto trace_one = [&, stage](Variant v) {
    VariantTrace vt{v, {}, {}, {}, {}};
    if (one) {
      AttentionParams p = one->params;
      p.variant = v;
      vt.gpu = trace(ctx, one->q, one->k, one->v, p, 0, 0, 0, in.storage);
      vt.gpu.batch = rq.batch, vt.gpu.head = rq.head, vt.gpu.row = rq.row;
      vt.gpu.heads = dims.heads;
      vt.gpu.mods = in.params.mods;
    } else {
      AttentionParams p = in.params;
      p.variant = v;
      vt.gpu = trace(ctx, in.q, in.k, in.v, p, rq.batch, rq.head, rq.row, in.storage);
    }
    uint32_t chunk = vt.gpu.splits.empty() ? 0 : vt.gpu.splits[0].end - vt.gpu.splits[0].begin;
    vt.ref = reference::variant_row(v, t->scores, values, chunk, sink);
    vt.o_norm = normalised(v, vt.gpu.steps);
    vt.error = step_errors(v, vt.o_norm, vt.ref);
    if (stage) ++*stage;
    return vt;
  };
  std::vector<std::future<VariantTrace>> jobs;
  for (Variant v : rq.selected) jobs.push_back(std::async(std::launch::async, trace_one, v));
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      t->traces.push_back(jobs[i].get());
    } catch (const Error& e) {
      t->error = std::string(variant_name(rq.selected[i])) + ": " + e.what();
      if (stage) ++*stage;
    }
  }
  return t;
}

}  // namespace

Model::Model(Context& ctx) : ctx_(ctx), t_(std::make_unique<Traced>()) {}

Model::~Model() {
  if (job_.valid()) job_.wait();
}

void Model::wait() {
  next_.reset();
  if (!job_.valid()) return;
  job_.wait();
  job_ = {};
  job_request_.reset();
}

void Model::show(std::unique_ptr<Traced> traced) {
  bool fresh = traced->request.fresh;
  t_ = std::move(traced);
  const Request& rq = t_->request;
  selected = rq.selected;
  batch = rq.batch, head = rq.head, row = rq.row;
  last_error = t_->error;
  ++generation_;
  if (fresh)
    cursor = last_visible_key();
  else
    cursor = std::clamp(cursor, 0, std::max(0, steps() - 1));
}

namespace {

// A request for new inputs: the preset's row, and the variants its lesson is about added.
Request fresh_request(Inputs inputs, std::vector<Variant> selected) {
  Request r;
  for (Variant v : inputs.needs)
    if (std::find(selected.begin(), selected.end(), v) == selected.end()) selected.push_back(v);
  r.selected = std::move(selected);
  r.row = inputs.row;
  r.inputs = std::move(inputs);
  r.fresh = true;
  return r;
}

}  // namespace

void Model::load(Inputs inputs) {
  check_shapes(inputs.q.shape, inputs.k.shape, inputs.v.shape);
  show(trace_request(ctx_, fresh_request(std::move(inputs), selected), nullptr));
}

void Model::retrace() {
  Request r = wanted();
  r.fresh = false;
  r.selected = selected, r.batch = batch, r.head = head, r.row = row;
  show(trace_request(ctx_, std::move(r), nullptr));
}

Request Model::wanted() const {
  if (next_) return *next_;
  if (job_request_) return *job_request_;
  Request r = t_->request;
  r.fresh = false;
  r.selected = selected, r.batch = batch, r.head = head, r.row = row;
  return r;
}

void Model::start(Request request) {
  job_request_ = request;
  job_stage_ = std::make_shared<std::atomic<int>>(0);
  job_start_ = std::chrono::steady_clock::now();
  job_ = std::async(std::launch::async,
                    [&ctx = ctx_, request = std::move(request), stage = job_stage_]() mutable {
                      return trace_request(ctx, std::move(request), stage.get());
                    });
}

void Model::submit(Request request) {
  if (request.fresh) {
    check_shapes(request.inputs.q.shape, request.inputs.k.shape, request.inputs.v.shape);
    request = fresh_request(std::move(request.inputs), request.selected);
  }
  if (job_.valid())
    next_ = std::move(request);
  else
    start(std::move(request));
}

bool Model::poll() {
  if (!job_.valid() || job_.wait_for(std::chrono::seconds(0)) != std::future_status::ready)
    return false;
  std::unique_ptr<Traced> done;
  std::optional<Error> failed;
  try {
    done = job_.get();
  } catch (const Error& e) {
    failed = e;
  }
  job_request_.reset();
  if (next_) {
    Request n = std::move(*next_);
    next_.reset();
    start(std::move(n));
  }
  if (failed) throw *failed;
  show(std::move(done));
  return true;
}

std::string Model::progress(float* fraction) const {
  if (!job_request_) return "";
  const Request& r = *job_request_;
  int done = job_stage_ ? job_stage_->load() : 0, n = int(r.selected.size());
  if (fraction) *fraction = n ? float(done) / float(n) : 0.0f;
  std::string what = r.fresh ? r.inputs.name + ", row " + std::to_string(r.row)
                             : "row " + std::to_string(r.row) + " of head " +
                                   std::to_string(r.head);
  if (done < n)
    what += ": " + std::string(variant_name(r.selected[size_t(done)])) + " (" +
            std::to_string(done + 1) + " of " + std::to_string(n) + ")";
  char secs[32];
  std::snprintf(secs, sizeof secs, ", %.1f s",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - job_start_).count());
  return what + secs + (next_ ? "; then what was asked since" : "");
}

const Inputs& Model::inputs() const { return t_->request.inputs; }
const Dims& Model::dims() const { return t_->dims; }
const std::vector<VariantTrace>& Model::traces() const { return t_->traces; }
const reference::Vec& Model::scores() const { return t_->scores; }
double Model::storage_cost() const { return t_->storage_cost; }
double Model::fp16_cost() const { return t_->fp16_cost; }
const reference::Vec& Model::raw_scores() const { return t_->raw_scores; }
const reference::RowTrace& Model::direct() const { return t_->direct; }
const reference::RowTrace& Model::literal_flashd() const { return t_->literal_fd; }
const std::vector<double>& Model::heat_s() const { return t_->heat_s; }
const std::vector<double>& Model::heat_p() const { return t_->heat_p; }

int Model::last_visible_key() const {
  for (int i = steps() - 1; i >= 0; --i)
    if (std::isfinite(scores()[size_t(i)])) return i;
  return std::max(0, steps() - 1);
}

const reference::RowTrace& Model::ref_of(Variant v) const {
  if (v == Variant::flash2) return t_->fa2;
  if (v == Variant::flashd) return t_->fd;
  return t_->fa1;
}

uint32_t Model::tile_size() const {
  for (const auto& t : traces())
    if (t.gpu.tile_size) return t.gpu.tile_size;
  return 0;
}

bool Model::event_at(Jump jump, int i) const {
  for (const auto& t : traces()) {
    const TraceSeries& s = t.gpu.steps;
    switch (jump) {
      case Jump::tile:
        if (t.gpu.tile_size && (i + 1) % int(t.gpu.tile_size) == 0) return true;
        break;
      case Jump::rescale:
        if (i > 0 && s.m[size_t(i)] > s.m[size_t(i - 1)] && std::isfinite(s.m[size_t(i - 1)]))
          return true;
        break;
      case Jump::nonfinite:
        for (float x : s.o[size_t(i)])
          if (!std::isfinite(x)) return true;
        break;
      case Jump::underflow:
        if (s.w[size_t(i)] == 0.0f && t.ref.w[size_t(i)] > kUnderflowFloor) return true;
        if (literal_flashd_shown && t_->literal_fd.w[size_t(i)] == 0.0 &&
            t_->fd.w[size_t(i)] > kUnderflowFloor)
          return true;
        break;
      case Jump::error:
        if (t.error[size_t(i)] > error_threshold) return true;
        break;
    }
  }
  return false;
}

int Model::find(Jump jump, int dir) const {
  for (int i = cursor + dir; i >= 0 && i < steps(); i += dir)
    if (event_at(jump, i)) return i;
  return -1;
}

std::string Model::csv() const {
  std::string out = "variant,step,s,m,l,w,lse,error";
  uint32_t dv = dims().dv;
  for (uint32_t c = 0; c < dv; ++c) out += ",o" + std::to_string(c);
  out += "\n";
  char buf[64];
  auto num = [&](double x) {
    std::snprintf(buf, sizeof buf, ",%.9g", x);
    return std::string(buf);
  };
  for (const auto& t : traces()) {
    const TraceSeries& s = t.gpu.steps;
    for (size_t i = 0; i < s.size(); ++i) {
      out += std::string(variant_name(t.variant)) + "," + std::to_string(i) + num(s.s[i]) +
             num(s.m[i]) + num(s.l[i]) + num(s.w[i]) + num(s.lse[i]) + num(t.error[i]);
      for (float x : s.o[i]) out += num(x);
      out += "\n";
    }
  }
  return out;
}

}  // namespace flashvk::viewer
