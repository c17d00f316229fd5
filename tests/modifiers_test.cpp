// The score modifiers (sliding window, softcap, ALiBi, attention sinks), alone and in the
// combinations models use, in every variant and tile layout, against the float64 reference; and
// closed-form cases that do not go through the reference's code.
#include <numeric>

#include "test_util.hpp"
#ifdef FLASHVK_TEST_FLEX
#include "flashvk/flex.hpp"
#endif

namespace flashvk::test {
namespace {

struct ModCase;
using SetMods = void (*)(Modifiers& m, const ModCase& c);

// A shape, and the modifiers it runs with (set by `mods`, so that a new modifier's cases are
// lines of their own).
struct ModCase {
  const char* name;
  uint32_t b, h, hkv, nq, nk, d, dv;
  SetMods mods;
};

// A float mask of documents: query i and key j see each other when they are in the same
// document of 20 keys (queries mapped onto keys bottom-right), with a finite bias elsewhere.
HostTensor document_mask(const ModCase& c) {
  const float inf = std::numeric_limits<float>::infinity();
  HostTensor m({c.nq, c.nk});
  for (uint32_t i = 0; i < c.nq; ++i)
    for (uint32_t j = 0; j < c.nk; ++j) {
      uint32_t qi = i + c.nk - std::min(c.nq, c.nk);
      m.data[i * c.nk + j] = qi / 20 == j / 20 ? 0.25f * std::sin(float(i * 7 + j)) : -inf;
    }
  return m;
}

// A per-head band: head h sees keys within 4 + 3h of its diagonal, with a bias.
HostTensor band_mask(const ModCase& c) {
  const float inf = std::numeric_limits<float>::infinity();
  HostTensor m({1, c.h, c.nq, c.nk});
  for (uint32_t h = 0; h < c.h; ++h)
    for (uint32_t i = 0; i < c.nq; ++i)
      for (uint32_t j = 0; j < c.nk; ++j) {
        int64_t dist = std::abs(int64_t(i) + c.nk - c.nq - int64_t(j));
        m.data[(size_t(h) * c.nq + i) * c.nk + j] =
            dist <= 4 + 3 * int64_t(h) ? 0.1f * float(h) - 0.02f * float(dist) : -inf;
      }
  return m;
}

// A bool mask: true on a pseudo-random two thirds, different per batch, and every row of the
// first batch's first query hidden (a row with no key).
HostTensor random_bool_mask(const ModCase& c) {
  std::vector<uint8_t> attend(size_t(c.b) * c.nq * c.nk);
  for (size_t x = 0; x < attend.size(); ++x) attend[x] = (x * 2654435761u >> 7) % 3 != 0;
  for (uint32_t j = 0; j < c.nk; ++j) attend[j] = 0;
  return bool_mask(attend, {c.b, 1, c.nq, c.nk});
}

// One sink per head, around the scores' size, one above all of them.
void sinks(Modifiers& m, const ModCase& c) {
  for (uint32_t h = 0; h < c.h; ++h) m.sinks.push_back(h == 1 ? 6.0f : -1.0f + 0.5f * float(h));
}
void per_batch_slopes(Modifiers& m, const ModCase& c) {
  for (uint32_t i = 0; i < c.b * c.h; ++i) m.alibi_slopes.push_back(0.05f * float(i + 1));
}

// Ragged shapes (no multiple of a tile), GQA, Nq < Nk, Nq > Nk and decoding.
const ModCase kCases[] = {
    {"window", 1, 4, 2, 37, 53, 16, 16,
     [](Modifiers& m, const ModCase&) { m.window_left = 5, m.window_right = 3; }},
    {"window_causal_sinks_gqa", 2, 4, 2, 65, 129, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       m.causal = true, m.window_left = 16;
       sinks(m, c);
     }},
    {"softcap_window", 1, 2, 2, 40, 90, 32, 32,
     [](Modifiers& m, const ModCase&) { m.window_left = 40, m.softcap = 3.0f; }},
    {"alibi_causal", 1, 6, 3, 33, 33, 16, 16,
     [](Modifiers& m, const ModCase&) { m.causal = true, m.alibi_max_bias = 8.0f; }},
    {"alibi_slopes_per_batch", 2, 2, 1, 20, 70, 16, 8, per_batch_slopes},
    {"sinks_decode_gqa", 1, 8, 2, 1, 300, 64, 64, sinks},
    {"empty_rows_sinks", 1, 2, 2, 70, 45, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       m.causal = true, m.window_left = 2;
       sinks(m, c);
     }},
    {"everything", 2, 4, 2, 29, 111, 32, 16,
     [](Modifiers& m, const ModCase& c) {
       m.causal = true, m.window_left = 50, m.softcap = 4.0f;
       per_batch_slopes(m, c);
       sinks(m, c);
       m.mask = document_mask(c);
       m.key_mask.assign(size_t(c.b) * c.nk, 1);
       for (size_t j = 2; j < m.key_mask.size(); j += 7) m.key_mask[j] = 0;
     }},
    {"float_mask_documents", 1, 2, 1, 45, 90, 16, 16,
     [](Modifiers& m, const ModCase& c) { m.mask = document_mask(c); }},
    {"float_mask_per_head_gqa", 1, 4, 2, 23, 61, 16, 16,
     [](Modifiers& m, const ModCase& c) { m.mask = band_mask(c); }},
    // Llama 4's chunks: causal within each chunk, with sinks and GQA; alone, with Nq > Nk (the
    // first rows sit before key 0) and a window; decoding, whose one row sees its chunk's start.
    {"chunk_causal_sinks_gqa", 2, 4, 2, 45, 131, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       m.causal = true, m.chunk_size = 24;
       sinks(m, c);
     }},
    {"chunk_window_nq_gt_nk", 1, 2, 2, 70, 45, 16, 16,
     [](Modifiers& m, const ModCase&) { m.chunk_size = 16, m.window_left = 9; }},
    {"chunk_decode_gqa", 1, 8, 2, 1, 300, 64, 64,
     [](Modifiers& m, const ModCase&) { m.causal = true, m.chunk_size = 128; }},
    {"bool_mask_per_batch_sinks", 2, 4, 2, 30, 70, 16, 8,
     [](Modifiers& m, const ModCase& c) {
       m.mask = random_bool_mask(c);
       sinks(m, c);
     }},
