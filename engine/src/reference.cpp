// float64 references, one function per seed algorithm, written as the seeds' loops.
#include "flashvk/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "flashvk/error.hpp"

namespace flashvk::reference {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

size_t width(const std::vector<Vec>& v) {
  return v.empty() ? 0 : v[0].size();
}

double sigmoid(double x) {
  return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x));
}

// Records the state after one step.
void push_step(RowTrace& t, double m, double l, double w, double lse, const Vec& o) {
  t.m.push_back(m);
  t.l.push_back(l);
  t.w.push_back(w);
  t.lse.push_back(lse);
  t.o.push_back(o);
}

Vec scaled(const Vec& o, double factor) {
  Vec r(o.size());
  for (size_t k = 0; k < o.size(); ++k) r[k] = o[k] * factor;
  return r;
}

}  // namespace

// docs/algorithms.md, variants, naive (the 3-pass safe softmax): max, then denominator, then weights.
RowTrace naive_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double m = sink;
  for (double x : s) m = std::max(m, x);  // pass 1: m_N
  double e_sink = sink == -kInf ? 0.0 : std::exp(sink - m);
  double d = e_sink;
  for (double x : s) d += x == -kInf ? 0.0 : std::exp(x - m);  // pass 2: d_N
  Vec o(width(v), 0.0);
  double run_m = sink, run_d = e_sink;
  for (size_t j = 0; j < s.size(); ++j) {  // pass 3: a_j, o += a_j v_j
    double e = s[j] == -kInf ? 0.0 : std::exp(s[j] - m);
    double a = d > 0 ? e / d : 0.0;
    for (size_t k = 0; k < o.size(); ++k) o[k] += a * v[j][k];
    run_m = std::max(run_m, s[j]);
    run_d += e;
    push_step(t, run_m, run_d, a, kNaN, o);
  }
  t.out = o;
  t.final_lse = d > 0 ? m + std::log(d) : -kInf;
  return t;
}

// docs/algorithms.md, variants, online (the 2-pass online softmax): m and d' online, then a_i = e^(x_i - m_N) / d'_N.
RowTrace online_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double m = sink, d = sink == -kInf ? 0.0 : 1.0;
  Vec ms, ds;
  for (double x : s) {
    if (x != -kInf) {
      double m_new = std::max(m, x);
      d = d * (m == -kInf ? 0.0 : std::exp(m - m_new)) + std::exp(x - m_new);
      m = m_new;
    }
    ms.push_back(m);
    ds.push_back(d);
  }
  Vec o(width(v), 0.0);
  for (size_t j = 0; j < s.size(); ++j) {
    double a = (s[j] == -kInf || d == 0) ? 0.0 : std::exp(s[j] - m) / d;
    for (size_t k = 0; k < o.size(); ++k) o[k] += a * v[j][k];
    push_step(t, ms[j], ds[j], a, ds[j] > 0 ? ms[j] + std::log(ds[j]) : -kInf, o);
  }
  t.out = o;
  t.final_lse = d > 0 ? m + std::log(d) : -kInf;
  return t;
}

// docs/algorithms.md, variants, flash1: o_i = o_{i-1} (l_prev / l_new) e^(m_prev - m_new) + v_i e^(s_i - m_new) / l_new.
RowTrace flash1_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double m = sink, l = sink == -kInf ? 0.0 : 1.0, w = 0.0;
  Vec o(width(v), 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    w = 0.0;
    if (s[i] != -kInf) {
      double m_new = std::max(m, s[i]);
      double rescale = m == -kInf ? 0.0 : std::exp(m - m_new);
      double l_new = l * rescale + std::exp(s[i] - m_new);
      w = std::exp(s[i] - m_new) / l_new;
      for (size_t k = 0; k < o.size(); ++k) o[k] = o[k] * rescale * (l / l_new) + v[i][k] * w;
      m = m_new;
      l = l_new;
    }
    push_step(t, m, l, w, l > 0 ? m + std::log(l) : -kInf, o);
  }
  t.out = o;
  t.final_lse = l > 0 ? m + std::log(l) : -kInf;
  return t;
}

// docs/algorithms.md, variants, flash2: o_i = o_{i-1} e^(m_prev - m_new) + v_i e^(s_i - m_new); output o_N / l_N.
RowTrace flash2_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double m = sink, l = sink == -kInf ? 0.0 : 1.0;
  Vec o(width(v), 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    double w = 0.0;
    if (s[i] != -kInf) {
      double m_new = std::max(m, s[i]);
      double rescale = m == -kInf ? 0.0 : std::exp(m - m_new);
      l = l * rescale + std::exp(s[i] - m_new);
      for (size_t k = 0; k < o.size(); ++k)
        o[k] = o[k] * rescale + v[i][k] * std::exp(s[i] - m_new);
      m = m_new;
      w = std::exp(s[i] - m) / l;
    }
    push_step(t, m, l, w, l > 0 ? m + std::log(l) : -kInf, o);
  }
  t.out = l > 0 ? scaled(o, 1.0 / l) : Vec(o.size(), 0.0);
  t.final_lse = l > 0 ? m + std::log(l) : -kInf;
  return t;
}

