// Built-in inputs: the shipped sample, random inputs, and the cases that break naive code.
#include <cmath>
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

}  // namespace

Inputs make_random(const RandomSpec& r) {
  Inputs in;
  in.q = gaussian({1, r.heads, r.nq, r.d}, uint32_t(r.seed));
  in.k = gaussian({1, r.heads, r.nk, r.d}, uint32_t(r.seed) + 1);
  in.v = gaussian({1, r.heads, r.nk, r.d}, uint32_t(r.seed) + 2);
  if (r.scale > 0) in.params.scale = r.scale;
  in.params.mods.causal = r.causal;
  in.row = uint32_t(r.nq - 1);
  return in;
}

namespace {

// Each preset's inputs (presets.def lists them).
Inputs make_sample(const std::string& assets) {
  Inputs in;
  in.q = npy::read(assets + "/sample/q.npy", "Q");
  in.k = npy::read(assets + "/sample/k.npy", "K");
  in.v = npy::read(assets + "/sample/v.npy", "V");
  in.params.mods.causal = true;
  in.row = 20;
  return in;
}

Inputs make_huge_logits(const std::string&) {
  Inputs in;
  in.q = gaussian({1, 1, 8, 32}, 1, 10.0f);
  in.k = gaussian({1, 1, 160, 32}, 2, 10.0f);
  in.v = gaussian({1, 1, 160, 8}, 3);
  in.params.scale = 1.0f;
  in.row = 3;
  return in;
}

Inputs make_falling_rising(const std::string&) {
  Inputs in;
  std::vector<float> s;
  for (int j = 0; j < 160; ++j) s.push_back(-12.5f * float(j));
  for (int j = 0; j < 80; ++j) s.push_back(-2000.0f + 25.5f * float(j));
  in = from_scores("falling-rising", s, 6);
  return in;
}

Inputs make_sink(const std::string&) {
  Inputs in;
  in.q = gaussian({1, 1, 16, 16}, 4);
  for (float& x : in.q.data) x = std::abs(x) + 0.5f;
  in.k = gaussian({1, 1, 120, 16}, 5);
  for (int c = 0; c < 16; ++c) in.k.data[size_t(c)] = 6.0f;
  in.v = gaussian({1, 1, 120, 8}, 6);
  in.row = 15;
  return in;
}

Inputs make_masked_mid_row(const std::string&) {
  Inputs in;
  in.q = gaussian({1, 1, 4, 16}, 7);
  in.k = gaussian({1, 1, 160, 16}, 8);
  in.v = gaussian({1, 1, 160, 8}, 9);
  in.params.mods.key_mask.assign(160, 1);
  for (int j = 0; j < 160; ++j)
    if (j == 0 || (j >= 40 && j < 90) || j % 9 == 4) in.params.mods.key_mask[size_t(j)] = 0;
  return in;
}

Inputs make_fully_masked_row(const std::string&) {
  Inputs in;
  in.q = gaussian({1, 1, 40, 16}, 10);
  in.k = gaussian({1, 1, 24, 16}, 11);
  in.v = gaussian({1, 1, 24, 8}, 12);
  in.params.mods.causal = true;
  in.row = 3;
  return in;
}

Inputs make_empty_split(const std::string&) {
  Inputs in;
  in.q = gaussian({1, 1, 2, 16}, 13);
  in.k = gaussian({1, 1, 256, 16}, 14);
  in.v = gaussian({1, 1, 256, 8}, 15);
  in.params.hints.splits = 4;
  in.needs = {Variant::splitkv};  // its lesson is the chunk table of the Output panel
  in.params.mods.key_mask.assign(256, 1);
  for (int j = 64; j < 128; ++j) in.params.mods.key_mask[size_t(j)] = 0;
  return in;
}

Inputs make_sliding_window(const std::string&) {
  // Query 150 sees keys 119..150 (window 31, 0): the kernels walk only the tiles that hold them.
  Inputs in;
  in.q = gaussian({1, 1, 160, 16}, 21);
  in.k = gaussian({1, 1, 160, 16}, 22);
  in.v = gaussian({1, 1, 160, 8}, 23);
  in.params.mods.causal = true;
  in.params.mods.window_left = 31;
  in.row = 150;
  return in;
}

#ifdef FLASHVK_VIEWER_FLEX
Inputs make_documents(const std::string&) {
  // Documents of 64, 86 and 42 tokens packed in one sequence (their ids in flex_table), each
  // causal within itself: query 120 of the second sees keys 64..120.
  Inputs in;
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
  return in;
}
#endif

Inputs make_sink_logit(const std::string&) {
  // The sink (2.0) is above most scores: it takes a large share of the denominator, and every
  // recurrence starts from it (m = 2, l = 1; FLASH-D: L = 2) instead of from nothing.
  Inputs in;
  in.q = gaussian({1, 1, 8, 16}, 31);
  in.k = gaussian({1, 1, 64, 16}, 32);
  in.v = gaussian({1, 1, 64, 8}, 33);
  in.params.mods.sinks = {2.0f};
  in.row = 5;
  return in;
}

Inputs make_softcap(const std::string&) {
  // Scores up to about +-20, capped at c = 5: the largest ones are squeezed to just under 5.
  Inputs in;
  in.q = gaussian({1, 1, 8, 16}, 41);
  in.k = gaussian({1, 1, 96, 16}, 42);
  in.v = gaussian({1, 1, 96, 8}, 43);
  in.params.scale = 1.25f;
  in.params.mods.softcap = 5.0f;
  in.row = 2;
  return in;
}

Inputs make_q4_kv(const std::string&) {
  // d = dv = 32: one q4_0 block a key row, 16 levels between -8 d and 7 d.
  Inputs in;
  in.q = gaussian({1, 1, 8, 32}, 51);
  in.k = gaussian({1, 1, 96, 32}, 52);
  in.v = gaussian({1, 1, 96, 32}, 53);
  in.storage = Storage(DType::f32, DType::q4_0, DType::q4_0);
  in.params.mods.causal = true;
  in.row = 7;
  return in;
}

Inputs make_fp16_overflow(const std::string&) {
  // A kernel that forms e^s (or its sum) in fp16 overflows here; flashvk stores fp16 but keeps
  // its state in fp32 relative to the running max.
  Inputs in;
  std::vector<float> s;
  for (int j = 0; j < 200; ++j)
    s.push_back(16.0f * std::sin(0.05f * float(j)) * std::sin(0.011f * float(j)));
  in = from_scores("fp16-overflow", s, 4);
  in.storage = DType::f16;
  return in;
}

struct PresetRow {
  const char* name;
  const char* about;
  Inputs (*make)(const std::string& assets);
};
const PresetRow kPresets[] = {
#define PRESET(id, name, about) {name, about, make_##id},
#include "presets.def"
#undef PRESET
};

const PresetRow* find_preset(const std::string& name) {
  for (const PresetRow& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const PresetRow& p : kPresets) n.push_back(p.name);
    return n;
  }();
  return names;
}

std::string preset_description(const std::string& name) {
  const PresetRow* p = find_preset(name);
  return p ? p->about : "";
}

Inputs make_preset(const std::string& name, const std::string& assets) {
  const PresetRow* p = find_preset(name);
  if (!p) {
    std::string list;
    for (const auto& n : preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw Error("unknown preset '" + name + "'; expected one of " + list);
  }
  Inputs in = p->make(assets);
  in.name = name;
  return in;
}

}  // namespace flashvk::viewer
