// The score modifiers on the kernels' side (flashvk/modifiers.hpp and engine/src/modifiers.cpp
// on the host's, which encodes them into the push constants, MODS and the small tables): which
// keys a query row sees, where it starts from (an attention sink), and the hook every score
// passes through. common.glsl includes it once its rows are declared.
const uint MOD_SOFTCAP = 1u;  // s = c tanh(s / c)
const uint MOD_ALIBI = 2u;    // s -= slope |diagonal - j|
const uint MOD_SINKS = 4u;    // a sink logit in the denominator
const uint MOD_MASK = 8u;     // an additive float mask (in table_words, from pc.mask_values)
const uint MOD_TILES = 16u;   // a tile bitmap (pc.mask_tiles): an additive mask's, or mask_mod's
const uint MOD_SOFTCAP_WIDE = 32u;  // a softcap past 64: tanh's series near 0 (modify_score)

// The one place that says which keys a query row sees: [begin, end), bottom-right aligned, so that
// query i sits on key i + Nk - Nq (its diagonal), and the sliding window (left, right) keeps keys
// diagonal - left .. diagonal + right (-1: unbounded; causal is right = 0, set by the host), and a
// chunk size C those of the diagonal's chunk of C keys. Every kernel and layout takes its key
// loop's bounds and its per-key test (key_visible, or in flash_cm.comp's tile_softmax the same
// range as per-lane bounds) from here, so the fused kernels never read keys outside the window
// (naive's scores pass writes every key's score, -inf for hidden ones).
// With an additive mask the keys also stop at the row's first and last finite mask entry.
uint mask_row_of(uint b, uint h, uint i) {
  return b * pc.mask_bstride + h * pc.mask_hstride + i;
}

void row_keys(uint b, uint h, uint i, out uint begin, out uint end) {
  int nk = int(seq_len(b));  // Nk, or sequence b's own length in a paged cache
  int diag = int(i) + nk - int(pc.nq);
  int lo = pc.window_left < 0 ? 0 : diag - pc.window_left;
  int hi = pc.window_right < 0 ? nk : diag + pc.window_right + 1;
  if (pc.chunk_size > 0u) {  // Llama 4: the keys of the diagonal's chunk (none before key 0)
    int c = int(pc.chunk_size), first = diag >= 0 ? diag / c * c : -c;
    lo = max(lo, first);
    hi = min(hi, first + c);
  }
  if ((MODS & MOD_MASK) != 0u) {
    uint at = pc.mask_ranges + 2u * mask_row_of(b, h, i);
    lo = max(lo, int(table_words[at]));
    hi = min(hi, int(table_words[at + 1u]));
  }
  begin = uint(clamp(lo, 0, nk));
  end = uint(clamp(hi, int(begin), nk));
}

// The modifiers of row r of query head h: its additive mask row, its ALiBi slope and its sink.
void row_modifiers(inout Row r, uint h) {
  r.mask_row = (MODS & MOD_MASK) != 0u ? mask_row_of(r.b, h, r.i) : 0u;
  r.slope = 0.0;
  r.sink = NEG_INF;
  if ((MODS & (MOD_ALIBI | MOD_SINKS)) != 0u) {
    vec2 head = head_buf[r.bh];
    r.slope = head.x;
#ifndef SPLIT_KV  // splitkv's chunks start empty; the merge adds the sink once
    if ((MODS & MOD_SINKS) != 0u) r.sink = head.y;
#endif
  }
}

// Whether row rr sees key j: inside its keys and not hidden by the key mask. (Register tiles
// read the key mask once per lane and shuffle it: they test in_row_keys and the mask apart.)
bool key_visible(uint rr, uint j) {
  if (!in_row_keys(rr, j)) return false;
  // Nested, not `&&`: glslang turns `a && b` into OpLogicalAnd, which evaluates the load even
  // when no mask is bound (the binding then holds a 16-byte placeholder).
  if (KEY_MASK) {
    if (table_words[rows[rr].b * pc.nk + j] == 0u) return false;
  }
  return true;
}

