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
#ifdef REG_TILE
float m_drop[ROWS];  // m_prev - m_new of the current chunk (-inf: nothing seen before)
float l_new[ROWS];   // the chunk's sum of e^(s - m_new)
#endif

void state_init(uint rr) {
  m_run[rr] = NEG_INF;
  l_run[rr] = 0.0;
  [[unroll]] for (uint e = 0; e < OD; ++e) o_acc[rr][e] = 0.0;
}

void tile_begin(uint pass, uint rr) { l_tile[rr] = 0.0; }

void chunk_update(uint pass, uint c0, uint rr) {
  o_hold(rr);
  float m_new = max(m_run[rr], chunk_max(rr));
  // Nothing visible yet: the state stays empty. Register tiles take no branch (llvmpipe runs
  // both sides of one, with a blend for every value written after it); there the selects below
  // and in chunk_rows_done keep the state empty: alpha = 0, p = 0, l = 0, o = 0 * 0.
#ifndef REG_TILE
  if (m_new == NEG_INF) return;
#endif
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[rr][ci] == NEG_INF ? 0.0 : exp(sc[rr][ci] - m_new);
    l_chunk += p[ci];
  }
  l_chunk = chunk_sum(l_chunk);
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = p[ci];
#ifdef REG_TILE
  m_drop[rr] = m_run[rr] == NEG_INF ? NEG_INF : m_run[rr] - m_new;
  l_new[rr] = l_chunk;
#else
  // exp(-inf) is spelled out as 0: Vulkan does not promise IEEE infinities in exp().
  float alpha = m_run[rr] == NEG_INF ? 0.0 : exp(m_run[rr] - m_new);
  l_run[rr] = l_run[rr] * alpha + l_chunk;
  l_tile[rr] = l_tile[rr] * alpha + l_chunk;
  o_keep[rr] = alpha;
#endif
  m_run[rr] = m_new;
}

#ifdef REG_TILE
#define HAS_CHUNK_ROWS_DONE
// Register tiles: a row's rescale factor e^(m_prev - m_new) is the same in every lane, so after
// every row's step the rows are packed one per lane and all their factors are one exp.
void chunk_rows_done(uint pass) {
  uint lane = gl_SubgroupInvocationID;
  float drop = NEG_INF;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) drop = lane == rr ? m_drop[rr] : drop;
  float alphas = drop == NEG_INF ? 0.0 : exp(drop);
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    float alpha = subgroupShuffle(alphas, rr);
    l_run[rr] = l_run[rr] * alpha + l_new[rr];
    o_keep[rr] = alpha;
  }
}
#endif

void tile_end(uint pass, uint j0, uint rr) {
  float m = m_run[rr], l = l_run[rr];
  if (!is_traced(rows[rr]) || l == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m);
  trace_put(t, 2u, l);
  trace_put(t, 3u, l_tile[rr] / l);  // the tile's share of the denominator
  trace_put(t, 4u, m + log(l));
  [[unroll]] for (uint e = 0; e < OD; ++e) trace_put(t, TRACE_FIELDS + e, o_acc[rr][e]);
}

void state_finish(uint rr) {
  uint row = rows[rr].bh * pc.nq + rows[rr].i;
  float m = m_run[rr], l = l_run[rr];
  float inv = l > 0.0 ? 1.0 / l : 0.0;
#ifdef SPLIT_KV
  // Per seed 002 each chunk returns its normalised o', its max m and its denominator d'.
  uint part = row * pc.splits + gl_WorkGroupID.z;
  store_partial(part * DV, rr, inv);
  if (first_lane()) {
    scratch2[part * 2u] = m;
    scratch2[part * 2u + 1u] = l;
  }
#else
  store_o(row * DV, rr, inv);
  if ((pc.flags & FLAG_LSE) != 0u && first_lane()) lse_buf[row] = l > 0.0 ? m + log(l) : NEG_INF;
#endif
}

#include "fused_main.glsl"
