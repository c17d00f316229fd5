// The state of the recurrences that keep a running max (the online softmax, FlashAttention
// and FlashAttention-2): per row rr, the max m of the scores seen and the denominator l relative
// to it. A tile (or chunk, or a cluster's step) of scores is exponentiated against the running
// max after it (tile_ref), and rescale_state() moves the state there, adding the tile's sum.
float m_run[ROWS];  // running max of the scores seen so far
float l_run[ROWS];  // running denominator, relative to m_run

void state_start(uint rr) {
  m_run[rr] = start_max(rr);  // -inf, or the sink's logit (modifiers.glsl)
  l_run[rr] = start_sum(rr);
}

// The state as STATE_WORDS numbers, for a kernel that keeps it elsewhere between tiles (the
// matrix kernel's row operations keep it in accumulator matrices, flash_cm.comp).
const uint STATE_WORDS = 2u;
float state_word(uint rr, uint k) { return k == 0u ? m_run[rr] : l_run[rr]; }
void set_state_word(uint rr, uint k, float x) {
  if (k == 0u) m_run[rr] = x;
  else l_run[rr] = x;
}

// The max that a tile's scores, whose own max is m_tile (-inf: none seen), are exponentiated
// against: the running max once the tile is in.
float tile_ref(uint rr, float m_tile) { return max(m_run[rr], m_tile); }

// Moves row rr's state to max `ref` (tile_ref) and adds l_tile, the tile's sum of e^(s - ref);
// returns alpha = e^(m_old - ref), the factor of everything summed before. No branch while nothing
// is visible (ref = -inf; llvmpipe would run both sides): alpha = 0 keeps the state empty, and
// exp(-inf) is spelled out as 0, as Vulkan does not promise IEEE infinities in exp().
float rescale_state(uint rr, float ref, float l_tile) {
  float alpha = m_run[rr] == NEG_INF ? 0.0 : exp(m_run[rr] - ref);
  l_run[rr] = l_run[rr] * alpha + l_tile;
  m_run[rr] = ref;
  return alpha;
}

// The row's log-sum-exp, LSE = m + ln l (-inf when it saw nothing).
float row_lse(uint rr) { return l_run[rr] > 0.0 ? m_run[rr] + log(l_run[rr]) : NEG_INF; }
