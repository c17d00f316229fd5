// FlashAttention-2 (seed 000 §3): one pass, lazy rescaling. The output accumulator is kept
// unnormalised, o <- o * e^(m_prev - m_new) + sum_c e^(s_c - m_new) v_c, and divided by l once at
// the end. splitkv (seed 002, Flash-Decoding) runs the same recurrence over one chunk of keys per
// workgroup and stores each chunk's (o, m, l) for the log-sum-exp merge.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float m_run[ROWS];   // running max of the scores seen so far
float l_run[ROWS];   // running denominator, relative to m_run
float l_tile[ROWS];  // the current tile's part of l_run, for its share in traces

void state_init(uint rr) {
  m_run[rr] = start_max(rr);
  l_run[rr] = start_sum(rr);
  [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] = 0.0;
}

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void chunk_update(uint pass, uint c0, uint rr) {
  o_hold(rr);
  float m_new = max(m_run[rr], chunk_max(rr));
  // No branch while nothing is visible (m_new = -inf; llvmpipe would run both sides, blending
  // every value written after it): the selects keep the state empty, alpha = 0, p = 0, l = 0,
  // o = 0 * 0. exp(-inf) is spelled out as 0: Vulkan does not promise IEEE infinities in exp().
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - m_new);
    l_chunk += p[ci];
  }
  l_chunk = row_sum(l_chunk);
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = p[ci];
  float alpha = m_run[rr] == NEG_INF ? 0.0 : exp(m_run[rr] - m_new);
  l_run[rr] = l_run[rr] * alpha + l_chunk;
  l_tile[rr] = l_tile[rr] * alpha + l_chunk;
  o_keep[rr] = alpha;
  m_run[rr] = m_new;
}

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
  float m = m_run[rr], l = l_run[rr];
  float inv = l > 0.0 ? 1.0 / l : 0.0;
#ifdef SPLIT_KV
  // Per seed 002 each chunk returns its normalised o', its max m and its denominator d'.
  uint part = row * pc.splits + gl_WorkGroupID.z;
  store_partial(part * DV, rr, inv);
  scratch2[part * 2u] = m;
  scratch2[part * 2u + 1u] = l;
#else
  store_o(o_at(rows[rr].bh, rows[rr].i), rr, inv);
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l > 0.0 ? m + log(l) : NEG_INF;
#endif
}

#include "fused_main.glsl"
