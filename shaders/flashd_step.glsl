// FLASH-D's recurrence (docs/algorithms.md, variants, flashd), one tile at a time, for every layout that runs it (the
// fused kernels: flashd.comp; the matrix kernel: flash_cm.comp), with the interface of
// flash2_step.glsl. No running max and no division of the output: each tile blends into the
// normalised output with a sigmoid weight, o <- o (1 - w) + w * (the tile's normalised output).
//
// The seed writes w_i = sigma(s_i - s_{i-1} + ln w_{i-1}). In fp32, ln w_{i-1} underflows to -inf
// after a long run of falling scores and every later weight becomes 0. Since
// s_{i-1} - ln w_{i-1} = ln(sum_{j<i} e^{s_j}) =: L_{i-1} exactly, we carry the running
// log-sum-exp L instead: w_i = sigma(s_i - L_{i-1}), L_i = L_{i-1} + softplus(s_i - L_{i-1}).
// L is bounded by the scores themselves, so it never under- or overflows, and a masked key
// (s = -inf) gives w = 0 and leaves L alone. Per tile, the tile's own log-sum-exp t plays the part
// of s: w = sigma(t - L), and the tile's normalised output plays the part of v. A tile's scores
// are exponentiated against their own max m (tile_ref), so with t = m + ln l and a = m - L, w,
// 1 - w and the new L come from one exp, one division and one log, without forming t
// (sigma_step). See docs/algorithms.md for the derivation.
float lse_run[ROWS];  // L: log of the softmax denominator of the keys seen so far

void state_start(uint rr) { lse_run[rr] = start_max(rr); }  // L = ln e^sink, or -inf
// The state as numbers (max_state.glsl): L alone.
const uint STATE_WORDS = 1u;
float state_word(uint rr, uint k) { return lse_run[rr]; }
void set_state_word(uint rr, uint k, float x) { lse_run[rr] = x; }

// One step of L and of the weights, from the tile's max m and sum l (l > 0). x = t - L = a + ln l
// with a = m - L, and w = sigma(x). With u = e^-|a| (at most 1, so nothing overflows): for a <= 0,
// w = l u / (1 + l u); for a > 0, w = l / (l + u). keep = 1 - w, wt = w / l (each key's
// coefficient is its p times wt), and L + softplus(x) = max(L, m) + ln(denominator). Selects, not
// branches: llvmpipe would run both sides.
void sigma_step(float m, float l, inout float lse, out float keep, out float wt) {
  bool first = lse == NEG_INF;  // the first visible tile: w = 1, L = t
  float a = first ? 1.0 : m - lse;
  float u = first ? 0.0 : exp(-abs(a));  // exp(-inf) spelled out as 0
  bool below = a <= 0.0;
  float y = l * u;
  float inv = 1.0 / (below ? 1.0 + y : l + u);
  keep = below ? inv : u * inv;
  wt = below ? u * inv : inv;
  float log_den = below && y < 1e-4 ? y - 0.5 * y * y : log(below ? 1.0 + y : l + u);
  lse = (below ? lse : m) + log_den;
}

// FLASH-D weighs each tile by its own log-sum-exp: its scores are taken against their own max.
float tile_ref(uint rr, float m_tile) { return m_tile; }

// A tile that shows nothing (l_tile = 0: m_tile = -inf) gives w = 0 and leaves L alone; selects,
// not a branch, keep it so (a row's branch costs register tiles more than the few operations it
// would skip).
void tile_step(uint rr, float ref, float l_tile, out float keep, out float coef) {
  bool seen = l_tile > 0.0;
  float lse = lse_run[rr], k, wt;
  sigma_step(seen ? ref : 0.0, seen ? l_tile : 1.0, lse, k, wt);
  lse_run[rr] = seen ? lse : lse_run[rr];
  keep = seen ? k : 1.0;
  coef = seen ? wt : 0.0;
}

float out_scale(uint rr) { return 1.0; }
float row_lse(uint rr) { return lse_run[rr]; }
