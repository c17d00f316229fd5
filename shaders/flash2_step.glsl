// FlashAttention-2's recurrence (docs/algorithms.md, variants, flash2), one tile at a time, for every layout: the fused
// kernels (flash2_state.glsl), the matrix kernel (flash_cm.comp) and the decoding kernel
// (splitkv_lanes.comp) call these and differ only in how they form a tile's scores and sums.
// Lazy rescaling: the output o is kept unnormalised, o <- o * e^(m_prev - m_new) + sum_c
// e^(s_c - m_new) v_c, and divided by l once at the end.
//   tile_ref(rr, m_tile)               the max the tile's scores are exponentiated against
//   tile_step(rr, ref, l_tile, keep, coef)  the state after the tile, whose sum of e^(s - ref)
//                                      is l_tile; the output becomes o * keep + coef * sum p v
//   out_scale(rr), row_lse(rr)         what the output is multiplied by at the end, and LSE
#include "max_state.glsl"

void tile_step(uint rr, float ref, float l_tile, out float keep, out float coef) {
  keep = rescale_state(rr, ref, l_tile);
  coef = 1.0;
}

float out_scale(uint rr) { return l_run[rr] > 0.0 ? 1.0 / l_run[rr] : 0.0; }