// FLASH-D with the running log-sum-exp L = s_{i-1} - ln w_{i-1} carried instead of ln w:
// w_i = sigma(s_i - L_{i-1}), L_i = L_{i-1} + ln(1 + e^(s_i - L_{i-1})), o_i = o_{i-1}(1 - w_i) +
// v_i w_i.
RowTrace flashd_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double L = sink;  // the sink is the state before the first key: L = ln e^sink
  Vec o(width(v), 0.0);
  for (size_t i = 0; i < s.size(); ++i) {
    double w = 0.0;
    if (s[i] != -kInf) {
      double x = s[i] - L;  // +inf for the first visible key: w = 1
      w = L == -kInf ? 1.0 : sigmoid(x);
      double keep = L == -kInf ? 0.0 : sigmoid(-x);
      L = L == -kInf ? s[i] : std::max(L, s[i]) + std::log1p(std::exp(-std::abs(x)));
      for (size_t k = 0; k < o.size(); ++k) o[k] = o[k] * keep + v[i][k] * w;
    }
    push_step(t, kNaN, kNaN, w, L, o);
  }
  t.out = o;
  t.final_lse = L;
  return t;
}

// docs/algorithms.md, "FLASH-D without underflow", verbatim: w_1 = 1, w_i = sigma(s_i - s_{i-1} + ln w_{i-1}), with sigma(x) =
// 1 / (1 + e^-x) as the seed's Python writes it. Exact in real arithmetic; in floating point
// e^-x overflows once ln w_{i-1} is low enough, w becomes 0, and every later w is 0.
template <typename T>
RowTrace flashd_seed_row_in(const Vec& s, const std::vector<Vec>& v) {
  RowTrace t;
  std::vector<T> o(width(v), T(0));
  T weight = 1, prev = 0;
  bool first = true;
  for (size_t i = 0; i < s.size(); ++i) {
    T w = 0;
    if (s[i] != -kInf) {
      T x = T(s[i]);
      if (!first) weight = T(1) / (T(1) + std::exp(-(x - prev + std::log(weight))));
      first = false;
      w = weight;
      for (size_t k = 0; k < o.size(); ++k) o[k] = o[k] * (T(1) - weight) + T(v[i][k]) * weight;
      prev = x;
    }
    push_step(t, kNaN, kNaN, double(w), kNaN, Vec(o.begin(), o.end()));
  }
  t.out = Vec(o.begin(), o.end());
  t.final_lse = kNaN;
  return t;
}

RowTrace flashd_seed_row(const Vec& s, const std::vector<Vec>& v, bool in_fp32) {
  return in_fp32 ? flashd_seed_row_in<float>(s, v) : flashd_seed_row_in<double>(s, v);
}

// docs/algorithms.md, variants, splitkv (Flash-Decoding): each chunk runs flash attention and returns (o'_c, m_c, d'_c);
// within a chunk the steps are FlashAttention-2's (unnormalised o), as in shaders/splitkv.comp;
// m_N = max m_c, d'_N = sum d'_c e^(m_c - m_N), o = sum o'_c d'_c e^(m_c - m_N) / d'_N.
RowTrace splitkv_row(const Vec& s, const std::vector<Vec>& v, uint32_t chunk, double sink) {
  RowTrace t;
  chunk = std::max(chunk, 1u);
  struct Part {
    double m, l;
    Vec o;
  };
  std::vector<Part> parts;
  for (size_t begin = 0; begin < s.size(); begin += chunk) {
    size_t end = std::min(s.size(), begin + chunk);
    Vec cs(s.begin() + long(begin), s.begin() + long(end));
    std::vector<Vec> cv(v.begin() + long(begin), v.begin() + long(end));
    RowTrace c = flash2_row(cs, cv);
    for (size_t i = 0; i < cs.size(); ++i) push_step(t, c.m[i], c.l[i], c.w[i], c.lse[i], c.o[i]);
    parts.push_back({c.m.back(), c.l.back(), c.out});
  }
  double m = sink;  // the sink joins once, here
  for (const auto& p : parts) m = std::max(m, p.m);
  double l = sink == -kInf ? 0.0 : std::exp(sink - m);
  for (const auto& p : parts) l += p.m == -kInf ? 0.0 : p.l * std::exp(p.m - m);
  Vec o(width(v), 0.0);
  for (const auto& p : parts) {
    if (p.m == -kInf) continue;
    double weight = p.l * std::exp(p.m - m) / l;
    for (size_t k = 0; k < o.size(); ++k) o[k] += p.o[k] * weight;
  }
  t.out = o;
  t.final_lse = l > 0 ? m + std::log(l) : -kInf;
  return t;
}

