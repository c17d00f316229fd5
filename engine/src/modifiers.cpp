// The score modifiers' one home (flashvk/modifiers.hpp): the keys a row sees, each modifier's
// validation, its description for the front ends (modifier_table), and its encoding for the
// kernels (encode_modifiers), whose GLSL side is shaders/modifiers.glsl.
#include "flashvk/modifier_table.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "flashvk/attention.hpp"
#include "plan.hpp"

namespace flashvk {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// A JSON number, or null for what JSON cannot hold (-inf: no sink).
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

std::string json_bool(bool x) {
  return x ? "true" : "false";
}

std::string json_string(const std::string& x) {
  std::string s = "\"";
  for (char c : x)
    if (c != '"' && c != '\\' && static_cast<unsigned char>(c) >= 0x20) s += c;
  return s + "\"";
}

// The mask's shape as [Bm, Hm, Nq, Nk]; empty if it is neither that nor [Nq, Nk].
std::vector<int64_t> mask_shape4(const HostTensor& m) {
  std::vector<int64_t> shape = m.shape;
  if (shape.size() == 2) shape.insert(shape.begin(), {1, 1});
  return shape.size() == 4 ? shape : std::vector<int64_t>{};
}

// An additive [Nq, Nk] mask: 0 where causal attention sees key j of query i and `keep(j, last)`
// holds (last: the query's last key), else -inf.
template <typename Keep>
HostTensor causal_mask(const Dims& d, Keep keep) {
  Modifiers causal;
  causal.causal = true;
  HostTensor mask({d.nq, d.nk});
  for (uint32_t i = 0; i < d.nq; ++i) {
    KeyRange seen = window_keys(causal, d.nq, d.nk, i);
    for (int64_t j = 0; j < d.nk; ++j)
      if (j >= seen.end || !keep(j, seen.end - 1))
        mask.data[uint64_t(i) * d.nk + uint64_t(j)] = -kInf;
  }
  return mask;
}

using Members = std::vector<std::pair<std::string, std::string>>;

// A user-written function's name in labels: its file's name without the folders, or its role.
std::string user_name(const std::string& file, const char* role) {
  if (file.empty()) return role;
  size_t slash = file.find_last_of('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

// The table. Each entry is one modifier as every front end meets it.
std::vector<ModifierInfo> make_table() {
  using Kind = ModifierOption::Kind;
  std::vector<ModifierInfo> t;
  t.push_back(
      {"causal",
       {{"causal", "", Kind::flag, "bottom-right causal mask: query i sees keys j <= i + Nk - Nq"}},
       [](Modifiers& m, const std::string&, const OptionValue&) { m.causal = true; },
       [](const Modifiers& m) { return m.causal; },
       [](const Modifiers&) { return std::string("causal"); },
       [](const Modifiers&, const std::string& s, const std::string&) { return s; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("causal", json_bool(m.causal));
       },
       nullptr});
  t.push_back(
      {"window",
       {{"window", "L,R", Kind::integers,
         "sliding window: query i sees keys i + Nk - Nq - L .. i + Nk - Nq + R (-1: unbounded "
         "on that side; with --causal R is 0); keys outside it are never read (the fused "
         "variants)"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) {
         if (v.integers.size() != 2 || v.integers[0] < -1 || v.integers[1] < -1)
           throw Error(
               "must be L,R with integers of at least -1 (keys before and after the "
               "diagonal; -1: unbounded)");
         m.window_left = v.integers[0];
         m.window_right = v.integers[1];
       },
       [](const Modifiers& m) { return m.window_left >= 0 || m.window_right >= 0; },
       [](const Modifiers& m) {
         return "window " + std::to_string(m.window_left) + "," + std::to_string(m.window_right);
       },
       [](const Modifiers&, const std::string& s, const std::string&) { return s; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         Window w = effective_window(m);
         out.emplace_back("window",
                          "[" + std::to_string(w.left) + "," + std::to_string(w.right) + "]");
       },
       nullptr});
  t.push_back(
      {"chunk",
       {{"chunk", "C", Kind::integers,
         "chunked attention (Llama 4): query i sees only the keys of its diagonal's chunk of C, "
         "those j with j / C = (i + Nk - Nq) / C (with --causal, up to the diagonal); keys "
         "outside it are never read (the fused variants)"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) {
         if (v.integers.size() != 1 || v.integers[0] < 1 || v.integers[0] > INT32_MAX)
           throw Error("must be a positive integer (keys a chunk)");
         m.chunk_size = static_cast<uint32_t>(v.integers[0]);
       },
       [](const Modifiers& m) { return m.chunk_size > 0; },
       [](const Modifiers& m) { return "chunk " + std::to_string(m.chunk_size); },
       [](const Modifiers&, const std::string& s, const std::string&) { return s; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("chunk", std::to_string(m.chunk_size));
       },
       // Chunks of Nk/8 keys on causal attention: an eighth of the pairs a row sees, at most.
       [](const Modifiers& base, const Dims& d) {
         Modifiers e = base;
         e.chunk_size = std::max(1u, d.nk / 8);
         return std::vector<Modifiers>{e};
       }});
  t.push_back({"softcap",
               {{"softcap", "C", Kind::number,
                 "logit softcapping: s = C tanh(s / C), before ALiBi (Gemma 2)"}},
               [](Modifiers& m, const std::string&, const OptionValue& v) {
                 if (!(v.number > 0)) throw Error("must be positive");
                 m.softcap = static_cast<float>(v.number);
               },
               [](const Modifiers& m) { return m.softcap > 0; },
               [](const Modifiers& m) { return "softcap " + number_text(m.softcap); },
               [](const Modifiers&, const std::string& s, const std::string&) {
                 return "c tanh(" + s + " / c)";
               },
               [](const Modifiers& m, const TracedRow*, Members& out) {
                 out.emplace_back("softcap", json_number(m.softcap));
               },
               [](const Modifiers& base, const Dims&) {
                 Modifiers e = base;
                 e.softcap = 30.0f;
                 return std::vector<Modifiers>{e};
               }});
  // User-written attention (flashvk::flex compiles it): after softcap, before ALiBi.
  t.push_back(
      {"score_mod",
       {{"score-mod", "FILE", Kind::source,
         "a GLSL file defining float score_mod(float score, int b, int h, int q_idx, int "
         "kv_idx), which turns each scaled score (after softcap, before ALiBi and the mask) into "
         "its own; it may read FLEX_NQ, FLEX_NK and flex_table[] (--mod-table)"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) {
         m.score_mod = v.text;
         m.score_mod_name = v.file;
       },
       [](const Modifiers& m) { return !m.score_mod.empty(); },
       [](const Modifiers& m) { return "score_mod " + user_name(m.score_mod_name, "score_mod"); },
       [](const Modifiers&, const std::string& s, const std::string& key) {
         return "score_mod(" + s + ", b, h, i, " + key + ")";
       },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("score_mod", m.score_mod.empty()
                                           ? "null"
                                           : json_string(user_name(m.score_mod_name, "score_mod")));
       },
       // ALiBi written as a score_mod, its slopes in the table: what the built-in costs beside it.
       [](const Modifiers& base, const Dims& d) {
         Modifiers e = base;
         e.score_mod = R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score - flex_table[h] * float(abs(q_idx + FLEX_NK - FLEX_NQ - kv_idx));
})";
         e.score_mod_name = "alibi.glsl";
         std::vector<float> slopes = alibi_slopes(d.heads, 8.0f);
         e.flex_table = HostTensor({static_cast<int64_t>(d.heads)});
         e.flex_table.data = slopes;
         int64_t nq = d.nq, nk = d.nk;
         e.score_twin = [=](double s, int, int h, int i, int j) {
           return s - double(slopes[size_t(h)]) * double(std::abs(i + nk - nq - j));
         };
         return std::vector<Modifiers>{e};
       }});
  t.push_back(
      {"mask_mod",
       {{"mask-mod", "FILE", Kind::source,
         "a GLSL file defining bool mask_mod(int b, int h, int q_idx, int kv_idx): false hides "
         "key kv_idx from query q_idx; it may read FLEX_NQ, FLEX_NK and flex_table[]"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) {
         m.mask_mod = v.text;
         m.mask_mod_name = v.file;
       },
       [](const Modifiers& m) { return !m.mask_mod.empty(); },
       [](const Modifiers& m) { return "mask_mod " + user_name(m.mask_mod_name, "mask_mod"); },
       [](const Modifiers&, const std::string& s, const std::string&) { return s; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("mask_mod", m.mask_mod.empty()
                                          ? "null"
                                          : json_string(user_name(m.mask_mod_name, "mask_mod")));
       },
       // Documents of Nk / 8 keys packed in one sequence, causal within each, their ids in the
       // table (FlexAttention's document masking).
       [](const Modifiers& base, const Dims& d) {
         Modifiers e = base;
         e.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;
  return q_pos >= 0 && flex_table[kv_idx] == flex_table[q_pos];
})";
         e.mask_mod_name = "documents.glsl";
         uint32_t length = std::max(1u, d.nk / 8);
         e.flex_table = HostTensor({static_cast<int64_t>(d.nk)});
         for (uint32_t j = 0; j < d.nk; ++j) e.flex_table.data[j] = float(j / length);
         int64_t nq = d.nq, nk = d.nk;
         e.mask_twin = [=](int, int, int i, int j) {
           int64_t q = i + nk - nq;
           return q >= 0 && j / length == q / length;
         };
         return std::vector<Modifiers>{e};
       }});
  t.push_back(
      {"mod_table",
       {{"mod-table", "FILE", Kind::values,
         "the table --score-mod and --mask-mod read as flex_table[] (.npy of float32, read flat: "
         "a bias per relative position, a document id per key, ...)"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) { m.flex_table = v.table; },
       [](const Modifiers& m) { return !m.flex_table.data.empty(); },
       [](const Modifiers& m) { return "table " + shape_string(m.flex_table.shape); },
       [](const Modifiers&, const std::string& s, const std::string&) { return s; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("mod_table", m.flex_table.data.empty()
                                           ? "null"
                                           : json_string(shape_string(m.flex_table.shape)));
       },
       nullptr});
  t.push_back(
      {"alibi",
       {{"alibi-max-bias", "B", Kind::number,
         "ALiBi with ggml's slopes from max_bias B: s -= slope_h |i + Nk - Nq - j|"},
        {"alibi-slopes", "FILE", Kind::values, "ALiBi with these slopes (.npy, [H] or [B, H])"}},
       [](Modifiers& m, const std::string& option, const OptionValue& v) {
         if (option == "alibi-max-bias") {
           if (!(v.number > 0)) throw Error("must be positive");
           m.alibi_max_bias = static_cast<float>(v.number);
           return;
         }
         if (v.table.shape.empty() || v.table.shape.size() > 2)
           throw Error("must hold [H] or [B, H] values, got shape " + shape_string(v.table.shape));
         m.alibi_slopes = v.table.data;
       },
       [](const Modifiers& m) { return m.alibi(); },
       [](const Modifiers&) { return std::string("alibi"); },
       [](const Modifiers&, const std::string& s, const std::string& key) {
         return s + " - slope |diag - " + key + "|";
       },
       [](const Modifiers& m, const TracedRow* row, Members& out) {
         if (row)
           out.emplace_back("alibi_slope",
                            json_number(alibi_slope(m, row->heads, row->batch, row->head)));
         else
           out.emplace_back("alibi", json_bool(m.alibi()));
       },
       [](const Modifiers& base, const Dims&) {
         Modifiers e = base;
         e.alibi_max_bias = 8.0f;
         return std::vector<Modifiers>{e};
       }});
  t.push_back(
      {"sinks",
       {{"sinks", "FILE", Kind::values,
         "attention sinks (gpt-oss): one logit per query head (.npy, [H]), in the softmax's "
         "denominator only"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) {
         if (v.table.shape.size() != 1)
           throw Error("must hold [H] values, got shape " + shape_string(v.table.shape));
         m.sinks = v.table.data;
       },
       [](const Modifiers& m) { return !m.sinks.empty(); },
       [](const Modifiers&) { return std::string("sinks"); },
       [](const Modifiers&, const std::string& s, const std::string&) {
         return s;
       },  // in the denominator only
       [](const Modifiers& m, const TracedRow* row, Members& out) {
         if (row)
           out.emplace_back("sink", m.sinks.empty() ? "null" : json_number(m.sinks.at(row->head)));
         else
           out.emplace_back("sinks", json_bool(!m.sinks.empty()));
       },
       [](const Modifiers& base, const Dims& d) {
         Modifiers e = base;
         for (uint32_t h = 0; h < d.heads; ++h) e.sinks.push_back(0.5f * float(h % 8) - 1.0f);
         return std::vector<Modifiers>{e};
       }});
  t.push_back(
      {"mask",
       {{"mask", "FILE", Kind::mask,
         "a mask (.npy, [Nq, Nk] or [B or 1, H or 1, Nq, Nk]): float32 is added to the scores "
         "(-inf hides a key), bool as PyTorch's attn_mask (true attends)"}},
       [](Modifiers& m, const std::string&, const OptionValue& v) { m.mask = v.table; },
       [](const Modifiers& m) { return m.has_mask(); },
       [](const Modifiers& m) {
         return "mask " +
                (m.mask_name.empty() ? shape_string(m.mask.shape) : "(" + m.mask_name + ")");
       },
       [](const Modifiers&, const std::string& s, const std::string&) { return s + " + mask"; },
       [](const Modifiers& m, const TracedRow*, Members& out) {
         out.emplace_back("mask", json_bool(m.has_mask()));
         if (!m.mask_name.empty()) out.emplace_back("mask_name", json_string(m.mask_name));
       },
       // In causal's place: one of the causal pattern (every row sees the base's pairs), and a
       // sparse one whose hidden tiles the kernels skip: the first Nk/32 keys and the Nk/8 up
       // to the diagonal (at N = 2048, 64 global tokens and a window of 256: 29% of the pairs).
       [](const Modifiers& base, const Dims& d) {
         Modifiers all = base, sparse = base;
         all.causal = sparse.causal = false;
         all.mask = causal_mask(d, [](int64_t, int64_t) { return true; });
         all.mask_name = "causal";
         const int64_t global = d.nk / 32, window = d.nk / 8;
         sparse.mask = causal_mask(
             d, [&](int64_t j, int64_t last) { return j < global || j > last - window; });
         sparse.mask_name = std::to_string(global) + " global + window " + std::to_string(window);
         return std::vector<Modifiers>{all, sparse};
       }});
  t.push_back({"key_mask",
               {},  // the API's alone: a padding mask per batch
               [](Modifiers&, const std::string&, const OptionValue&) {},
               [](const Modifiers& m) { return !m.key_mask.empty(); },
               [](const Modifiers&) { return std::string("key mask"); },
               [](const Modifiers&, const std::string& s, const std::string&) { return s; },
               [](const Modifiers&, const TracedRow*, Members&) {},
               nullptr});
  return t;
}

}  // namespace

const std::vector<ModifierInfo>& modifier_table() {
  static const std::vector<ModifierInfo> table = make_table();
  return table;
}

Window effective_window(const Modifiers& m) {
  return {m.window_left < 0 ? -1 : m.window_left,
          m.causal ? 0 : (m.window_right < 0 ? -1 : m.window_right)};
}

KeyRange window_keys(const Modifiers& m, uint32_t nq, uint32_t nk, uint32_t i) {
  Window w = effective_window(m);
  int64_t diag = int64_t(i) + int64_t(nk) - int64_t(nq);
  int64_t lo = w.left < 0 ? 0 : diag - w.left, hi = w.right < 0 ? nk : diag + w.right + 1;
  if (m.chunk_size > 0) {  // the diagonal's chunk (none when the diagonal is before key 0)
    int64_t c = m.chunk_size, first = diag >= 0 ? diag / c * c : -c;
    lo = std::max(lo, first);
    hi = std::min(hi, first + c);
  }
  KeyRange r;
  r.begin = std::clamp<int64_t>(lo, 0, nk);
  r.end = std::clamp<int64_t>(hi, r.begin, nk);
  return r;
}

std::vector<float> alibi_slopes(uint32_t heads, float max_bias) {
  uint32_t n = 1;
  while (n * 2 <= heads) n *= 2;  // 2^floor(log2 H)
  double m0 = std::pow(2.0, -double(max_bias) / n), m1 = std::pow(2.0, -double(max_bias) / (2 * n));
  std::vector<float> slopes(heads);
  for (uint32_t h = 0; h < heads; ++h)
    slopes[h] = static_cast<float>(h < n ? std::pow(m0, h + 1) : std::pow(m1, 2 * (h - n) + 1));
  return slopes;
}

float alibi_slope(const Modifiers& m, uint32_t heads, uint32_t b, uint32_t h) {
  if (!m.alibi_slopes.empty())
    return m.alibi_slopes[m.alibi_slopes.size() == heads ? h : size_t(b) * heads + h];
  return m.alibi_max_bias > 0 ? alibi_slopes(heads, m.alibi_max_bias)[h] : 0.0f;
}

void check_modifiers(const Modifiers& m, const Dims& d) {
  for (auto [w, name] : {std::pair{m.window_left, "window_left"}, {m.window_right, "window_right"}})
    if (w < -1)  // checked even where causal overrides it
      throw Error(std::string(name) + " must be -1 (unbounded) or at least 0; got " +
                  std::to_string(w));
  if (m.chunk_size > INT32_MAX)
    throw Error("chunk_size must be at most 2^31 - 1; got " + std::to_string(m.chunk_size));
  if (!std::isfinite(m.softcap) || m.softcap < 0)
    throw Error("softcap must be 0 (off) or a positive number; got " + std::to_string(m.softcap));
  if (!std::isfinite(m.alibi_max_bias) || m.alibi_max_bias < 0)
    throw Error("alibi_max_bias must be 0 (off) or a positive number; got " +
                std::to_string(m.alibi_max_bias));
  if (!m.alibi_slopes.empty() && m.alibi_max_bias > 0)
    throw Error("give ALiBi's slopes or its max_bias, not both");
  uint64_t rows = uint64_t(d.batch) * d.heads;
  if (!m.alibi_slopes.empty() && m.alibi_slopes.size() != d.heads && m.alibi_slopes.size() != rows)
    throw Error("alibi_slopes has " + std::to_string(m.alibi_slopes.size()) +
                " entries; expected one per query head (H = " + std::to_string(d.heads) +
                ") or per batch and head (B * H = " + std::to_string(rows) + ")");
  if (!m.sinks.empty() && m.sinks.size() != d.heads)
    throw Error("sinks has " + std::to_string(m.sinks.size()) +
                " entries; expected one per query head (H = " + std::to_string(d.heads) + ")");
  for (const std::vector<float>* values : {&m.alibi_slopes, &m.sinks})
    for (float x : *values)
      if (!std::isfinite(x))
        throw Error(std::string(values == &m.alibi_slopes ? "alibi_slopes" : "sinks") +
                    " must be finite numbers; got " + std::to_string(x));
  if (!m.key_mask.empty() && m.key_mask.size() != uint64_t(d.batch) * d.nk)
    throw Error("key_mask has " + std::to_string(m.key_mask.size()) +
                " entries; expected batch * Nk = " + std::to_string(uint64_t(d.batch) * d.nk));
  if (!m.flex_table.data.empty() && !m.user_functions())
    throw Error("flex_table is given without a score_mod or mask_mod to read it");
  if (int64_t(m.flex_table.data.size()) != numel(m.flex_table.shape) && !m.flex_table.shape.empty())
    throw Error("flex_table has " + std::to_string(m.flex_table.data.size()) +
                " values for shape " + shape_string(m.flex_table.shape));
  if (!m.has_mask()) return;
  std::vector<int64_t> shape = mask_shape4(m.mask);
  if (shape.empty() || shape[2] != d.nq || shape[3] != d.nk ||
      (shape[0] != 1 && shape[0] != d.batch) || (shape[1] != 1 && shape[1] != d.heads))
    throw Error("mask has shape " + shape_string(m.mask.shape) + "; expected [Nq, Nk] = [" +
                std::to_string(d.nq) + ", " + std::to_string(d.nk) +
                "] or [B or 1, H or 1, Nq, Nk]");
  if (int64_t(m.mask.data.size()) != numel(m.mask.shape))
    throw Error("mask has " + std::to_string(m.mask.data.size()) + " values for shape " +
                shape_string(m.mask.shape));
  for (size_t x = 0; x < m.mask.data.size(); ++x) {
    float v = m.mask.data[x];
    if (std::isnan(v) || v == kInf)
      throw Error("mask holds " + std::string(std::isnan(v) ? "NaN" : "+inf") + " in row " +
                  std::to_string(x / d.nk) + ", key " + std::to_string(x % d.nk) +
                  "; it takes finite values and -inf (hidden)");
  }
}

std::string modifier_text(const Modifiers& mods) {
  std::string s;
  for (const ModifierInfo& info : modifier_table())
    if (info.active(mods)) {
      // Appended apart, not (sep + text): GCC 12's -O3 flags that with a false -Wrestrict (its
      // bug 105329), which an application's Release build would show.
      if (!s.empty()) s += ' ';
      s += info.text(mods);
    }
  return s;
}

std::string score_formula(const Modifiers& mods, const std::string& key) {
  std::string s = "scale q.k_" + key;
  for (const ModifierInfo& info : modifier_table())
    if (info.active(mods)) s = info.formula(mods, s, key);
  return s;
}

std::vector<std::pair<std::string, std::string>> modifier_json(const Modifiers& mods,
                                                               const TracedRow* row) {
  Members out;
  for (const ModifierInfo& info : modifier_table()) info.json(mods, row, out);
  return out;
}

namespace detail {

namespace {

// What the mask's encoding reads and writes of the plan being built (encode_modifiers).
struct MaskEncoding {
  const Dims& dims;
  const HostTensor& mask;
  bool fused;      // the fused kernels' tile bitmap is wanted
  uint64_t range;  // the device's maxStorageBufferRange
  Push& push;
  Spec& spec;
};

// The fused kernels' tile bitmap (modifiers.glsl next_seen_tile): for each workgroup (x: a block
// of spec.block() packed rows, y: batch and KV head, as plan_fused and splitkv dispatch) a bit
// per tile of spec.bc keys, set where a row of the block has a finite mask entry in the tile.
// Every invocation of a workgroup reads the same bit (lanes: every lane of a cluster, which walks
// its own tiles), so fully masked tiles are skipped together, in the middle of a row's keys too
// (the ranges cut only the ends), in every layout.
void set_mask_tiles(MaskEncoding& plan, std::vector<uint32_t>& words,
                    const std::vector<int64_t>& shape) {
  const Dims& d = plan.dims;
  const HostTensor& m = plan.mask;
  uint64_t tiles = (d.nk + plan.spec.bc - 1) / plan.spec.bc, per_row = (tiles + 31) / 32;
  uint64_t mask_rows = uint64_t(shape[0]) * uint64_t(shape[1]) * d.nq;
  std::vector<uint32_t> row_bits(mask_rows * per_row, 0);
  for (uint64_t r = 0; r < mask_rows; ++r)
    for (uint32_t j = 0; j < d.nk; ++j)
      if (m.data[r * d.nk + j] != -kInf) {
        uint64_t t = j / plan.spec.bc;
        row_bits[r * per_row + t / 32] |= 1u << (t % 32);
      }
  uint32_t group = d.heads / d.kv_heads, block = plan.spec.block();
  uint64_t packed = uint64_t(group) * d.nq, blocks = (packed + block - 1) / block;
  plan.push.mask_tiles = static_cast<uint32_t>(words.size());
  words.resize(words.size() + uint64_t(d.batch) * d.kv_heads * blocks * per_row, 0);
  uint32_t* out = words.data() + plan.push.mask_tiles;
  for (uint32_t b = 0; b < d.batch; ++b)
    for (uint32_t hkv = 0; hkv < d.kv_heads; ++hkv)
      for (uint64_t x = 0; x < blocks; ++x, out += per_row)
        for (uint64_t r = x * block; r < std::min(packed, (x + 1) * block); ++r) {
          uint64_t h = hkv * group + r / d.nq, i = r % d.nq;
          uint64_t row = b * plan.push.mask_bstride + h * plan.push.mask_hstride + i;
          for (uint64_t w = 0; w < per_row; ++w) out[w] |= row_bits[row * per_row + w];
        }
}

// The additive mask (MOD_MASK): per mask row its first and last+1 finite key, so that keys
// outside are never read; the fused kernels' tile bitmap; then the values, rows padded to 4 keys
// with -inf (RGBA texels), from 256 bytes on (the largest minTexelBufferOffsetAlignment there
// is): register tiles read them through a texel view from there to the end.
void encode_mask(MaskEncoding& plan, std::vector<uint32_t>& words) {
  const Dims& d = plan.dims;
  const HostTensor& m = plan.mask;
  std::vector<int64_t> shape = mask_shape4(m);
  uint64_t rows = uint64_t(shape[0]) * uint64_t(shape[1]) * d.nq;
  uint32_t stride = (d.nk + 3) / 4 * 4;
  uint64_t range = plan.range;
  auto check_size = [&](uint64_t total, const char* what) {
    if (total * 4 > range)
      throw Error("mask of shape " + shape_string(m.shape) + what + " needs " +
                  std::to_string(total * 4) + " bytes, more than the device's " +
                  "maxStorageBufferRange (" + std::to_string(range) + " bytes)");
  };
  check_size(words.size() + 2 * rows + 64 + rows * stride, "");
  plan.push.mask_bstride = shape[0] == 1 ? 0 : static_cast<uint32_t>(shape[1]) * d.nq;
  plan.push.mask_hstride = shape[1] == 1 ? 0 : d.nq;
  plan.push.mask_ranges = static_cast<uint32_t>(words.size());
  words.resize(words.size() + 2 * rows);
  for (uint64_t r = 0; r < rows; ++r) {
    uint32_t first = d.nk, last = 0;  // the row's finite keys: [first, last)
    for (uint32_t j = 0; j < d.nk; ++j)
      if (m.data[r * d.nk + j] != -kInf) first = std::min(first, j), last = j + 1;
    words[plan.push.mask_ranges + 2 * r] = first;
    words[plan.push.mask_ranges + 2 * r + 1] = last;
  }
  if (plan.fused) set_mask_tiles(plan, words, shape);
  plan.push.mask_values = static_cast<uint32_t>((words.size() + 63) / 64 * 64);
  uint64_t total = plan.push.mask_values + rows * stride;
  check_size(total, " with its tile bitmap");
  words.resize(total, std::bit_cast<uint32_t>(-kInf));
  for (uint64_t r = 0; r < rows; ++r)
    std::memcpy(words.data() + plan.push.mask_values + r * stride, m.data.data() + r * d.nk,
                d.nk * 4);
}

}  // namespace

// The user functions' flex_table[] and after it the word a read past it sets (flex.cpp's
// flex_table_at; Plan::check_user_functions), in a buffer of the plan's own.
void Plan::upload_flex_table() {
  std::vector<float> table = params.mods.flex_table.data;
  table.push_back(0.0f);
  flex_table = scratch(table.size() * 4);
  flex_table.write(table.data(), table.size() * 4);
}

void spec_modifiers(const Modifiers& m, Spec& spec) {
  if (m.softcap > 0) spec.mods |= kModSoftcap;
  if (m.softcap > kSoftcapFastMax) spec.mods |= kModSoftcapWide;
  if (m.alibi()) spec.mods |= kModAlibi;
  if (!m.sinks.empty()) spec.mods |= kModSinks;
  if (m.has_mask()) spec.mods |= kModMask | kModTiles;
  if (!m.mask_mod.empty()) spec.mods |= kModTiles;  // flex_tiles.comp's bitmap (plan_flex_tiles)
  if (!m.key_mask.empty()) spec.key_mask = true;
}

void encode_modifiers(Plan& plan, std::vector<uint32_t>& words) {
  const Modifiers& m = plan.params.mods;
  const Dims& d = plan.dims;
  check_modifiers(m, d);  // Spec's part of them is set with the tiling (call_spec)
  // The window, causal folded in, each side at most the keys there can be.
  auto side = [&](int64_t w) {
    return w < 0 ? -1 : static_cast<int32_t>(std::min<int64_t>(w, int64_t(plan.most_keys) + d.nq));
  };
  Window w = effective_window(m);
  plan.push.window_left = side(w.left);
  plan.push.window_right = side(w.right);
  plan.push.chunk_size = m.chunk_size;
  if (m.softcap > 0) {
    plan.push.softcap = m.softcap;
  }
  // Per (batch, head): the ALiBi slope and the sink logit, in one small buffer.
  if (m.alibi() || !m.sinks.empty()) {
    uint64_t rows = uint64_t(d.batch) * d.heads;
    std::vector<float> table(2 * rows, 0.0f);
    for (uint64_t bh = 0; bh < rows; ++bh) {
      uint32_t b = static_cast<uint32_t>(bh / d.heads), h = static_cast<uint32_t>(bh % d.heads);
      table[2 * bh] = alibi_slope(m, d.heads, b, h);
      if (!m.sinks.empty()) table[2 * bh + 1] = m.sinks[h];
    }
    plan.heads = plan.scratch(table.size() * 4);
    plan.heads.write(table.data(), table.size() * 4);
    plan.bindings[kHeads] = plan.heads.handle();
  }
  // The user functions' flex_table[], a buffer of its own (binding kFlexTableBinding), and after
  // it a word a read past the table sets (flex.cpp's flex_table_at; Plan::check_user_functions).
  if (m.user_functions()) plan.upload_flex_table();
  // The key mask [B, Nk] from word 0 of the small tables (modifiers.glsl key_visible).
  if (!m.key_mask.empty()) {
    words.assign(m.key_mask.begin(), m.key_mask.end());
  }
  if (m.has_mask()) {
    MaskEncoding encoding{d,
                          m.mask,
                          variant_info(plan.params.variant).fused,
                          plan.ctx.device().max_storage_buffer_range,
                          plan.push,
                          plan.spec};
    encode_mask(encoding, words);
    plan.tile_keys = d.nk;  // set_mask_tiles' rows (a plan with a mask attends over its Nk)
  }
  // mask_mod's tile bitmap: room for it where an additive mask has not made one (the same
  // layout: set_mask_tiles), filled on the device by flex_tiles.comp (plan_flex_tiles).
  if (!m.mask_mod.empty() && (plan.spec.mods & kModTiles)) {  // the fused variants
    if (!m.has_mask()) {  // over the most keys a recording may attend over (set_keys)
      plan.tile_keys = plan.most_keys;
      uint64_t tiles = (plan.tile_keys + plan.spec.bc - 1) / plan.spec.bc,
               per_row = (tiles + 31) / 32;
      uint64_t packed = uint64_t(d.heads / d.kv_heads) * d.nq, block = plan.spec.block();
      plan.push.mask_tiles = static_cast<uint32_t>(words.size());
      words.resize(words.size() +
                   uint64_t(d.batch) * d.kv_heads * ((packed + block - 1) / block) * per_row);
    }
    plan.flex_tiles = true;
  }
}

Spec flex_tiles_spec(const Spec& attention) {
  Spec spec = attention;  // the attention kernel's tiles, rows and modifiers
  spec.layout = TileLayout::shared;
  spec.workgroup = 32;
  spec.rows = 1;
  spec.lanes = 1;
  spec.tile_rows = attention.block();
  return spec;
}

void plan_flex_tiles(Plan& plan, bool each_run) {
  const Dims& d = plan.dims;
  Spec spec = flex_tiles_spec(plan.spec);
  Bindings b = plan.bindings;
  b[kTileBits] = plan.tables.handle();  // flex_tiles.comp writes the bitmap there
  uint32_t tiles = (plan.tile_keys + plan.spec.bc - 1) / plan.spec.bc, words = (tiles + 31) / 32;
  uint64_t packed = uint64_t(d.heads / d.kv_heads) * d.nq;
  auto blocks = static_cast<uint32_t>((packed + spec.tile_rows - 1) / spec.tile_rows);
  // The length each word was made for, none yet: a recording's pass keeps the words of a length
  // it has made them for (a decode loop resubmitted without set_keys).
  plan.flex_stamps = plan.scratch(uint64_t(words) * blocks * d.batch * d.kv_heads * 4);
  plan.flex_stamps.fill(0xffffffffu);
  b[kScratch1] = plan.flex_stamps.handle();
  VkPipeline pass = plan.impl.user_pipeline("flex_tiles", plan.params.mods, spec);
  std::array<uint32_t, 3> groups = {words, blocks, d.batch * d.kv_heads};
  if (each_run) {  // from the keys of each run (the lengths it reads), before the kernels
    plan.add(pass, plan.make_set(b), groups);
    plan.add_barrier();
    return;
  }
  // Once, now: the bitmap holds while the functions, the table and Nk do, which this plan
  // fixes, so every run of a recording reuses it.
  DispatchList once(plan.impl);
  VkDescriptorSet set =
      once.make_set(b, plan.lengths.handle(), plan.texel_views, plan.flex_range());
  once.add(pass, set, groups, &plan.push, sizeof(plan.push));
  plan.impl.submit_and_wait([&](VkCommandBuffer cmd) { once.record(cmd); });
}

std::vector<float> evaluate_user_functions(Context& ctx, const Modifiers& m, uint32_t nq,
                                           uint32_t nk, const std::vector<float>& points) {
  const uint64_t n = points.size() / 5;
  if (n == 0) return {};
  if (n > UINT32_MAX) throw Error("flex: too many points to evaluate at once");
  Plan plan(ctx);
  plan.params.mods = m;
  plan.upload_flex_table();
  Buffer in = plan.scratch(points.size() * 4), out = plan.scratch(n * 2 * 4);
  in.write(points.data(), points.size() * 4);
  Bindings b;
  b.fill(ctx.impl().dummy.handle());
  b[kScratch1] = in.handle();
  b[kScratch2] = out.handle();
  Push push{};
  push.batch = push.heads = push.kv_heads = 1;
  push.nq = nq;
  push.nk = nk;
  push.kv_keys = static_cast<uint32_t>(n);
  Spec spec;
  spec.workgroup = 64;
  uint64_t groups = (n + 63) / 64;
  uint64_t across = std::min<uint64_t>(groups, ctx.device().max_workgroup_count[0]);
  plan.add(
      ctx.impl().user_pipeline("flex_eval", m, spec), plan.make_set(b),
      {static_cast<uint32_t>(across), static_cast<uint32_t>((groups + across - 1) / across), 1},
      &push, sizeof(push));
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { plan.record(cmd); });
  plan.check_user_functions();
  std::vector<float> values = Plan::read_floats(out);
  values.resize(n * 2);
  return values;
}

}  // namespace detail

}  // namespace flashvk
