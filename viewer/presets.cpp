// Built-in inputs: the shipped sample, random inputs, and the cases that break naive code.
#include <cmath>
#include <map>
#include <random>

#include "model.hpp"
#include "npy.hpp"

namespace flashvk::viewer {
namespace {

HostTensor gaussian(std::vector<int64_t> shape, uint32_t seed, float sigma = 1.0f) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  for (float& x : t.data) x = dist(rng);
  return t;
}

// d = 2 with q = (1, 0): the scores are exactly the given values (scale 1).
Inputs from_scores(const std::string& name, const std::vector<float>& s, uint32_t dv) {
  Inputs in;
  in.name = name;
  int64_t n = int64_t(s.size());
  in.q = HostTensor({1, 1, 1, 2}, {1.0f, 0.0f});
  in.k = HostTensor({1, 1, n, 2});
  for (int64_t j = 0; j < n; ++j) in.k.data[size_t(2 * j)] = s[size_t(j)];
  in.v = gaussian({1, 1, n, dv}, 3);
  in.params.scale = 1.0f;
  return in;
}

const std::map<std::string, std::string>& descriptions() {
  static const std::map<std::string, std::string> d = {
      {"sample",
       "the shipped sample (assets/sample): 2 heads, 24 queries, 96 keys, d = 16, causal"},
      {"huge-logits", "scores in the thousands: exp() overflows without a max"},
      {"falling-rising", "scores fall to -2000 then rise: the literal FLASH-D ln w underflows"},
      {"sink", "key 0 dominates every row (attention sink)"},
      {"masked-mid-row", "keys masked in the middle of the row, the first key too"},
      {"fully-masked-row", "causal with Nq > Nk: the first rows see no key (zeros, LSE -inf)"},
      {"empty-split", "splitkv with one chunk fully masked: it must add nothing to the merge"},
      {"sliding-window", "causal with a window of 32 keys: tiles before the window are never read"},
      {"sink-logit",
       "an attention sink (gpt-oss): a logit in the denominator only, the state's start"},
      {"softcap", "logit softcapping (Gemma 2): s = c tanh(s / c) squeezes scores above c = 5"},
      {"fp16-overflow", "fp16 inputs with scores up to 16: e^s passes fp16's 65504 above s = 11.1"},
      {"q4-kv",
       "K and V in ggml's q4_0 (4 bits a value, a scale per 32): exact kernels, lossy storage"},
      {"documents",
       "three documents packed in one sequence, each seeing itself causally: a mask_mod in GLSL"},
  };
  return d;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {
      "sample",         "huge-logits",      "falling-rising", "sink",
      "masked-mid-row", "fully-masked-row", "empty-split",    "fp16-overflow",
      "sliding-window", "sink-logit",       "softcap",        "q4-kv",
#ifdef FLASHVK_VIEWER_FLEX
      "documents",
#endif
  };
  return names;
}

std::string preset_description(const std::string& name) {
  auto it = descriptions().find(name);
  return it == descriptions().end() ? "" : it->second;
}

Inputs make_random(const RandomSpec& r) {
  Inputs in;
  in.name = "random";
  in.q = gaussian({1, r.heads, r.nq, r.d}, uint32_t(r.seed));
  in.k = gaussian({1, r.heads, r.nk, r.d}, uint32_t(r.seed) + 1);
  in.v = gaussian({1, r.heads, r.nk, r.d}, uint32_t(r.seed) + 2);
  if (r.scale > 0) in.params.scale = r.scale;
  in.params.mods.causal = r.causal;
  in.row = uint32_t(r.nq - 1);
  return in;
}

Inputs make_preset(const std::string& name, const std::string& assets) {
  Inputs in;
  if (name == "sample") {
    in.name = name;
    in.q = npy::read(assets + "/sample/q.npy", "Q");
    in.k = npy::read(assets + "/sample/k.npy", "K");
    in.v = npy::read(assets + "/sample/v.npy", "V");
    in.params.mods.causal = true;
    in.row = 20;
  } else if (name == "huge-logits") {
    in.name = name;
    in.q = gaussian({1, 1, 8, 32}, 1, 10.0f);
    in.k = gaussian({1, 1, 160, 32}, 2, 10.0f);
    in.v = gaussian({1, 1, 160, 8}, 3);
    in.params.scale = 1.0f;
    in.row = 3;
  } else if (name == "falling-rising") {
    std::vector<float> s;
    for (int j = 0; j < 160; ++j) s.push_back(-12.5f * float(j));
    for (int j = 0; j < 80; ++j) s.push_back(-2000.0f + 25.5f * float(j));
    in = from_scores(name, s, 6);
  } else if (name == "sink") {
    in.name = name;
    in.q = gaussian({1, 1, 16, 16}, 4);
    for (float& x : in.q.data) x = std::abs(x) + 0.5f;
    in.k = gaussian({1, 1, 120, 16}, 5);
    for (int c = 0; c < 16; ++c) in.k.data[size_t(c)] = 6.0f;
    in.v = gaussian({1, 1, 120, 8}, 6);
    in.row = 15;
  } else if (name == "masked-mid-row") {
    in.name = name;
    in.q = gaussian({1, 1, 4, 16}, 7);
    in.k = gaussian({1, 1, 160, 16}, 8);
    in.v = gaussian({1, 1, 160, 8}, 9);
    in.params.mods.key_mask.assign(160, 1);
    for (int j = 0; j < 160; ++j)
      if (j == 0 || (j >= 40 && j < 90) || j % 9 == 4) in.params.mods.key_mask[size_t(j)] = 0;
  } else if (name == "fully-masked-row") {
    in.name = name;
    in.q = gaussian({1, 1, 40, 16}, 10);
    in.k = gaussian({1, 1, 24, 16}, 11);
    in.v = gaussian({1, 1, 24, 8}, 12);
    in.params.mods.causal = true;
    in.row = 3;
  } else if (name == "empty-split") {
    in.name = name;
    in.q = gaussian({1, 1, 2, 16}, 13);
    in.k = gaussian({1, 1, 256, 16}, 14);
    in.v = gaussian({1, 1, 256, 8}, 15);
    in.params.hints.splits = 4;
    in.needs = {Variant::splitkv};  // its lesson is the chunk table of the Output panel
    in.params.mods.key_mask.assign(256, 1);
    for (int j = 64; j < 128; ++j) in.params.mods.key_mask[size_t(j)] = 0;
  } else if (name == "sliding-window") {
    // Query 150 sees keys 119..150 (window 31, 0): the kernels walk only the tiles that hold them.
    in.name = name;
    in.q = gaussian({1, 1, 160, 16}, 21);
    in.k = gaussian({1, 1, 160, 16}, 22);
    in.v = gaussian({1, 1, 160, 8}, 23);
    in.params.mods.causal = true;
    in.params.mods.window_left = 31;
    in.row = 150;
  } else if (name == "documents") {
    // Documents of 64, 86 and 42 tokens packed in one sequence (their ids in flex_table), each
    // causal within itself: query 120 of the second sees keys 64..120.
    in.name = name;
    in.q = gaussian({1, 1, 192, 16}, 61);
    in.k = gaussian({1, 1, 192, 16}, 62);
    in.v = gaussian({1, 1, 192, 8}, 63);
    Modifiers& m = in.params.mods;
    m.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;  // the query's token
  return kv_idx <= q_pos && flex_table[kv_idx] == flex_table[q_pos];
})";
    m.mask_mod_name = "documents.glsl";
    m.flex_table = HostTensor({192});
    for (int j = 0; j < 192; ++j)
      m.flex_table.data[size_t(j)] = float(j < 64 ? 0 : j < 150 ? 1 : 2);
    std::vector<float> ids = m.flex_table.data;
    m.mask_twin = [ids](int, int, int i, int j) {  // the reference's float64 twin (Nq = Nk)
      return j <= i && ids[size_t(j)] == ids[size_t(i)];
    };
    in.row = 120;
  } else if (name == "sink-logit") {
    // The sink (2.0) is above most scores: it takes a large share of the denominator, and every
    // recurrence starts from it (m = 2, l = 1; FLASH-D: L = 2) instead of from nothing.
    in.name = name;
    in.q = gaussian({1, 1, 8, 16}, 31);
    in.k = gaussian({1, 1, 64, 16}, 32);
    in.v = gaussian({1, 1, 64, 8}, 33);
    in.params.mods.sinks = {2.0f};
    in.row = 5;
  } else if (name == "softcap") {
    // Scores up to about +-20, capped at c = 5: the largest ones are squeezed to just under 5.
    in.name = name;
    in.q = gaussian({1, 1, 8, 16}, 41);
    in.k = gaussian({1, 1, 96, 16}, 42);
    in.v = gaussian({1, 1, 96, 8}, 43);
    in.params.scale = 1.25f;
    in.params.mods.softcap = 5.0f;
    in.row = 2;
  } else if (name == "q4-kv") {
    // d = dv = 32: one q4_0 block a key row, 16 levels between -8 d and 7 d.
    in.name = name;
    in.q = gaussian({1, 1, 8, 32}, 51);
    in.k = gaussian({1, 1, 96, 32}, 52);
    in.v = gaussian({1, 1, 96, 32}, 53);
    in.storage = Storage(DType::f32, DType::q4_0, DType::q4_0);
    in.params.mods.causal = true;
    in.row = 7;
  } else if (name == "fp16-overflow") {
    // A kernel that forms e^s (or its sum) in fp16 overflows here; flashvk stores fp16 but keeps
    // its state in fp32 relative to the running max.
    std::vector<float> s;
    for (int j = 0; j < 200; ++j)
      s.push_back(16.0f * std::sin(0.05f * float(j)) * std::sin(0.011f * float(j)));
    in = from_scores(name, s, 4);
    in.storage = DType::f16;
  } else {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "'; expected one of " + list);
  }
  return in;
}

}  // namespace flashvk::viewer
