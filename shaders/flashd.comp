#version 460
#extension GL_GOOGLE_include_directive : require
// FLASH-D (flashd_step.glsl) in the fused kernels: no running max and no division of the output;
// each chunk blends into the normalised output with a sigmoid weight, o <- o (1 - w) + v w.
#include "common.glsl"
#include "tile.glsl"
#include "flashd_step.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float t_tile[ROWS];  // log-sum-exp of the current tile's scores, for its weight in traces

void tile_begin(uint pass, uint rr) { t_tile[rr] = NEG_INF; }

void trace_chunk(uint rr, float ref, float l_chunk) {
  if (l_chunk == 0.0) return;
  float t = ref + log(l_chunk), tt = t_tile[rr];
  t_tile[rr] = tt == NEG_INF ? t : max(tt, t) + softplus(-abs(tt - t));
}

#include "fused_step.glsl"

void tile_end(uint pass, uint j0, uint rr) {
  float lse = lse_run[rr], tt = t_tile[rr];
  if (!is_traced(rows[rr]) || lse == NEG_INF) return;
  uint t = j0 / BC;
  // The tile's weight in the output: e^(t_tile - L_end), which is sigma(t_tile - L_start).
  trace_put(t, 3u, tt == NEG_INF ? 0.0 : exp(tt - lse));
  trace_put(t, 4u, lse);
  [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}

#include "fused_main.glsl"