RowTrace direct_row(const Vec& s, const std::vector<Vec>& v, double sink) {
  RowTrace t;
  double m = sink;
  for (double x : s) m = std::max(m, x);
  double sum = sink == -kInf ? 0.0 : std::exp(sink - m);
  for (double x : s) sum += x == -kInf ? 0.0 : std::exp(x - m);
  Vec o(width(v), 0.0);
  for (size_t j = 0; j < s.size(); ++j) {
    double p = (s[j] == -kInf || sum == 0) ? 0.0 : std::exp(s[j] - m) / sum;
    for (size_t k = 0; k < o.size(); ++k) o[k] += p * v[j][k];
    t.w.push_back(p);
  }
  t.out = o;
  t.final_lse = sum > 0 ? m + std::log(sum) : -kInf;
  return t;
}

RowTrace variant_row(Variant variant, const Vec& s, const std::vector<Vec>& v, uint32_t chunk,
                     double sink) {
  switch (variant) {
    case Variant::naive:
      return naive_row(s, v, sink);
    case Variant::online:
      return online_row(s, v, sink);
    case Variant::flash1:
      return flash1_row(s, v, sink);
    case Variant::flash2:
      return flash2_row(s, v, sink);
    case Variant::flashd:
      return flashd_row(s, v, sink);
    case Variant::splitkv:
      return splitkv_row(s, v, chunk ? chunk : static_cast<uint32_t>(std::max<size_t>(s.size(), 1)),
                         sink);
  }
  return direct_row(s, v, sink);
}

namespace {
int64_t floor_div(int64_t a, int64_t b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}
}  // namespace

Vec row_scores(const HostTensor& q, const HostTensor& k, const Dims& d,
               const AttentionParams& params, uint32_t batch, uint32_t head, uint32_t row) {
  const Modifiers& mods = params.mods;
  double scale = params.scale ? double(*params.scale) : 1.0 / std::sqrt(double(d.d));
  uint32_t kv_head = head / (d.heads / d.kv_heads);
  const float* qrow = q.data.data() + ((size_t(batch) * d.heads + head) * d.nq + row) * d.d;
  const float* kbase = k.data.data() + (size_t(batch) * d.kv_heads + kv_head) * d.nk * d.d;
  int64_t diag = int64_t(row) + int64_t(d.nk) - int64_t(d.nq);  // the key query `row` sits on
  double slope = alibi_slope(mods, d.heads, batch, head);
  const float* mask_row = nullptr;  // [Nq, Nk] or [B or 1, H or 1, Nq, Nk]
  if (!mods.mask.data.empty()) {
    const auto& ms = mods.mask.shape;
    size_t mb = ms.size() == 4 && ms[0] > 1 ? batch : 0;
    size_t mh = ms.size() == 4 && ms[1] > 1 ? head : 0;
    size_t mheads = ms.size() == 4 ? size_t(ms[1]) : 1;
    mask_row = mods.mask.data.data() + ((mb * mheads + mh) * d.nq + row) * d.nk;
  }
  if ((!mods.score_mod.empty() && !mods.score_twin) || (!mods.mask_mod.empty() && !mods.mask_twin))
    throw Error(
        "the float64 reference cannot run GLSL: give score_mod and mask_mod their C++ twins "
        "(Modifiers::score_twin, mask_twin)");
  const int b = static_cast<int>(batch), h = static_cast<int>(head), i = static_cast<int>(row);
  Vec s(d.nk);
  for (uint32_t j = 0; j < d.nk; ++j) {
    int64_t jj = j;
    // Which keys the row sees, each limit as its definition states it.
    bool visible = true;
    if (mods.causal && jj > diag) visible = false;
    if (mods.window_left >= 0 && jj < diag - mods.window_left) visible = false;
    if (mods.window_right >= 0 && jj > diag + mods.window_right) visible = false;
    if (mods.chunk_size > 0 && floor_div(jj, mods.chunk_size) != floor_div(diag, mods.chunk_size))
      visible = false;  // another chunk than the diagonal's
    if (!mods.key_mask.empty() && mods.key_mask[size_t(batch) * d.nk + j] == 0) visible = false;
    double acc = 0.0;
    for (uint32_t c = 0; c < d.d; ++c) acc += double(qrow[c]) * double(kbase[size_t(j) * d.d + c]);
    double x = scale * acc;
    if (mods.softcap > 0) x = double(mods.softcap) * std::tanh(x / double(mods.softcap));
    // The user's functions where the kernels call them: mask_mod on keys the built-in limits
    // let through, score_mod on keys mask_mod keeps (a function may index a table by both).
    if (visible && !mods.mask_mod.empty() && !mods.mask_twin(b, h, i, static_cast<int>(j)))
      visible = false;
    if (visible && !mods.score_mod.empty()) x = mods.score_twin(x, b, h, i, static_cast<int>(j));
    x -= slope * double(std::abs(diag - jj));
    if (mask_row) x += double(mask_row[j]);  // -inf hides the key
    s[j] = visible && x != -kInf ? x : -kInf;
  }
  return s;
}

