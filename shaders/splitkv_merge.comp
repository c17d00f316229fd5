#version 460
#extension GL_GOOGLE_include_directive : require
// Flash-Decoding reduction (seed 002): merge the per-chunk (o'_c, m_c, d'_c) of one row with
// log-sum-exp, m_N = max_c m_c, d'_N = sum_c d'_c e^(m_c - m_N), o = sum_c o'_c d'_c e^(m_c - m_N) / d'_N.
// One invocation per output row; a chunk that saw no key has m = -inf and d' = 0 and adds nothing.
#include "common.glsl"

void main() {
  uint row = gl_GlobalInvocationID.x;
  if (row >= pc.batch * pc.heads * pc.nq) return;
  uint first = row * pc.splits;
  float m_all = NEG_INF;
  for (uint c = 0u; c < pc.splits; ++c) m_all = max(m_all, scratch2[(first + c) * 2u]);
  float l_all = 0.0;
  for (uint c = 0u; c < pc.splits; ++c) {
    float m = scratch2[(first + c) * 2u];
    l_all += m == NEG_INF ? 0.0 : scratch2[(first + c) * 2u + 1u] * exp(m - m_all);
  }
  // Chunks outside, head dim inside (unrolled): llvmpipe counts loop iterations per invocation.
  float acc[DV];
  [[unroll]] for (uint k = 0; k < DV; ++k) acc[k] = 0.0;
  for (uint c = 0u; c < pc.splits; ++c) {
    float m = scratch2[(first + c) * 2u];
    if (m == NEG_INF) continue;
    float weight = scratch2[(first + c) * 2u + 1u] * exp(m - m_all);
    [[unroll]] for (uint k = 0; k < DV; ++k) acc[k] += scratch1[(first + c) * DV + k] * weight;
  }
  float inv = l_all > 0.0 ? 1.0 / l_all : 0.0;
  [[unroll]] for (uint k = 0; k < DV; ++k) o_buf[row * DV + k] = acc[k] * inv;
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[row] = l_all > 0.0 ? m_all + log(l_all) : NEG_INF;
}
