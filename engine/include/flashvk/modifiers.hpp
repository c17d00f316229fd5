#pragma once
// Modifiers: everything attention does to a row's scores besides scale * q.k, in one value type
// with one home (engine/src/modifiers.cpp): each modifier's fields here, its validation, its
// encoding for the kernels (shaders/modifiers.glsl) and its description, which the front ends
// (the CLI's options and help, bench's columns, traces, the viewer) read instead of naming
// modifiers one by one. docs/algorithms.md, "Modifiers", gives the order they act in.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "flashvk/tensor.hpp"

namespace flashvk {

struct Dims;

/// Query i of Nq sits on key i + Nk - Nq, its diagonal (bottom-right aligned, as decoding with a
/// KV cache needs): every limit below is relative to it.
struct Modifiers {
  /// Causal attention: query i sees keys j up to its diagonal (window_right = 0).
  bool causal = false;
  /// Sliding window: query i sees keys j with diagonal - window_left <= j <= diagonal +
  /// window_right; -1 leaves that side unbounded. Keys outside are never read by the fused
  /// variants: their cost grows with the window, not with Nk (naive reads every key).
  int64_t window_left = -1, window_right = -1;
  /// Chunked attention (Llama 4's attention_chunk_size): with C > 0, query i sees key j only
  /// when j / C = diagonal / C (rounded down: the same chunk of C keys); with `causal`, up to
  /// the diagonal as well. Keys outside the chunk are never read (fused variants): the cost
  /// grows with C, not with Nk. 0 = off.
  uint32_t chunk_size = 0;
  /// Logit softcapping (Gemma 2): s = softcap * tanh(s / softcap), before ALiBi; 0 = off.
  float softcap = 0.0f;
  /// ALiBi: s -= slope * |diagonal - j|, one slope per query head ([H]) or per batch and head
  /// ([B * H]). When empty and alibi_max_bias > 0, the slopes are alibi_slopes(H, max_bias).
  std::vector<float> alibi_slopes;
  float alibi_max_bias = 0.0f;
  /// Attention sinks (gpt-oss): one logit per query head ([H]), unscaled and never masked, in
  /// the softmax's denominator only: O = sum_j e^(s_j) v_j / (sum_j e^(s_j) + e^(sink)). LSE
  /// includes it; a row that sees no key gives O = 0 and LSE = sink.
  std::vector<float> sinks;
  /// Additive mask added to the scores last: [Nq, Nk], or [Bm, Hm, Nq, Nk] with Bm 1 or B and
  /// Hm 1 or H (broadcast). -inf hides a key; NaN and +inf are refused. Keys before a row's
  /// first finite entry and after its last are never read, nor are tiles it hides from every
  /// row of a workgroup (fused variants). bool_mask() turns PyTorch's boolean attn_mask into one.
  HostTensor mask;
  /// What the mask is, in words, for the labels of a run ("causal", "documents of 512"): a
  /// mask's text is then "mask (name)" instead of "mask [shape]". Optional.
  std::string mask_name;
  /// [B, Nk]: 0 hides key j from every query of batch b (padding).
  std::vector<uint8_t> key_mask;
  /// Attention its user writes (FlexAttention's score_mod and mask_mod): GLSL compiled into the
  /// kernels at run time by flashvk::flex (flashvk/flex.hpp: link flashvk::flex, call
  /// flex::enable(ctx) once). docs/engine.md shows how to write them.
  /// - score_mod defines `float score_mod(float score, int b, int h, int q_idx, int kv_idx)`: the
  ///   scaled score of query q_idx (0..Nq-1) of query head h and key kv_idx, after softcap and
  ///   before ALiBi and the additive mask, becomes what it returns.
  /// - mask_mod defines `bool mask_mod(int b, int h, int q_idx, int kv_idx)`: false hides the key.
  /// Both may read the ints FLEX_NQ and FLEX_NK (Nq and the keys attended: query q_idx sits on
  /// key q_idx + FLEX_NK - FLEX_NQ) and `flex_table[]`. "" = none.
  std::string score_mod, mask_mod;
  /// Where each came from, for errors and labels ("doc_mask.glsl"); "" names it by its role.
  std::string score_mod_name, mask_mod_name;
  /// The functions' `float flex_table[]`, read flat whatever its shape; empty: none.
  HostTensor flex_table;
  /// The functions' float64 twins, which the CPU reference (flashvk/reference.hpp) applies in
  /// their place: it cannot run GLSL and refuses user functions without them.
  std::function<double(double score, int b, int h, int q_idx, int kv_idx)> score_twin;
  std::function<bool(int b, int h, int q_idx, int kv_idx)> mask_twin;

  bool alibi() const { return !alibi_slopes.empty() || alibi_max_bias > 0; }
  bool has_mask() const { return !mask.shape.empty() || !mask.data.empty(); }
  bool user_functions() const { return !score_mod.empty() || !mask_mod.empty(); }
};

/// The sliding window with `causal` folded in: (left, right) keys around the diagonal, -1 for
/// an unbounded side.
struct Window {
  int64_t left = -1, right = -1;
};
Window effective_window(const Modifiers& mods);

/// The keys query i of Nq sees through the limits that cut a row's keys into one range (the
/// window, causal, the chunk), [begin, end) of Nk (begin == end: none). The host's twin of the
/// shaders' row_keys (shaders/modifiers.glsl), where an additive mask narrows it further.
struct KeyRange {
  int64_t begin = 0, end = 0;
};
KeyRange window_keys(const Modifiers& mods, uint32_t nq, uint32_t nk, uint32_t i);

/// ALiBi's slope for (batch b, query head h) of H heads: alibi_slopes ([H] or [B * H]), or from
/// alibi_max_bias, or 0 without ALiBi.
float alibi_slope(const Modifiers& mods, uint32_t heads, uint32_t b, uint32_t h);
/// ggml's ALiBi slopes from max_bias for H heads: n = 2^floor(log2 H), m0 = 2^(-max_bias / n),
/// m1 = 2^(-max_bias / (2n)); slope_h = m0^(h + 1) for h < n, else m1^(2(h - n) + 1).
std::vector<float> alibi_slopes(uint32_t heads, float max_bias);

/// Throws Error naming the field unless every modifier is well formed for `dims`: sides of at
/// least -1, a finite non-negative softcap and max_bias, one slope or sink per head, a mask
/// whose shape broadcasts to [B, H, Nq, Nk] without NaN or +inf, a key mask of B * Nk.
void check_modifiers(const Modifiers& mods, const Dims& dims);

/// The modifiers in words, as a run names them: "causal window 1023,0 softcap 30 alibi sinks
/// mask [2048, 2048]"; "" for none.
std::string modifier_text(const Modifiers& mods);
/// How the kernels form the score of key `key` from the scaled dot product, for teaching:
/// "c tanh(scale q.k_j / c) - slope |diag - j| + mask" (diag: the row's diagonal, i + Nk - Nq).
std::string score_formula(const Modifiers& mods, const std::string& key = "j");
/// JSON members (name, JSON text) that record the modifiers, in the table's order: with
/// `row` those of one query row as it met them (its window, softcap, ALiBi slope and sink: the
/// trace JSON), else the settings (bench JSON). docs/formats.md lists them.
struct TracedRow {
  uint32_t heads = 1, batch = 0, head = 0;
};
std::vector<std::pair<std::string, std::string>> modifier_json(const Modifiers& mods,
                                                               const TracedRow* row = nullptr);

}  // namespace flashvk