#ifdef FLASHVK_TEST_FLEX
    // User-written functions (flashvk::flex), each with its float64 twin, which the reference
    // applies: FlexAttention's examples with flashvk's built-in modifiers beside them.
    {"flex_documents_causal_gqa", 2, 4, 2, 37, 70, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       // A document id per key in the table; causal within each document.
       m.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;
  return q_pos >= 0 && kv_idx <= q_pos && flex_table[kv_idx] == flex_table[q_pos];
})";
       m.mask_mod_name = "documents.glsl";
       m.flex_table = HostTensor({c.nk});
       for (uint32_t j = 0; j < c.nk; ++j)
         m.flex_table.data[j] = float(j < 13 ? 0 : j < 40 ? 1 : j < 41 ? 2 : 3);
       std::vector<float> ids = m.flex_table.data;
       int nq = int(c.nq), nk = int(c.nk);
       m.mask_twin = [=](int, int, int i, int j) {
         int q = i + nk - nq;
         return q >= 0 && j <= q && ids[size_t(j)] == ids[size_t(q)];
       };
     }},
    {"flex_prefix_lm_softcap_sinks", 1, 4, 1, 40, 90, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       m.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  return kv_idx < 24 || kv_idx <= q_idx + FLEX_NK - FLEX_NQ;  // a prefix of 24, then causal
})";
       int nq = int(c.nq), nk = int(c.nk);
       m.mask_twin = [=](int, int, int i, int j) { return j < 24 || j <= i + nk - nq; };
       m.softcap = 3.0f;
       sinks(m, c);
     }},
    {"flex_relative_bias_window", 1, 2, 2, 45, 64, 32, 32,
     [](Modifiers& m, const ModCase& c) {
       // A bias per relative position (T5-like), from a table of 65.
       m.score_mod = R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  int rel = kv_idx - (q_idx + FLEX_NK - FLEX_NQ);
  return score + flex_table[clamp(rel + 32, 0, 64)];
})";
       m.score_mod_name = "relative_bias.glsl";
       m.flex_table = HostTensor({65});
       for (uint32_t x = 0; x < 65; ++x) m.flex_table.data[x] = 0.8f * std::sin(0.3f * float(x));
       std::vector<float> bias = m.flex_table.data;
       int nq = int(c.nq), nk = int(c.nk);
       m.score_twin = [=](double s, int, int, int i, int j) {
         int rel = j - (i + nk - nq);
         return s + double(bias[size_t(std::clamp(rel + 32, 0, 64))]);
       };
       m.causal = true, m.window_left = 20;
     }},
    {"flex_tanh_bias_decode_gqa", 1, 8, 2, 1, 300, 64, 64,
     [](Modifiers& m, const ModCase& c) {
       // A learned bias per head and key, capped by tanh, with a sink per head.
       m.score_mod = R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score + 4.0 * tanh(flex_table[h * FLEX_NK + kv_idx] / 4.0);
})";
       m.flex_table = HostTensor({c.h, c.nk});
       for (size_t x = 0; x < m.flex_table.data.size(); ++x)
         m.flex_table.data[x] = 6.0f * std::sin(float(x) * 0.7f);
       std::vector<float> bias = m.flex_table.data;
       int nk = int(c.nk);
       m.score_twin = [=](double s, int, int h, int, int j) {
         return s + 4.0 * std::tanh(double(bias[size_t(h * nk + j)]) / 4.0);
       };
       sinks(m, c);
     }},
    {"flex_both_alibi_chunks", 2, 4, 2, 33, 50, 16, 16,
     [](Modifiers& m, const ModCase& c) {
       // Both functions, in one file, beside the built-in ALiBi.
       m.score_mod = m.mask_mod =
           R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score * (1.0 + 0.25 * float(b)) - 0.1 * float(h);
}
bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  return (q_idx + FLEX_NK - FLEX_NQ) / 16 == kv_idx / 16 && (kv_idx + h) % 5 != 0;
})";
       m.score_mod_name = m.mask_mod_name = "both.glsl";
       int nq = int(c.nq), nk = int(c.nk);
       m.score_twin = [](double s, int b, int h, int, int) {
         return s * (1.0 + 0.25 * b) - 0.1 * h;
       };
       m.mask_twin = [=](int, int h, int i, int j) {
         int q = i + nk - nq;
         return q / 16 == j / 16 && (j + h) % 5 != 0;
       };
       m.alibi_max_bias = 8.0f;
     }},