uint mask_stride() { return (pc.nk + 3u) & ~3u; }
// Where row rr's additive mask starts among the mask's values (pc.mask_values in table_words).
uint mask_row_start(uint rr) { return rows[rr].mask_row * mask_stride(); }

// The additive mask of row rr at key j (MOD_MASK). Register tiles prefetch their tile's entries
// four keys a texel (tile.glsl): llvmpipe runs a per-lane storage-buffer read as a loop over the
// lanes, and a texel fetch as a called gather.
#ifdef REG_TILE
float mask_value(uint rr, uint j);
#else
float mask_value(uint rr, uint j) {
  return uintBitsToFloat(table_words[pc.mask_values + mask_row_start(rr) + j]);
}
#endif

// The score hook: every kernel and layout turns the scaled dot product s = scale * q.k of row rr
// and key j into the score its recurrence uses here, and only here. Softcapping first, then
// ALiBi's bias (FlashAttention-2 and ggml's order), then the additive mask. Softcapping's
// c tanh(x), x = s / c, is c - 2 c / (e^2x + 1): one exponential and one reciprocal, where GLSL's
// tanh took two exponentials and a division (AMD's compiler: the matrix kernel's latency
// estimate over causal's +45% -> +29% at d = 64); x clamped to +-15, where tanh is +-1 in fp32.
// Its error is about c 2^-24 in every score, as is GLSL's tanh on Mesa (3e-6 at Gemma 2's c = 50),
// so past c = 64 (MOD_SOFTCAP_WIDE, the host's choice: kSoftcapFastMax) scores whose x is
// under 1/8 take tanh's series.
#ifdef FLEX
// User-written attention (Modifiers::score_mod, mask_mod), compiled in at run time by
// flashvk::flex, whose include serves flex_functions.glsl: flex_table[] (binding 14), FLEX_NQ and
// FLEX_NK, then the user's files. Their indices: batch, query head, query row, key.
int FLEX_NQ, FLEX_NK;
#include "flex_functions.glsl"
#endif

