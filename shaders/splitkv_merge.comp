#version 460
#extension GL_GOOGLE_include_directive : require
// Flash-Decoding reduction (seed 002): merge the per-chunk (o'_c, m_c, d'_c) of one row with
// log-sum-exp (lse_merge.glsl), m_N = max_c m_c, d'_N = sum_c d'_c e^(m_c - m_N),
// o = sum_c o'_c d'_c e^(m_c - m_N) / d'_N. An attention sink is merged
// here (as a chunk of zero output), not in the chunks.
// BC invocations share a row, each merging the output elements e = lane, lane + BC, ...: one on
// CPU drivers (a row per invocation, its elements in unrolled loops), a warp's worth on GPUs, so
// that the merge reads the chunks' outputs in wide, contiguous requests.
#include "common.glsl"
#include "lse_merge.glsl"

const uint PER_LANE = (DV + BC - 1u) / BC;

void main() {
  uint per_group = gl_WorkGroupSize.x / BC;
  uint lane = gl_LocalInvocationID.x % BC;
  uint group_index = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint row = group_index * per_group + gl_LocalInvocationID.x / BC;
  if (row >= pc.batch * pc.heads * pc.nq) return;
  uint first = row * pc.splits;
  // STEP chunks at a time, with no branch on a loaded value, so that a step's loads are
  // independent of each other (on an H100, 16 a step timed the same as 4).
  const uint STEP = 4u;
  // An attention sink joins here, once, as one more chunk with m = sink, d' = 1 and o' = 0.
  float sink = NEG_INF;
  if ((MODS & MOD_SINKS) != 0u) sink = head_buf[row / pc.nq].y;
  float m_all = sink;
  for (uint c0 = 0u; c0 < pc.splits; c0 += STEP)
    [[unroll]] for (uint u = 0; u < STEP; ++u)
      if (c0 + u < pc.splits) m_all = max(m_all, scratch2[(first + c0 + u) * 2u]);
  float l_all = merge_weight(sink, m_all);
  // Chunks outside, head dim inside (unrolled): llvmpipe counts loop iterations per invocation.
  float acc[PER_LANE];
  [[unroll]] for (uint k = 0; k < PER_LANE; ++k) acc[k] = 0.0;
  for (uint c0 = 0u; c0 < pc.splits; c0 += STEP) {
    [[unroll]] for (uint u = 0; u < STEP; ++u) {
      uint c = min(c0 + u, pc.splits - 1u);
      float m = scratch2[(first + c) * 2u];
      float weight = c0 + u < pc.splits ? scratch2[(first + c) * 2u + 1u] * merge_weight(m, m_all)
                                        : 0.0;
      l_all += weight;
      [[unroll]] for (uint k = 0; k < PER_LANE; ++k) {
        uint e = lane + k * BC;
        if (e < DV) acc[k] += scratch1[(first + c) * DV + e] * weight;
      }
    }
  }
  float inv = l_all > 0.0 ? 1.0 / l_all : 0.0;
  [[unroll]] for (uint k = 0; k < PER_LANE; ++k) {
    uint e = lane + k * BC;
    if (e < DV) o_buf[o_at(row / pc.nq, row % pc.nq) + e] = acc[k] * inv;
  }
  if ((pc.flags & FLAG_LSE) != 0u && lane == 0u)
    lse_buf[row] = l_all > 0.0 ? m_all + log(l_all) : NEG_INF;
}