#endif
};

void PrintTo(const ModCase& c, std::ostream* os) {
  *os << c.name;
}

AttentionParams case_params(const ModCase& c, Variant variant) {
  AttentionParams p;
  p.variant = variant;
  c.mods(p.mods, c);
#ifdef FLASHVK_TEST_FLEX
  if (p.mods.user_functions()) flex::enable(context());
#endif
  return p;
}

using Param = std::tuple<Variant, ModCase>;
class ModifierTest : public VulkanTest, public ::testing::WithParamInterface<Param> {};

// The layouts a case runs in each storage: fp32 in every layout the device runs; fp16 in the
// matrix kernel's (fp16 only; emulated on devices without matrix units) and in one other, which moves with the case and the variant, so that
// every layout meets fp16 under several modifiers. The modifiers act on fp32 scores whatever Q,
// K and V are stored as, and fp16 storage in every layout and shape is AttentionTest's and the
// layout tests'; each fp16 layout here is another set of pipelines for llvmpipe to compile (a
// third of the suite's time went to this test).
std::vector<TileLayout> layouts_for(Variant v, const ModCase& c) {
  return device_layouts(v, c.d, c.dv);
}
std::vector<TileLayout> layouts_for(Variant v, const ModCase& c, DType dtype) {
  std::vector<TileLayout> all = layouts_for(v, c), out;
  if (dtype == DType::f32) {
    for (TileLayout l : all)
      if (l != TileLayout::cooperative_matrix) out.push_back(l);
    return out;
  }
  size_t index = index_of(kCases, c.name);
  std::vector<TileLayout> others;
  for (TileLayout l : all)
    (l == TileLayout::cooperative_matrix ? out : others).push_back(l);
  out.push_back(others[(index + size_t(v)) % others.size()]);
  return out;
}

