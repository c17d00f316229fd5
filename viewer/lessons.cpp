#include "lessons.hpp"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

namespace flashvk::viewer {
namespace {

std::string format(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

bool visible(const Model& model, int i) {
  return std::isfinite(model.scores()[size_t(i)]);
}

int first_visible(const Model& model) {
  for (int i = 0; i < model.steps(); ++i)
    if (visible(model, i)) return i;
  return -1;
}

// Steps where the running max rises over a finite earlier max (float64 FlashAttention).
std::vector<int> rescales(const Model& model) {
  const auto& m = model.ref_of(Variant::flash1).m;
  std::vector<int> out;
  for (int i = 1; i < int(m.size()); ++i)
    if (std::isfinite(m[size_t(i - 1)]) && m[size_t(i)] > m[size_t(i - 1)]) out.push_back(i);
  return out;
}

// The rescale whose factor e^(m_prev - m_new) is smallest: where the old state shrinks most.
int biggest_rescale(const Model& model, double* factor) {
  const auto& m = model.ref_of(Variant::flash1).m;
  int best = -1;
  *factor = 1.0;
  for (int i : rescales(model)) {
    double f = std::exp(m[size_t(i - 1)] - m[size_t(i)]);
    if (best < 0 || f < *factor) best = i, *factor = f;
  }
  return best;
}

int heaviest_key(const Model& model) {
  const auto& w = model.direct().w;
  int best = -1;
  for (int i = 0; i < int(w.size()); ++i)
    if (best < 0 || w[size_t(i)] > w[size_t(best)]) best = i;
  return best;
}

void add(Lesson& l, int step, std::string title, std::string look) {
  if (step >= 0) l.points.push_back({step, std::move(title), std::move(look)});
}

void add_end(Lesson& l, const Model& model, std::string look) {
  add(l, model.last_visible_key(), "the last visible key", std::move(look));
}

// A walk for inputs with no story of their own: first key, a rescale, a tile, the end.
void general(Lesson& l, const Model& model) {
  l.intro =
      "Each step takes one more key into the row's state. Watch m (the running max) and l (the "
      "denominator relative to m) in the plots, and the derivation on the right with the "
      "step's numbers.";
  add(l, first_visible(model), "the first key",
      "The state starts from this key alone: m is its score, l = 1, w = 1 and the output is its "
      "value row.");
  double factor = 1.0;
  int r = biggest_rescale(model, &factor);
  add(l, r, "the largest rescale of m",
      format("m rises here, so everything kept so far is multiplied by e^(m_prev - m_new) = %.3g "
             "(red triangle in the m plot; the derivation shows the factor).",
             factor));
  if (model.tile_size() && int(model.tile_size()) < model.steps())
    add(l, int(model.tile_size()) - 1, "the end of the first tile",
        format("The tiled kernels update their state once per %u keys; the heatmap's yellow box "
               "is this tile. Per key (the plots) and per tile they agree.",
               model.tile_size()));
  add_end(l, model,
          "The final state: every variant's output matches softmax(s)·v in float64 (the Output "
          "panel gives the error).");
}

void lesson_falling_rising(Lesson& l, const Model& model) {
  l.literal_flashd = true;
  l.intro =
      "Scores fall from 0 to -2000, then rise back to 14.5. FLASH-D in its paper's form (seed "
      "000), "
      "w_i = sigma(s_i - s_(i-1) + ln w_(i-1)), is exact on paper; run in fp32 (the red "
      "curve in the weight plot) its w reaches 0, ln w = -inf, and no later key can get weight "
      "back. The kernel's form carries L = s - ln w instead and does not fail.";
  add(l, first_visible(model), "the first key", "w = 1: the first key is the whole output.");
  int zero = literal_flashd_zero(model);
  if (zero >= 0)
    add(l, zero, "the paper form's w reaches 0",
        format("e^-(s_i - s_(i-1) + ln w_(i-1)) = e^100 passes fp32's largest number, so the "
               "paper form's w is 0 (the true weight is %.2g: tiny, so no harm yet). But now "
               "ln w = -inf, and the paper form's w stays 0 whatever comes.",
               model.ref_of(Variant::flashd).w[size_t(zero)]));
  int bottom = 0;
  for (int i = 0; i < model.steps(); ++i)
    if (model.scores()[size_t(i)] < model.scores()[size_t(bottom)]) bottom = i;
  add(l, bottom, "the bottom of the fall",
      "The lowest score. Both forms give this key no weight, rightly: it is e^-2000 times the "
      "first.");
  int fail = literal_flashd_underflow(model);
  if (fail >= 0) {
    add(l, fail, "the paper form fails",
        format("The true weight of this key is %.3g, and the kernel's stable w agrees; the "
               "paper form's w is still 0 (red), so its output keeps the first keys' values. "
               "The weight plot is on a log scale here (click it for linear).",
               model.ref_of(Variant::flashd).w[size_t(fail)]));
    l.points.back().log_weights = true;
  }
  add_end(l, model,
          "The last key has the largest score and takes almost all the weight: the stable output "
          "is its value row; the paper form in fp32 would still give the first key's.");
}

void lesson_huge_logits(Lesson& l, const Model& model) {
  l.intro =
      "Scores in the thousands. e^s overflows fp32 above s = 88.7 (float64 above 709), so "
      "softmax written as e^s / sum e^s fails on the first key. Every variant here subtracts "
      "a running max first (FLASH-D carries L), and nothing overflows.";
  int f = first_visible(model);
  if (f >= 0)
    add(l, f, "the first key",
        format("s = %.6g: e^s is inf in fp32. With the max, e^(s - m) = 1 and l = 1.",
               model.scores()[size_t(f)]));
  double factor = 1.0;
  int r = biggest_rescale(model, &factor);
  add(l, r, "a large rise of m",
      format("m jumps; the old state is scaled by e^(m_prev - m_new) = %.3g, which may be 0 in "
             "fp32: the old keys' weight really is that small.",
             factor));
  add(l, heaviest_key(model), "the heaviest key",
      "This key's score is the row's largest: the output ends up almost exactly its value row.");
  add_end(l, model, "The outputs agree with float64 to about 1e-7 despite the huge scores.");
}

void lesson_sink(Lesson& l, const Model& model) {
  l.intro =
      "Key 0 scores far above every other key, as the first token does in many trained models "
      "(an attention sink). It takes most of the denominator from the start, so later keys "
      "never raise m and each gets a small weight.";
  add(l, 0, "key 0, the sink",
      format("s_0 = %.4g, far above the rest: m = s_0 and it stays the max for the whole row.",
             model.scores()[0]));
  add(l, std::min(1, model.steps() - 1), "the next key",
      "Its weight w is tiny: e^(s_1 - m) over a denominator that is mostly the sink's 1.");
  std::vector<int> r = rescales(model);
  if (!r.empty())
    add(l, r[0], "m rises", "A key outscores everything before it; the state is rescaled.");
  add_end(l, model,
          "l is still about 1 (the sink's share) plus the others' small terms; the output is "
          "close to key 0's value row.");
}

void lesson_masked_mid_row(Lesson& l, const Model& model) {
  l.intro =
      "Masked keys have s = -inf (gaps in the score plot): they add nothing and leave the state "
      "as it was. Here key 0 is masked, a block in the middle, and every ninth key.";
  add(l, 0, "key 0 is masked",
      "Nothing seen yet: the state is empty (m = -inf, l = 0), not NaN: -inf - (-inf) is never "
      "formed.");
  add(l, first_visible(model), "the first visible key",
      "The state starts here, exactly as if the row began at this key.");
  int gap = -1;
  for (int i = 1; i < model.steps(); ++i)
    if (!visible(model, i) && !visible(model, i - 1) && visible(model, i - 2 < 0 ? 0 : i - 2)) {
      gap = i - 1;
      break;
    }
  add(l, gap, "a masked block begins",
      "Step through it: m and l do not change, and the masked key's weight w is 0.");
  add_end(l, model, "The output matches softmax over the visible keys only.");
}

void lesson_fully_masked_row(Lesson& l, const Model& model) {
  l.intro =
      "Causal with more queries (40) than keys (24), aligned at the bottom right: query row i "
      "sees keys j <= i - 16, so rows 0 to 15 see no key at all. Their output is 0 and their "
      "LSE -inf, by convention, with no NaN on the way.";
  int f = first_visible(model);
  if (f < 0) {
    add(l, 0, "no key is visible",
        "Every score of this row is -inf: the state stays empty (m = -inf, l = 0).");
    add(l, model.steps() - 1, "the end of the row",
        "Output 0 and LSE -inf (Output panel). Move the query row to 16 to see the first row "
        "with a key.");
  } else {
    add(l, f, "the first visible key", "This row sees a key: the state starts here.");
    add_end(l, model, "Rows 0 to 15 have no visible key; try row 3.");
  }
}

void lesson_empty_split(Lesson& l, const Model& model) {
  l.intro =
      "splitkv (Flash-Decoding) runs chunks of keys in parallel and merges their (o', m, d') "
      "with log-sum-exp. Here the second chunk's keys are all masked: it reports m = -inf and "
      "d' = 0 and must add nothing to the merge (Output panel, splitkv selected).";
  int begin = -1, end = -1;
  for (int i = 0; i < model.steps(); ++i)
    if (!visible(model, i)) {
      if (begin < 0) begin = i;
      end = i;
    }
  add(l, begin - 1, "the end of the first chunk's keys",
      "The first chunk's state is complete: the Output panel lists each chunk's m_c and d'_c "
      "(splitkv is selected with this preset).");
  add(l, begin, "an empty chunk begins",
      format("Keys %d to %d are masked: this chunk sees nothing, m_c = -inf.", begin, end));
  add_end(l, model,
          "The merge takes m_N = max m_c over the chunks; the empty one's e^(m_c - m_N) is 0, "
          "not NaN, and the output matches float64.");
}

void lesson_sliding_window(Lesson& l, const Model& model) {
  const AttentionParams& p = model.inputs().params;
  l.intro = format(
      "A sliding window (Mistral, Gemma): each query sees only the %lld keys before its diagonal "
      "and the diagonal itself, %lld in all (window %lld,0 with causal). Keys outside are hidden "
      "as masked "
      "ones are (s = -inf, w = 0), and the kernels never load the tiles that lie wholly "
      "outside: the heatmap shows the band, and the tiled trace records nothing for the "
      "skipped tiles.",
      static_cast<long long>(p.mods.window_left), static_cast<long long>(p.mods.window_left + 1),
      static_cast<long long>(p.mods.window_left));
  int first = first_visible(model);
  add(l, first, "the window's first key",
      format("Key %d is the first this query sees (its diagonal minus %lld). The state starts "
             "here, as if the row began at this key; the tiles before it were skipped, not read.",
             first, static_cast<long long>(p.mods.window_left)));
  add_end(l, model,
          "The diagonal ends the window: the output matches softmax over the window's keys in "
          "float64 (Output panel), whatever the row's length.");
}

#ifdef FLASHVK_VIEWER_FLEX
void lesson_documents(Lesson& l, const Model& model) {
  l.intro =
      "Three documents packed into one sequence, as training and serving batch them: each token "
      "may see only its own document, causally. No built-in modifier says that; the model "
      "author writes it in GLSL, as FlexAttention's mask_mod: bool mask_mod(b, h, q_idx, kv_idx) "
      "{ return kv_idx <= q_pos && flex_table[kv_idx] == flex_table[q_pos]; } with a document id "
      "per token in flex_table. flashvk compiles it into every kernel at run time; a key it "
      "hides gets s = -inf (w = 0), and tiles it hides from every row are never read.";
  int first = first_visible(model);
  add(l, first, "the document's first key",
      format("Key %d starts this query's document: every key before it belongs to another one, "
             "hidden by mask_mod (s = -inf), and the tiled kernels skipped their tiles, so the "
             "state starts here as if the row began at this key.",
             first));
  add_end(l, model,
          "The query's own token ends its document's keys: the output matches softmax over the "
          "document's keys in float64 (Output panel), where the reference applies the function's "
          "C++ twin.");
}
#endif

void lesson_sink_logit(Lesson& l, const Model& model) {
  double sink = reference::row_sink(model.inputs().params, model.head);
  l.intro = format(
      "An attention sink (gpt-oss) is one logit per head, here %.3g, in the softmax's "
      "denominator only: O = sum e^(s_j) v_j / (sum e^(s_j) + e^sink). Every recurrence starts "
      "from it as from a key of value 0 seen first: m = %.3g and l = 1 before the first key "
      "(FLASH-D: L = %.3g), so no key ever gets w = 1.",
      sink, sink, sink);
  int first = first_visible(model);
  if (first >= 0)
    add(l, first, "the first key",
        format("Without a sink the first key would get w = 1. Here it gets w = %.4g: sigma(s - "
               "L) with L = the sink, the same formula as for every later key.",
               model.ref_of(Variant::flashd).w[size_t(first)]));
  double lse = model.ref_of(Variant::flashd).final_lse;
  add_end(l, model,
          format("The sink keeps e^(sink - LSE) = %.3g of the denominator: the keys' weights sum "
                 "to %.3g, and the output is that much smaller than softmax without it.",
                 std::exp(sink - lse), 1.0 - std::exp(sink - lse)));
}

void lesson_softcap(Lesson& l, const Model& model) {
  double c = model.inputs().params.mods.softcap;
  l.intro = format(
      "Logit softcapping (Gemma 2) replaces each score s by c tanh(s / c), here c = %.3g: scores "
      "near 0 stay as they are, large ones are squeezed to just under c, so no key can take all "
      "the weight. The score plot draws the raw score (orange) and the capped one (white); the "
      "recurrences only ever see the capped one.",
      c);
  const auto& raw = model.raw_scores();
  int top = -1;
  for (int i = 0; i < int(raw.size()); ++i)
    if (std::isfinite(raw[size_t(i)]) && (top < 0 || raw[size_t(i)] > raw[size_t(top)])) top = i;
  if (top >= 0)
    add(l, top, "the largest raw score",
        format("Raw s = %.4g becomes %.4g after the cap. Without it this key would weigh e^%.3g "
               "times more than a key at 0; with it, at most e^%.3g.",
               raw[size_t(top)], model.scores()[size_t(top)], raw[size_t(top)], c));
  add_end(l, model,
          "The output is softmax of the capped scores: it matches float64 with the same cap "
          "(Output panel).");
}

void lesson_q4_kv(Lesson& l, const Model& model) {
  l.intro =
      "K and V are stored as ggml's q4_0: each block of 32 values keeps one fp16 scale d and, "
      "per value, 4 bits q, standing for d (q - 8): 16 levels. The kernels dequantise a tile "
      "as they load it and then run the same recurrences, so against float64 on the stored "
      "values they are as exact as in fp32 (error plot); what 4 bits cost is the distance of "
      "those values from the inputs, which the Output panel measures beside fp16's.";
  int first = first_visible(model);
  add(l, first, "the first key",
      "The first key's score is already s of the dequantised key: every curve here, the float64 "
      "one included, sees the stored values.");
  add_end(l, model,
          format("Storing K and V in q4_0 moved this row's output by %.2e from float64 on the "
                 "inputs as given; fp16 would have moved it by %.2e. The kernels' own error is "
                 "the Output panel's max |o - o_ref|.",
                 model.storage_cost(), model.fp16_cost()));
}

void lesson_fp16_overflow(Lesson& l, const Model& model) {
  l.intro =
      "fp16 stores numbers up to 65504, so e^s overflows fp16 above s = ln 65504 = 11.09 (red "
      "line in the score plot). flashvk stores Q, K, V in fp16 but keeps m, l and o in fp32 "
      "relative to the max, so nothing overflows.";
  double limit = std::log(65504.0);
  int over = -1;
  for (int i = 0; i < model.steps(); ++i)
    if (model.scores()[size_t(i)] > limit) {
      over = i;
      break;
    }
  add(l, first_visible(model), "the first key", "Scores start small: nothing to see yet.");
  add(l, over, "e^s passes 65504",
      "A kernel forming e^s (or its sum) in fp16 has overflowed here; e^(s - m) stays <= 1.");
  add(l, heaviest_key(model), "the heaviest key",
      "The largest score: m settles here and later keys are measured against it.");
  add_end(l, model,
          "Nothing overflowed: every state is finite. fp16 storage costs precision (the error "
          "plot), not range.");
}

// Each preset's lesson, by its name (presets.def); sample's, random inputs' and files' are the
// general walk through a row.
void lesson_sample(Lesson& l, const Model& model) {
  general(l, model);
}

struct LessonRow {
  const char* name;
  void (*lesson)(Lesson&, const Model&);
};
const LessonRow kLessons[] = {
#define PRESET(id, name, about) {name, lesson_##id},
#include "presets.def"
#undef PRESET
};

}  // namespace

int literal_flashd_zero(const Model& model) {
  const auto& lit = model.literal_flashd().w;
  for (size_t i = 0; i < lit.size(); ++i)
    if (lit[i] == 0.0 && visible(model, int(i))) return int(i);
  return -1;
}

int literal_flashd_underflow(const Model& model) {
  const auto& lit = model.literal_flashd().w;
  const auto& exact = model.ref_of(Variant::flashd).w;
  for (size_t i = 0; i < lit.size() && i < exact.size(); ++i)
    if (lit[i] == 0.0 && exact[i] > kUnderflowFloor) return int(i);
  return -1;
}

Lesson lesson_for(const Model& model) {
  Lesson l;
  if (model.steps() == 0) return l;
  const std::string& name = model.inputs().name;
  auto row = std::find_if(std::begin(kLessons), std::end(kLessons),
                          [&](const LessonRow& r) { return name == r.name; });
  (row == std::end(kLessons) ? general : row->lesson)(l, model);
  std::stable_sort(l.points.begin(), l.points.end(),
                   [](const auto& a, const auto& b) { return a.step < b.step; });
  return l;
}

}  // namespace flashvk::viewer