// Everything but the additive mask (for a kernel that fetched the mask's entries itself:
// row_score_fetched); modify_score below adds the mask last.
float modify_score_before_mask(uint rr, uint j, float s) {
#ifdef FLEX
  int flex_b = int(rows[rr].b), flex_i = int(rows[rr].i);
  int flex_h = int(rows[rr].bh - rows[rr].b * pc.heads);  // bh % H, without a division
  FLEX_NQ = int(pc.nq);
  FLEX_NK = int(seq_len(rows[rr].b));
#ifdef FLEX_MASK_MOD
  if (!mask_mod(flex_b, flex_h, flex_i, int(j))) return NEG_INF;
#endif
#endif
  if ((MODS & MOD_SOFTCAP) != 0u) {
    float x = clamp(s / pc.softcap, -15.0, 15.0), x2 = x * x;
    float capped = pc.softcap - 2.0 * pc.softcap / (exp2(x * 2.8853900817779268) + 1.0);
    if ((MODS & MOD_SOFTCAP_WIDE) != 0u)  // tanh's series below 1/8 (to x^7: within 2^-22)
      capped = abs(x) < 0.125
                   ? s * (1.0 - x2 * (1.0 / 3.0 - x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
                   : capped;
    s = capped;
  }
#if defined(FLEX_SCORE_MOD) && !defined(FLEX_TILES)  // the tile pass asks what mask_mod hides
  s = score_mod(s, flex_b, flex_h, flex_i, int(j));
#endif
  if ((MODS & MOD_ALIBI) != 0u) s -= rows[rr].slope * float(abs(rows[rr].diag - int(j)));
  return s;
}

float modify_score(uint rr, uint j, float s) {
  s = modify_score_before_mask(rr, j, s);
  // -inf from the mask hides the key: every recurrence treats it as masked.
  if ((MODS & MOD_MASK) != 0u) s += mask_value(rr, j);
  return s;
}

// The state a row's recurrence starts from: nothing seen (m = -inf, l = 0), or with an attention
// sink s the sink as a key of zero value seen first: m = s, l = 1 (FLASH-D: L = s). A row that
// then sees no key keeps O = 0 and LSE = s.
float start_max(uint rr) { return rows[rr].sink; }
float start_sum(uint rr) { return rows[rr].sink == NEG_INF ? 0.0 : 1.0; }

// Whether modify_score can hide a key itself (return -inf): the additive mask, or a user's
// mask_mod or score_mod. Where it cannot, a row's score is -inf exactly where `seen` was false,
// and a kernel may test that instead of the score.
#ifdef FLEX
const bool SCORE_MAY_HIDE = true;
#else
const bool SCORE_MAY_HIDE = (MODS & MOD_MASK) != 0u;
#endif

// Whether modify_score reads its row (the additive mask, ALiBi, a user's function): where it
// does not, a kernel that has already tested the row's range and key mask may call it on any row.
#ifdef FLEX
const bool SCORE_READS_ROW = true;
#else
const bool SCORE_READS_ROW = (MODS & (MOD_ALIBI | MOD_MASK)) != 0u;
#endif

// Row rr's score for key j, or -inf where `seen` says the row does not see it.
float row_score(uint rr, uint j, bool seen, float scaled_dot) {
  return seen ? modify_score(rr, j, scaled_dot) : NEG_INF;
}
// The same with the additive mask's entry for (rr, j) given, where a kernel fetched its tile's
// entries ahead of their use (MOD_MASK; flash_cm.comp's fetch_mask).
float row_score_fetched(uint rr, uint j, bool seen, float scaled_dot, float mask) {
  return seen ? modify_score_before_mask(rr, j, scaled_dot) + mask : NEG_INF;
}

// The tile bitmap (MOD_TILES; the fused kernels): a bit per workgroup and tile of BC keys, set
// where a row of the workgroup sees a key of the tile: from an additive mask's finite entries
// (modifiers.cpp set_mask_tiles), or with mask_mod from flex_tiles.comp, run before. This is the
// word holding tile t's bit (bit t % 32).
uint mask_tile_word(uint t) {
  uint tiles = (lengths.tile_keys + BC - 1u) / BC, words = (tiles + 31u) / 32u;
  uint base = pc.mask_tiles + (workgroup_kv_head() * gl_NumWorkGroups.x + row_block()) * words;
  return table_words[base + t / 32u];
}

// The first tile from key j0 on (a multiple of BC) whose bit is set, or `end`. The key loops step
// from one such tile to the next, so fully masked tiles cost nothing: a branch around a tile
// would not (llvmpipe runs both sides of a branch on a loaded value), and the row ranges only cut
// a row's ends. Every invocation reads the same words, so a workgroup steps together. Never
// before j0: a splitkv chunk past the keys starts at Nk, which need not be a tile's first key,
// and must stay empty.
uint next_seen_tile(uint j0, uint end) {
  if ((MODS & MOD_TILES) == 0u) return j0;
  for (uint t = j0 / BC; t * BC < end; t = (t / 32u + 1u) * 32u) {
    uint bits = mask_tile_word(t) >> (t % 32u);
    if (bits != 0u) return min(end, max(j0, (t + uint(findLSB(bits))) * BC));
  }
  return end;
}

// Whether tile j0's bit (j0 a multiple of BC) is set; always without MOD_MASK. For kernels whose
// invocations walk different tiles (lanes: each cluster its own), which branch around a hidden
// tile: never read, which saves a GPU its memory traffic (on llvmpipe the branch saves little).
bool tile_seen(uint j0) {
  if ((MODS & MOD_TILES) == 0u) return true;
  return ((mask_tile_word(j0 / BC) >> (j0 / BC % 32u)) & 1u) != 0u;
}
