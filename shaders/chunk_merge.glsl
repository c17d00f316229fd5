// Flash-Decoding's reduction of one row (seed 002): its chunks' (o'_c, m_c, d'_c) in scratch1 and
// scratch2 merged with log-sum-exp (lse_merge.glsl), m_N = max_c m_c, d'_N = sum_c d'_c e^(m_c -
// m_N), o = sum_c o'_c d'_c e^(m_c - m_N) / d'_N, into O and LSE. An attention sink is merged here
// (as a chunk of zero output), not in the chunks. MERGE_LANES invocations share the row, each
// merging the output elements e = lane, lane + MERGE_LANES, ...: splitkv_merge.comp's rows (one
// invocation a row on CPU drivers, a warp's worth on GPUs), or the whole workgroup of the lanes
// kernel that finishes a row's chunks last (splitkv_lanes.comp, one dispatch a decode step).

const uint MERGE_PER = (DV + MERGE_LANES - 1u) / MERGE_LANES;

void merge_chunks(uint row, uint lane) {
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
  float acc[MERGE_PER];
  [[unroll]] for (uint k = 0; k < MERGE_PER; ++k) acc[k] = 0.0;
  for (uint c0 = 0u; c0 < pc.splits; c0 += STEP) {
    [[unroll]] for (uint u = 0; u < STEP; ++u) {
      uint c = min(c0 + u, pc.splits - 1u);
      float m = scratch2[(first + c) * 2u];
      float weight = c0 + u < pc.splits ? scratch2[(first + c) * 2u + 1u] * merge_weight(m, m_all)
                                        : 0.0;
      l_all += weight;
      [[unroll]] for (uint k = 0; k < MERGE_PER; ++k) {
        uint e = lane + k * MERGE_LANES;
        if (e < DV) acc[k] += scratch1[(first + c) * DV + e] * weight;
      }
    }
  }
  float inv = l_all > 0.0 ? 1.0 / l_all : 0.0;
  [[unroll]] for (uint k = 0; k < MERGE_PER; ++k) {
    uint e = lane + k * MERGE_LANES;
    if (e < DV) o_buf[o_at(row / pc.nq, row % pc.nq) + e] = acc[k] * inv;
  }
  if ((pc.flags & FLAG_LSE) != 0u && lane == 0u)
    lse_buf[row] = l_all > 0.0 ? m_all + log(l_all) : NEG_INF;
}