TEST_P(ModifierTest, MatchesFloat64ReferenceInEachLayoutTheDeviceRuns) {
  const auto& [variant, c] = GetParam();
  uint32_t seed = c.nq * 31 + c.nk;
  for (DType dtype : {DType::f32, DType::f16}) {
    HostTensor q = random_tensor({c.b, c.h, c.nq, c.d}, seed, 1.5f);
    HostTensor k = random_tensor({c.b, c.hkv, c.nk, c.d}, seed + 1, 1.5f);
    HostTensor v = random_tensor({c.b, c.hkv, c.nk, c.dv}, seed + 2);
    if (dtype == DType::f16) q = round_to_half(q), k = round_to_half(k), v = round_to_half(v);
    AttentionParams params = case_params(c, variant);
    reference::Result ref = reference::direct(q, k, v, params);
    for (TileLayout layout : layouts_for(variant, c, dtype)) {
      params.hints.tile_layout = layout;
      // The matrix kernel with either softmax: the scratch's (the shared context's) or the one
      // kept in matrices (nv2's), alternating with the case and the variant as the other fp16
      // layout moves, so that each meets every modifier in some variant.
      bool in_matrices = layout == TileLayout::cooperative_matrix &&
                         (index_of(kCases, c.name) + size_t(variant)) % 2 == 1;
      Context& ctx = in_matrices ? softmax_matrices_context() : context();
#ifdef FLASHVK_TEST_FLEX
      if (in_matrices && params.mods.user_functions()) flex::enable(ctx);
#endif
      std::string what = std::string(dtype_name(dtype)) + " " + tile_layout_name(layout) +
                         (in_matrices ? " (softmax in matrices)" : "");
      HostAttentionResult gpu = attention(ctx, q, k, v, params, dtype);
      double tol = tolerance(q, k, v, params) + weight_rounding(gpu, v);
      EXPECT_LE(max_error(gpu.out.data, ref.out), tol) << what << ", tolerance " << tol;
      EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 2e-5) << what;
      if (layout != TileLayout::automatic) {
        EXPECT_EQ(gpu.tile_layout, layout) << what;
      }
      // The variant's own float64 recurrence agrees with the direct formula too.
      if (dtype == DType::f32 && layout == TileLayout::automatic) {
        reference::Result rec = reference::attention(variant, q, k, v, params);
        EXPECT_LE(max_error(std::vector<float>(rec.out.begin(), rec.out.end()), ref.out), 1e-6);
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  return std::string(variant_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param).name;
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ModifierTest,
                         ::testing::Combine(::testing::ValuesIn(all_variants()),
                                            ::testing::ValuesIn(kCases)),
                         param_name);

// q = 0 makes every score 0, so the softmax is closed-form: each visible key gets weight
// 1 / (n + e^sink) for its row's n visible keys, and the sink the rest. v_j = j, so the output
// is the visible keys' sum of j over that denominator.
class ClosedFormTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {};

TEST_P(ClosedFormTest, WindowAndSinkWithEqualScores) {
  const uint32_t nq = 24, nk = 40;
  const int64_t left = 6, right = 2;
  const float sink = 1.25f;
  HostTensor q({1, 1, nq, 4}), k = random_tensor({1, 1, nk, 4}, 5), v({1, 1, nk, 4});
  for (uint32_t j = 0; j < nk; ++j)
    for (uint32_t c = 0; c < 4; ++c) v.data[j * 4 + c] = float(j * (c + 1));
  AttentionParams params;
  params.variant = GetParam();
  params.mods.window_left = left;
  params.mods.window_right = right;
  params.mods.sinks = {sink};
  HostAttentionResult gpu = attention(context(), q, k, v, params);
  for (uint32_t i = 0; i < nq; ++i) {
    int64_t diag = int64_t(i) + nk - nq;
    int64_t lo = std::max<int64_t>(0, diag - left), hi = std::min<int64_t>(nk - 1, diag + right);
    double n = double(hi - lo + 1), sum = double(lo + hi) * n / 2;
    double den = n + std::exp(double(sink));
    for (uint32_t c = 0; c < 4; ++c)
      EXPECT_NEAR(gpu.out.data[i * 4 + c], sum * (c + 1) / den, 1e-5 * nk * (c + 1))
          << "row " << i << " dim " << c;
    EXPECT_NEAR(gpu.lse.data[i], std::log(den), 1e-5) << "row " << i;
  }
}

// ALiBi with q = 0: query i's weights are e^(-slope |diag - j|), normalised; causal (keys up to
// the diagonal) with one slope per head, and without a mask (keys on both sides, where |.|
// matters) with one slope per batch and head.
TEST_P(ClosedFormTest, AlibiWithEqualScores) {
  const uint32_t b = 2, h = 2, nq = 5, nk = 30;
  HostTensor q({b, h, nq, 4}), k = random_tensor({b, 1, nk, 4}, 6), v({b, 1, nk, 4});
  for (uint32_t x = 0; x < b * nk; ++x)
    for (uint32_t c = 0; c < 4; ++c) v.data[x * 4 + c] = std::sin(float(x + c));
  for (bool causal : {true, false}) {
    AttentionParams params;
    params.variant = GetParam();
    params.mods.causal = causal;
    params.mods.alibi_slopes = causal ? std::vector<float>{0.5f, 0.125f}
                                      : std::vector<float>{0.5f, 0.125f, 0.25f, 1.0f};  // [B, H]
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    for (uint32_t bb = 0; bb < b; ++bb)
      for (uint32_t hh = 0; hh < h; ++hh) {
        double slope = params.mods.alibi_slopes[causal ? hh : bb * h + hh];
        for (uint32_t i = 0; i < nq; ++i) {
          int64_t diag = int64_t(i) + nk - nq;
          double den = 0, o[4] = {0, 0, 0, 0};
          for (int64_t j = 0; j < (causal ? diag + 1 : int64_t(nk)); ++j) {
            double w = std::exp(-slope * double(std::abs(diag - j)));
            den += w;
            for (uint32_t c = 0; c < 4; ++c) o[c] += w * v.data[(bb * nk + size_t(j)) * 4 + c];
          }
          for (uint32_t c = 0; c < 4; ++c)
            EXPECT_NEAR(gpu.out.data[((bb * h + hh) * nq + i) * 4 + c], o[c] / den, 2e-6)
                << (causal ? "causal" : "full") << " batch " << bb << " head " << hh << " row "
                << i;
        }
      }
  }
}

// Softcap with known scores: q = a e_0 and k_j = b_j e_0 make s_j = scale a b_j, so the capped
// scores c tanh(s_j / c) and their softmax are computed here, not by the reference. The raw
// scores span -40..40: with c = 5 capping changes the weights completely (s / c past 1/8 and
// near 0, both of the kernels' ways to tanh); with c = 10^4 it barely moves them, and a tanh
// that kept only c's last bits (c - 2c / (e^2x + 1) alone) would be 10^-3 off.
TEST_P(ClosedFormTest, SoftcapWithKnownScores) {
  const uint32_t nk = 33;
  const float scale = 0.5f;
  HostTensor q({1, 1, 1, 4}), k({1, 1, nk, 4}), v({1, 1, nk, 4});
  q.data[0] = 8.0f;
  for (uint32_t j = 0; j < nk; ++j) {
    k.data[j * 4] = -10.0f + 20.0f * float(j) / float(nk - 1);  // s_j from -40 to 40
    for (uint32_t e = 0; e < 4; ++e) v.data[j * 4 + e] = std::cos(float(j * (e + 1)));
  }
  for (float c : {5.0f, 1e4f}) {
    AttentionParams params;
    params.variant = GetParam();
    params.scale = scale;
    params.mods.softcap = c;
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    double den = 0, o[4] = {0, 0, 0, 0}, m = -INFINITY;
    std::vector<double> s(nk);
    for (uint32_t j = 0; j < nk; ++j) {
      s[j] = double(c) * std::tanh(double(scale) * 8.0 * double(k.data[j * 4]) / double(c));
      m = std::max(m, s[j]);
    }
    for (uint32_t j = 0; j < nk; ++j) {
      double w = std::exp(s[j] - m);
      den += w;
      for (uint32_t e = 0; e < 4; ++e) o[e] += w * v.data[j * 4 + e];
    }
    for (uint32_t e = 0; e < 4; ++e)
      EXPECT_NEAR(gpu.out.data[e], o[e] / den, 2e-6) << "c = " << c << ", " << e;
    // (an fp32 LSE near 40 is within 2^-19 of it at best)
    EXPECT_NEAR(gpu.lse.data[0], m + std::log(den), 2e-6 * std::max(1.0, m)) << "c = " << c;
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariants, ClosedFormTest, ::testing::ValuesIn(all_variants()),
                         variant_param_name);

// ggml's slopes: H = 8, max_bias 8 gives 2^-(h+1); H = 12 adds m1 = 2^-0.5's odd powers.
TEST(AlibiSlopes, FollowGgmlsFormula) {
  std::vector<float> eight = alibi_slopes(8, 8.0f);
  for (uint32_t h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(eight[h], std::ldexp(1.0f, -int(h) - 1));
  std::vector<float> twelve = alibi_slopes(12, 8.0f);
  for (uint32_t h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(twelve[h], eight[h]);
  for (uint32_t h = 8; h < 12; ++h)
    EXPECT_FLOAT_EQ(twelve[h], float(std::pow(2.0, -0.5 * (2.0 * (h - 8) + 1))));
}

// q = 0 and a float mask: the weights are softmax over the mask's row, closed-form.
TEST_P(ClosedFormTest, AdditiveMaskWithEqualScores) {
  const uint32_t nq = 6, nk = 50;
  HostTensor q({1, 1, nq, 4}), k = random_tensor({1, 1, nk, 4}, 9),
                               v = random_tensor({1, 1, nk, 4}, 10);
  AttentionParams params;
  params.variant = GetParam();
  params.mods.mask = HostTensor({nq, nk});
  for (uint32_t i = 0; i < nq; ++i)
    for (uint32_t j = 0; j < nk; ++j)
      params.mods.mask.data[i * nk + j] =
          (j + i) % 4 == 0 ? -std::numeric_limits<float>::infinity() : 0.1f * float((i * j) % 13);
  HostAttentionResult gpu = attention(context(), q, k, v, params);
  for (uint32_t i = 0; i < nq; ++i) {
    double den = 0, o[4] = {0, 0, 0, 0};
    for (uint32_t j = 0; j < nk; ++j) {
      float m = params.mods.mask.data[i * nk + j];
      if (std::isinf(m)) continue;
      den += std::exp(double(m));
      for (uint32_t c = 0; c < 4; ++c) o[c] += std::exp(double(m)) * v.data[j * 4 + c];
    }
    for (uint32_t c = 0; c < 4; ++c)
      EXPECT_NEAR(gpu.out.data[i * 4 + c], o[c] / den, 2e-6) << "row " << i;
    EXPECT_NEAR(gpu.lse.data[i], std::log(den), 2e-6) << "row " << i;
  }
}

// A mask whose tiles differ in kind, in every layout: with equal scores (Q = 0) O is the mask's
// softmax of V in closed form, here with tiles of values before tiles of zeros, fully hidden
// tiles between, -inf scattered in the last tiles, and the two KV heads' workgroups apart (head 1
// has values where head 0 has zeros).
TEST_P(ClosedFormTest, MaskTilesOfZerosAndOfValues) {
  const uint32_t heads = 2, nq = 6, nk = 200;
  const float hidden = -std::numeric_limits<float>::infinity();
  HostTensor q({1, heads, nq, 8}), k = random_tensor({1, heads, nk, 8}, 31),
                                   v = random_tensor({1, heads, nk, 8}, 32);
  AttentionParams params;
  params.variant = GetParam();
  params.mods.mask = HostTensor({1, heads, nq, nk});
  for (uint32_t h = 0; h < heads; ++h)
    for (uint32_t i = 0; i < nq; ++i)
      for (uint32_t j = 0; j < nk; ++j) {
        float m = 0.0f;  // keys 64..127 for head 0
        if (j < 64 || (h == 1 && j < 128)) m = 0.3f * std::sin(float(i * 5 + j + 40 * h));
        if (j >= 128 && j < 160) m = hidden;
        if (j >= 160 && (i + j) % 3 == 0) m = hidden;
        params.mods.mask.data[(size_t(h) * nq + i) * nk + j] = m;
      }
  std::vector<TileLayout> layouts = {TileLayout::automatic};
  if (variant_info(params.variant).fused) layouts = {TileLayout::shared, TileLayout::blocks};
  const DeviceInfo& info = context().device();
  if (variant_info(params.variant).fused && info.subgroup_shuffle && info.texel_buffers)
    layouts.push_back(TileLayout::registers);
  for (TileLayout layout : layouts) {
    SCOPED_TRACE(tile_layout_name(layout));
    params.hints.tile_layout = layout;
    HostAttentionResult gpu = attention(context(), q, k, v, params);
    for (uint32_t h = 0; h < heads; ++h)
      for (uint32_t i = 0; i < nq; ++i) {
        double den = 0, o[8] = {};
        for (uint32_t j = 0; j < nk; ++j) {
          float m = params.mods.mask.data[(size_t(h) * nq + i) * nk + j];
          if (std::isinf(m)) continue;
          den += std::exp(double(m));
          for (uint32_t c = 0; c < 8; ++c)
            o[c] += std::exp(double(m)) * v.data[(h * nk + j) * 8 + c];
        }
        size_t row = size_t(h) * nq + i;
        for (uint32_t c = 0; c < 8; ++c)
          EXPECT_NEAR(gpu.out.data[row * 8 + c], o[c] / den, 2e-6) << "head " << h << " row " << i;
        double lse = std::log(den);  // about 5: relative, as max_lse_error
        EXPECT_NEAR(gpu.lse.data[row], lse, 2e-6 * std::max(1.0, lse))
            << "head " << h << " row " << i;
      }
  }
}

// Tiles an additive mask hides from every row of a workgroup are skipped, in the middle of the
// rows' keys too: keys 128..255 are NaN and hidden from all rows, so a kernel that read them
// would turn the output into NaN. Keys 64..127 are seen by one head only (2 in batch 0, 1 in
// batch 1), whose rows share workgroups with one other head's and none with the other KV head's:
// a tile skipped for the wrong workgroup or batch shows against the float64 reference (on the
// keys made 0). In every layout the device runs: shared, registers, blocks, lanes (splitkv, in
// three chunks, so that a chunk starts inside the hidden keys) and cooperative matrices.
TEST_P(ClosedFormTest, FullyMaskedTilesAreNeverRead) {
  Variant variant = GetParam();
  if (!variant_info(variant).fused) GTEST_SKIP() << "naive reads every key of a row's range";
  const uint32_t batch = 2, heads = 4, nq = 70, nk = 300, d = 32;
  HostTensor q = random_tensor({batch, heads, nq, d}, 21), k = random_tensor({batch, 2, nk, d}, 22),
             v = random_tensor({batch, 2, nk, d}, 23);
  AttentionParams params;
  params.variant = variant;
  if (variant_info(variant).splits_keys)
    params.hints.splits = 3;  // chunks from keys 0 and 128 on too
  params.mods.mask = HostTensor({batch, heads, nq, nk});
  const float hidden = -std::numeric_limits<float>::infinity();
  for (uint32_t b = 0; b < batch; ++b)
    for (uint32_t h = 0; h < heads; ++h)
      for (uint32_t i = 0; i < nq; ++i)
        for (uint32_t j = 0; j < nk; ++j) {
          bool seen_64 = h == (b == 0 ? 2u : 1u);
          bool hide = (j >= 128 && j < 256) || (j >= 64 && j < 128 && !seen_64);
          params.mods.mask.data[((b * heads + h) * nq + i) * nk + j] =
              hide ? hidden : 0.05f * float((i + j + h + b) % 7);
        }
  expect_keys_never_read(q, k, v, params, 128, 256);
}

// splitkv's chunks past the keys (more splits than the keys fill) start at Nk, inside a tile
// when Nk is not a multiple of the tile: with the tile bitmap on they must stay empty, not walk
// the last tile again (keys 144..149 counted twice, as they were). A window of an additive
// mask over 150 keys, in 8 chunks, in every layout the device runs.
TEST_F(VulkanTest, SplitkvChunksPastTheKeysStayEmptyWithTheTileBitmap) {
  const uint32_t nq = 3, nk = 150, d = 16;
  HostTensor q = random_tensor({1, 2, nq, d}, 31), k = random_tensor({1, 2, nk, d}, 32),
             v = random_tensor({1, 2, nk, d}, 33);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.splits = 8;
  params.mods.mask = HostTensor({nq, nk});
  for (uint32_t i = 0; i < nq; ++i)
    for (uint32_t j = 0; j < nk; ++j)
      params.mods.mask.data[i * nk + j] =
          j + 21 >= nk ? 0.1f * float(j % 3) : -std::numeric_limits<float>::infinity();
  reference::Result ref = reference::direct(q, k, v, params);
  ModCase shape{"window", 1, 2, 2, nq, nk, d, d};
  for (TileLayout layout : layouts_for(Variant::splitkv, shape)) {
    bool f16 = layout == TileLayout::cooperative_matrix;
    params.hints.tile_layout = layout;
    HostTensor qs = f16 ? round_to_half(q) : q, ks = f16 ? round_to_half(k) : k,
               vs = f16 ? round_to_half(v) : v;
    reference::Result want = f16 ? reference::direct(qs, ks, vs, params) : ref;
    HostAttentionResult gpu =
        attention(context(), qs, ks, vs, params, f16 ? DType::f16 : DType::f32);
    EXPECT_LE(max_error(gpu.out.data, want.out),
              tolerance(qs, ks, vs, params) + weight_rounding(gpu, vs))
        << tile_layout_name(layout);
  }
}

// Chunked attention with q = 0: every key of a row's chunk up to its diagonal gets the same
// weight, v_j = j, so row i's output is the mean of its chunk's keys. The keys of the other
// chunks hold NaN in K and V: a kernel that read one would return NaN, so every layout must skip
// them, as the cost growing with C and not with Nk needs.
TEST_P(ClosedFormTest, ChunkedAttentionReadsOnlyItsChunk) {
  Variant variant = GetParam();
  if (!variant_info(variant).fused) GTEST_SKIP() << "naive reads every key of a row's range";
  const uint32_t nq = 40, nk = 200, c = 64, d = 16;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostTensor q({1, 2, nq, d}), k({1, 1, nk, d}), v({1, 1, nk, d});
  // The rows sit on keys 160 .. 199, all in the chunk [128, 192) or [192, 256).
  for (uint32_t j = 0; j < nk; ++j)
    for (uint32_t x = 0; x < d; ++x) {
      bool other = j < 128;
      k.data[j * d + x] = other ? nan : 0.5f;
      v.data[j * d + x] = other ? nan : float(j) * float(x + 1) / 64.0f;
    }
  AttentionParams params;
  params.variant = variant;
  params.mods.causal = true;
  params.mods.chunk_size = c;
  if (variant_info(variant).splits_keys) params.hints.splits = 4;  // chunks starting in the NaN
  ModCase shape{"chunk", 1, 2, 1, nq, nk, d, d};
  for (TileLayout layout : layouts_for(variant, shape)) {
    bool f16 = layout == TileLayout::cooperative_matrix;
    params.hints.tile_layout = layout;
    HostAttentionResult gpu = attention(context(), q, k, v, params, f16 ? DType::f16 : DType::f32);
    for (uint32_t h = 0; h < 2; ++h)
      for (uint32_t i = 0; i < nq; ++i) {
        int64_t diag = int64_t(i) + nk - nq, first = diag / c * c;
        double n = double(diag - first + 1), mean = double(first + diag) / 2;
        for (uint32_t x = 0; x < d; ++x)
          EXPECT_NEAR(gpu.out.data[(h * nq + i) * d + x], mean * (x + 1) / 64.0,
                      (f16 ? 2e-3 : 2e-5) * mean * (x + 1) / 64.0 + 1e-6)
              << tile_layout_name(layout) << " row " << i << " dim " << x;
        EXPECT_NEAR(gpu.lse.data[h * nq + i], std::log(n), 1e-4) << tile_layout_name(layout);
      }
  }
}

TEST_F(VulkanTest, BadModifiersAreRefusedWithTheirName) {
  HostTensor q = random_tensor({1, 2, 4, 8}, 1), k = random_tensor({1, 2, 6, 8}, 2);
  auto refused = [&](AttentionParams p, const std::string& word) {
    try {
      attention(context(), q, k, k, p);
      ADD_FAILURE() << "not refused: " << word;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
    }
  };
  AttentionParams p;
  p.mods.window_left = -2;
  refused(p, "window_left");
  p = {};
  p.mods.softcap = -1.0f;
  refused(p, "softcap");
  p.mods.softcap = std::numeric_limits<float>::infinity();
  refused(p, "softcap");
  p = {};
  p.mods.alibi_slopes = {0.5f, 0.25f, 0.125f};
  refused(p, "alibi_slopes has 3 entries");
  p.mods.alibi_max_bias = 8.0f;
  refused(p, "not both");
  p = {};
  p.mods.sinks = {1.0f};
  refused(p, "sinks has 1 entries");
  p.mods.sinks = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  refused(p, "sinks must be finite");
  p = {};
  p.mods.mask = HostTensor({4, 5});
  refused(p, "mask has shape [4, 5]; expected [Nq, Nk] = [4, 6]");
  p.mods.mask = HostTensor({3, 2, 4, 6});
  refused(p, "mask has shape [3, 2, 4, 6]");
  p.mods.mask = HostTensor({1, 1, 4, 6});
  p.mods.mask.data[7] = std::numeric_limits<float>::infinity();
  refused(p, "mask holds +inf in row 1, key 1");
  p.mods.mask = HostTensor({2, 4, 6});  // rank 3
  refused(p, "mask has shape [2, 4, 6]");
  p.mods.mask = HostTensor({4, 6});
  p.mods.mask.data.pop_back();
  refused(p, "mask has 23 values for shape [4, 6]");
  p = {};
  p.mods.alibi_slopes = {0.5f, std::numeric_limits<float>::infinity()};
  refused(p, "alibi_slopes must be finite");
  p = {};
  p.mods.causal = true;  // overrides the right side, which is still checked
  p.mods.window_right = -5;
  refused(p, "window_right");
}

}  // namespace
}  // namespace flashvk::test
