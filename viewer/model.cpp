#include "model.hpp"

#ifdef FLASHVK_VIEWER_FLEX
#include "flashvk/flex.hpp"
#endif

#include <algorithm>
#include <cmath>
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

void Model::load(Inputs inputs) {
  dims_ = check_shapes(inputs.q.shape, inputs.k.shape, inputs.v.shape);
#ifdef FLASHVK_VIEWER_FLEX
  if (inputs.params.mods.user_functions()) flex::enable(ctx_);  // glslang compiles them
#endif
  in_ = std::move(inputs);
  batch = 0;
  head = 0;
  row = std::min(in_.row, dims_.nq - 1);
  for (Variant v : in_.needs)
    if (std::find(selected.begin(), selected.end(), v) == selected.end()) selected.push_back(v);
  retrace();
  cursor = last_visible_key();
}

int Model::last_visible_key() const {
  for (int i = steps() - 1; i >= 0; --i)
    if (std::isfinite(scores_[size_t(i)])) return i;
  return std::max(0, steps() - 1);
}

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

}  // namespace

void Model::reference_rows() {
  scores_ = reference::row_scores(q_, k_, dims_, ref_params_, batch, head, row);
  raw_scores_.clear();
  if (ref_params_.mods.softcap > 0) {
    AttentionParams raw = ref_params_;
    raw.mods.softcap = 0;
    raw_scores_ = reference::row_scores(q_, k_, dims_, raw, batch, head, row);
  }
  std::vector<reference::Vec> values = reference::value_rows(v_, dims_, batch, head);
  double sink = reference::row_sink(ref_params_, head);
  direct_ = reference::direct_row(scores_, values, sink);
  storage_cost_ = fp16_cost_ = 0;
  if (in_.storage.q != DType::f32 || in_.storage.k != DType::f32 || in_.storage.v != DType::f32) {
    reference::Vec given =
        reference::direct_row(
            reference::row_scores(in_.q, in_.k, dims_, ref_params_, batch, head, row),
            reference::value_rows(in_.v, dims_, batch, head), sink)
            .out;
    for (size_t c = 0; c < given.size(); ++c)
      storage_cost_ = std::max(storage_cost_, std::abs(direct_.out[c] - given[c]));
    fp16_cost_ = row_cost(in_.q, in_.k, in_.v, dims_, ref_params_, batch, head, row,
                          Storage(DType::f16), given);
  }
  build_heatmap();
}

void Model::retrace() {
  last_error.clear();
  batch = std::min(batch, dims_.batch - 1);
  head = std::min(head, dims_.heads - 1);
  row = std::min(row, dims_.nq - 1);
  // The float64 reference sees the values the device holds, so that its comparison isolates the
  // kernels; what the storage itself costs is measured apart (storage_cost).
  storage_cost_ = fp16_cost_ = 0;
  try {
    q_ = stored_values(in_.q, in_.storage.q);
    k_ = stored_values(in_.k, in_.storage.k);
    v_ = stored_values(in_.v, in_.storage.v);
  } catch (const Error& e) {
    last_error = e.what();
    in_.storage = Storage();
    q_ = in_.q, k_ = in_.k, v_ = in_.v;
  }
  try {
    ref_params_ = in_.params;
    device_twins_ = false;
#ifdef FLASHVK_VIEWER_FLEX
    const Modifiers& m = in_.params.mods;
    if ((!m.score_mod.empty() && !m.score_twin) || (!m.mask_mod.empty() && !m.mask_twin)) {
      device_twins_ = true;
      flex::DeviceTwins twins(ctx_, m, dims_.nq, dims_.nk);
      ref_params_.mods = twins.noting();
      reference_rows();  // notes what the reference asks of the functions
      ref_params_.mods = twins.answering();
    }
#endif
    reference_rows();
  } catch (const Error& e) {  // a function the device refuses: nothing to compare with
    last_error = e.what();
    ref_params_ = in_.params;
    ref_params_.mods.score_mod.clear();
    ref_params_.mods.mask_mod.clear();
    reference_rows();
  }
  std::vector<reference::Vec> values = reference::value_rows(v_, dims_, batch, head);
  double sink = reference::row_sink(in_.params, head);
  fa1_ = reference::flash1_row(scores_, values, sink);
  fa2_ = reference::flash2_row(scores_, values, sink);
  fd_ = reference::flashd_row(scores_, values, sink);
  literal_fd_ = reference::flashd_seed_row(scores_, values, true);
  traces_.clear();
  for (Variant v : selected) {
    AttentionParams p = in_.params;
    p.variant = v;
    VariantTrace t{v, {}, {}, {}, {}};
    try {
      t.gpu = trace(ctx_, in_.q, in_.k, in_.v, p, batch, head, row, in_.storage);
    } catch (const Error& e) {
      last_error = std::string(variant_name(v)) + ": " + e.what();
      continue;
    }
    uint32_t chunk = t.gpu.splits.empty() ? 0 : t.gpu.splits[0].end - t.gpu.splits[0].begin;
    t.ref = reference::variant_row(v, scores_, values, chunk, sink);
    t.o_norm = normalised(v, t.gpu.steps);
    t.error = step_errors(v, t.o_norm, t.ref);
    traces_.push_back(std::move(t));
  }
  cursor = std::clamp(cursor, 0, std::max(0, steps() - 1));
}

const reference::RowTrace& Model::ref_of(Variant v) const {
  if (v == Variant::flash2) return fa2_;
  if (v == Variant::flashd) return fd_;
  return fa1_;
}

uint32_t Model::tile_size() const {
  for (const auto& t : traces_)
    if (t.gpu.tile_size) return t.gpu.tile_size;
  return 0;
}

bool Model::event_at(Jump jump, int i) const {
  for (const auto& t : traces_) {
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
        if (literal_flashd_shown && literal_fd_.w[size_t(i)] == 0.0 &&
            fd_.w[size_t(i)] > kUnderflowFloor)
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

void Model::build_heatmap() {
  size_t nq = dims_.nq, nk = dims_.nk;
  heat_s_.clear();
  heat_p_.clear();
  // Too large to show (the panel says so): 4M pairs, or 1M whose user functions' values come
  // from the device (DeviceTwins keeps each pair asked).
  if (nq * nk > (device_twins_ ? 1'000'000u : 4'000'000u)) return;
  heat_s_.assign(nq * nk, 0.0);
  heat_p_.assign(nq * nk, 0.0);
  for (uint32_t i = 0; i < nq; ++i) {
    reference::Vec s = reference::row_scores(q_, k_, dims_, ref_params_, batch, head, i);
    double m = -std::numeric_limits<double>::infinity(), sum = 0.0;
    for (double x : s) m = std::max(m, x);
    for (double x : s) sum += std::isinf(x) ? 0.0 : std::exp(x - m);
    for (size_t j = 0; j < nk; ++j) {
      heat_s_[i * nk + j] = s[j];
      heat_p_[i * nk + j] = std::isinf(s[j]) || sum == 0 ? 0.0 : std::exp(s[j] - m) / sum;
    }
  }
}

std::string Model::csv() const {
  std::string out = "variant,step,s,m,l,w,lse,error";
  uint32_t dv = dims_.dv;
  for (uint32_t c = 0; c < dv; ++c) out += ",o" + std::to_string(c);
  out += "\n";
  char buf[64];
  auto num = [&](double x) {
    std::snprintf(buf, sizeof buf, ",%.9g", x);
    return std::string(buf);
  };
  for (const auto& t : traces_) {
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
