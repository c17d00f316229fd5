// FlashAttention-2 (seed 000 §3): one pass, lazy rescaling. The output accumulator is kept
// unnormalised, o <- o * e^(m_prev - m_new) + sum_c e^(s_c - m_new) v_c, and divided by l once at
// the end. splitkv (seed 002, Flash-Decoding) runs the same recurrence over one chunk of keys per
// workgroup and stores each chunk's (o, m, l) for the log-sum-exp merge.
#include "common.glsl"
#include "tile.glsl"

const uint PASSES = 1u;
bool pass_needs_v(uint pass) { return true; }

float m_run = NEG_INF;  // running max of the scores seen so far
float l_run = 0.0;      // running denominator, relative to m_run
float l_tile;  // the current tile's part of l_run, for its share in traces

void state_init() {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void tile_begin(uint pass) { l_tile = 0.0; }

void chunk_update(uint pass, uint c0) {
  o_hold();
  float m_new = max(m_run, chunk_max());
  if (m_new == NEG_INF) return;  // nothing visible yet: the state stays empty
  // exp(-inf) is spelled out as 0: Vulkan does not promise IEEE infinities in exp().
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float p[CH];
  float l_chunk = 0.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    p[ci] = sc[ci] == NEG_INF ? 0.0 : exp(sc[ci] - m_new);
    l_chunk += p[ci];
  }
  l_run = l_run * alpha + l_chunk;
  l_tile = l_tile * alpha + l_chunk;
  o_keep = alpha;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[ci] = p[ci];
  m_run = m_new;
}

void tile_end(uint pass, Row r, uint j0) {
  if (!is_traced(r) || l_run == 0.0) return;
  uint t = j0 / BC;
  trace_put(t, 1u, m_run);
  trace_put(t, 2u, l_run);
  trace_put(t, 3u, l_tile / l_run);  // the tile's share of the denominator
  trace_put(t, 4u, m_run + log(l_run));
  [[unroll]] for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
  float inv = l_run > 0.0 ? 1.0 / l_run : 0.0;
#ifdef SPLIT_KV
  // Per seed 002 each chunk returns its normalised o', its max m and its denominator d'.
  uint part = row * pc.splits + gl_WorkGroupID.z;
  [[unroll]] for (uint k = 0; k < DV; ++k) scratch1[part * DV + k] = o_acc[k] * inv;
  scratch2[part * 2u] = m_run;
  scratch2[part * 2u + 1u] = l_run;
#else
  [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k] * inv;
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
#endif
}

#include "fused_main.glsl"