double row_sink(const AttentionParams& params, uint32_t head) {
  return params.mods.sinks.empty() ? kNoSink : double(params.mods.sinks[head]);
}

std::vector<Vec> value_rows(const HostTensor& v, const Dims& d, uint32_t batch, uint32_t head) {
  uint32_t kv_head = head / (d.heads / d.kv_heads);
  const float* base = v.data.data() + (size_t(batch) * d.kv_heads + kv_head) * d.nk * d.dv;
  std::vector<Vec> rows(d.nk, Vec(d.dv));
  for (uint32_t j = 0; j < d.nk; ++j)
    for (uint32_t c = 0; c < d.dv; ++c) rows[j][c] = base[size_t(j) * d.dv + c];
  return rows;
}

namespace {

template <typename RowFn>
Result run_rows(const HostTensor& q_in, const HostTensor& k_in, const HostTensor& v,
                const AttentionParams& params, RowFn row_fn) {
  HostTensor q = q_in, k = k_in;
  Dims d = check_shapes(q.shape, k.shape, v.shape);
  if (params.rope != RopeLayout::none) {
    int64_t first = params.query_position.value_or(int64_t(d.nk) - int64_t(d.nq));
    q = rope(q, {params.rope, params.rope_base, first});
    k = rope(k, {params.rope, params.rope_base, 0});
  }
  Result r;
  r.out.assign(size_t(d.batch) * d.heads * d.nq * d.dv, 0.0);
  r.lse.assign(size_t(d.batch) * d.heads * d.nq, 0.0);
  for (uint32_t b = 0; b < d.batch; ++b) {
    for (uint32_t h = 0; h < d.heads; ++h) {
      std::vector<Vec> vr = value_rows(v, d, b, h);
      for (uint32_t i = 0; i < d.nq; ++i) {
        RowTrace t = row_fn(row_scores(q, k, d, params, b, h, i), vr, row_sink(params, h));
        size_t row = (size_t(b) * d.heads + h) * d.nq + i;
        std::copy(t.out.begin(), t.out.end(), r.out.begin() + long(row * d.dv));
        r.lse[row] = t.final_lse;
      }
    }
  }
  return r;
}

}  // namespace

Result attention(Variant variant, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params) {
  uint32_t splits = params.hints.splits;
  uint32_t chunk = splits ? (uint32_t(k.shape[k.shape.size() - 2]) + splits - 1) / splits : 0;
  return run_rows(q, k, v, params, [&](const Vec& s, const std::vector<Vec>& vr, double sink) {
    return variant_row(variant, s, vr, chunk, sink);
  });
}

Result direct(const HostTensor& q, const HostTensor& k, const HostTensor& v,
              const AttentionParams& params) {
  return run_rows(q, k, v, params, [](const Vec& s, const std::vector<Vec>& vr, double sink) {
    return direct_row(s, vr, sink);
  });
}

HostTensor rope(const HostTensor& x, const RopeParams& params) {
  HostTensor out = x;
  size_t dim = size_t(x.shape.back());
  size_t seq = size_t(x.shape[x.shape.size() - 2]);
  size_t pairs = dim / 2;
  for (size_t vec = 0; vec < size_t(x.numel()) / dim; ++vec) {
    double pos = double(params.position_offset + int64_t(vec % seq));
    for (size_t i = 0; i < pairs; ++i) {
      // docs/algorithms.md, RoPE: (x_a + j x_b) e^(j p theta_i), theta_i = base^(-2i/d).
      double theta = std::pow(params.base, -2.0 * double(i) / double(dim));
      size_t a = params.layout == RopeLayout::half ? i : 2 * i;
      size_t b = params.layout == RopeLayout::half ? i + pairs : 2 * i + 1;
      double xa = x.data[vec * dim + a], xb = x.data[vec * dim + b];
      double c = std::cos(pos * theta), s = std::sin(pos * theta);
      out.data[vec * dim + a] = static_cast<float>(xa * c - xb * s);
      out.data[vec * dim + b] = static_cast<float>(xa * s + xb * c);
    }
  }
  return out;
}

}  // namespace flashvk::reference
