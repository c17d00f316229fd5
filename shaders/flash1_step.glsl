// FlashAttention's recurrence (docs/algorithms.md, variants, flash1), one tile at a time, for every layout
// that runs it (the fused kernels: flash1.comp; the matrix kernel: flash_cm.comp), with the
// interface of flash2_step.glsl. The output is kept normalised at every step:
// o <- o * (l_prev e^(m_prev - m_new) / l_new) + sum_c v_c e^(s_c - m_new) / l_new.
#include "max_state.glsl"

void tile_step(uint rr, float ref, float l_tile, out float keep, out float coef) {
  float l_prev = l_run[rr];
  float alpha = rescale_state(rr, ref, l_tile);
  float inv = l_run[rr] > 0.0 ? 1.0 / l_run[rr] : 0.0;
  keep = l_prev * alpha * inv;  // the old output's share in the new one (0 while nothing is seen)
  coef = inv;
}

float out_scale(uint rr) { return 1.0; }
