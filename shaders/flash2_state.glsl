// FlashAttention-2 (flash2_step.glsl) in the fused kernels: flash2.comp, and splitkv.comp (seed
// 002, Flash-Decoding), which runs it over one chunk of keys per workgroup and stores each
// chunk's (o', m, l) for the log-sum-exp merge.
#include "common.glsl"
#include "tile.glsl"
#include "flash2_step.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float l_tile[ROWS];  // the current tile's part of l_run, for its share in traces

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void trace_chunk(uint rr, float ref, float l_chunk) {
  float m_prev = m_run[rr];
  l_tile[rr] = l_tile[rr] * (m_prev == NEG_INF ? 0.0 : exp(m_prev - ref)) + l_chunk;
}

#include "fused_step.glsl"

void tile_end(uint pass, uint j0, uint rr) {
  float m = m_run[rr], l = l_run[rr];
  if (!is_traced(rows[rr]) || l == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m);
  trace_put(t, 2u, l);
  trace_put(t, 3u, l_tile[rr] / l);  // the tile's share of the denominator
  trace_put(t, 4u, m + log(l));
  [[unroll]] for (uint e = 0; e < OW; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}

void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
#ifdef SPLIT_KV
  // Per seed 002 each chunk returns its normalised o', its max m and its denominator d'.
  uint part = row * pc.splits + gl_WorkGroupID.z;
  store_partial(part * DV, rr, out_scale(rr));
  scratch2[part * 2u] = m_run[rr];
  scratch2[part * 2u + 1u] = l_run[rr];
#else
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, out_scale(rr));
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = row_lse(rr);
#endif
}

#include "fused_main.glsl"
