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
float o_acc[DV];        // unnormalised output

void state_init() {
  for (uint k = 0; k < DV; ++k) o_acc[k] = 0.0;
}

void state_tile(uint pass, Row r, uint j0, uint n, inout float s[BC]) {
  float m_tile = NEG_INF;
  for (uint c = 0; c < BC; ++c) m_tile = max(m_tile, s[c]);
  float m_new = max(m_run, m_tile);
  if (m_new == NEG_INF) return;  // nothing visible yet: state stays empty
  // exp(-inf) is spelled out as 0: Vulkan does not promise IEEE infinities in exp().
  float alpha = m_run == NEG_INF ? 0.0 : exp(m_run - m_new);
  float l_tile = 0.0;
  for (uint c = 0; c < BC; ++c) {
    s[c] = s[c] == NEG_INF ? 0.0 : exp(s[c] - m_new);
    l_tile += s[c];
  }
  l_run = l_run * alpha + l_tile;
  for (uint k = 0; k < DV; ++k) {
    float acc = o_acc[k] * alpha;
    for (uint c = 0; c < BC; ++c) acc += s[c] * tile_v[c * DV + k];
    o_acc[k] = acc;
  }
  m_run = m_new;
  if (is_traced(r)) {
    uint t = j0 / BC;
    trace_put(t, 1u, m_run);
    trace_put(t, 2u, l_run);
    trace_put(t, 3u, l_tile / l_run);
    trace_put(t, 4u, m_run + log(l_run));
    for (uint k = 0; k < DV; ++k) trace_put(t, TRACE_FIELDS + k, o_acc[k]);
  }
}

void state_finish(Row r) {
  uint row = r.bh * pc.nq + r.i;
#ifdef SPLIT_KV
  // Per seed 002 each chunk returns its normalised o', its max m and its denominator d'.
  uint part = row * pc.splits + gl_WorkGroupID.z;
  float inv = l_run > 0.0 ? 1.0 / l_run : 0.0;
  for (uint k = 0; k < DV; ++k) scratch1[part * DV + k] = o_acc[k] * inv;
  scratch2[part * 2u] = m_run;
  scratch2[part * 2u + 1u] = l_run;
#else
  float inv = l_run > 0.0 ? 1.0 / l_run : 0.0;
  for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = o_acc[k] * inv;
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_run > 0.0 ? m_run + log(l_run) : NEG_INF;
#endif
}

#include "fused_main.glsl"
