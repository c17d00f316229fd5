// Flash-Decoding's reduction of one row (docs/algorithms.md, variants, splitkv): its chunks' (o'_c, m_c, d'_c) in scratch1 and
// scratch2 merged with log-sum-exp (lse_merge.glsl), m_N = max_c m_c, d'_N = sum_c d'_c e^(m_c -
// m_N), o = sum_c o'_c d'_c e^(m_c - m_N) / d'_N, into O and LSE. An attention sink is merged here
// (as a chunk of zero output), not in the chunks. MERGE_LANES invocations share the row, each
// merging the output elements e = lane, lane + MERGE_LANES, ...: splitkv_merge.comp's rows (one
// invocation a row on CPU drivers, a warp's worth on GPUs). merge_rows, below, is the same merge
// for the lanes kernel's workgroup that finishes a row block's chunks last (splitkv_lanes.comp,
// one dispatch a decode step).

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

#ifdef CHUNK_MERGE
// The merge of the workgroup's ROWS rows by the workgroup that finished their chunks last
// (splitkv_lanes.comp), all rows at once and the chunks in parallel: a serial walk of one row's
// chunks after another made a decode step's fixed cost grow by ~1.7 us a chunk on an H200.
// - Each row's max: its chunks' m strided over the invocations, a butterfly of shuffles within
//   each subgroup (the device's SUBGROUP, as the clusters' merge), MERGE_M(g, rr) a subgroup's.
// - The chunks' weights d'_c e^(m_c - m_N), MERGE_BATCH chunks at a time, a chunk an invocation,
//   into MERGE_W(rr, c); then every invocation sums its output elements e = t, t + W, ... over the
//   batch, STEP chunks a step with their loads independent of each other.
// The includer provides MERGE_M (SUBGROUPS x ROWS floats) and MERGE_W (ROWS x MERGE_BATCH) in
// shared memory it no longer needs, and MERGE_BATCH, a multiple of STEP.
void merge_rows(uint t) {
  const uint W = gl_WorkGroupSize.x;
  const uint STEP = 4u;
  const uint PER = (DV + W - 1u) / W;
  uint first[ROWS];
  float m_all[ROWS], l_all[ROWS];
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    first[rr] = (rows[rr].bh * pc.nq + rows[rr].i) * pc.splits;
    float m = NEG_INF;
    if (rows[rr].valid)
      for (uint c = t; c < pc.splits; c += W) m = max(m, scratch2[(first[rr] + c) * 2u]);
    [[unroll]] for (uint step = 1u; step < W && step < SUBGROUP; step *= 2u)
      m = max(m, subgroupShuffleXor(m, step));
    if (t % SUBGROUP == 0u) MERGE_M(t / SUBGROUP, rr) = m;
  }
  barrier();
  float acc[ROWS][PER];
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    // An attention sink joins as one more chunk with m = sink, d' = 1 and o' = 0.
    float sink = (MODS & MOD_SINKS) != 0u ? head_buf[rows[rr].bh].y : NEG_INF;
    m_all[rr] = sink;
    for (uint g = 0u; g < SUBGROUPS; ++g) m_all[rr] = max(m_all[rr], MERGE_M(g, rr));
    l_all[rr] = merge_weight(sink, m_all[rr]);
    [[unroll]] for (uint k = 0; k < PER; ++k) acc[rr][k] = 0.0;
  }
  for (uint c0 = 0u; c0 < pc.splits; c0 += MERGE_BATCH) {
    barrier();  // the batch before is summed
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
      for (uint c = t; c < MERGE_BATCH; c += W) {
        uint at = (first[rr] + min(c0 + c, pc.splits - 1u)) * 2u;
        float w = scratch2[at + 1u] * merge_weight(scratch2[at], m_all[rr]);
        MERGE_W(rr, c) = rows[rr].valid && c0 + c < pc.splits ? w : 0.0;
      }
    barrier();
    uint n = min(MERGE_BATCH, pc.splits - c0);
    for (uint c = 0u; c < n; c += STEP) {
      [[unroll]] for (uint u = 0; u < STEP; ++u) {
        uint chunk = min(c0 + c + u, pc.splits - 1u);  // past the end: weight 0
        [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
          float w = MERGE_W(rr, c + u);
          l_all[rr] += w;
          [[unroll]] for (uint k = 0; k < PER; ++k) {
            uint e = t + k * W;
            if (e < DV) acc[rr][k] += scratch1[(first[rr] + chunk) * DV + e] * w;
          }
        }
      }
    }
  }
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    if (!rows[rr].valid) continue;
    float inv = l_all[rr] > 0.0 ? 1.0 / l_all[rr] : 0.0;
    [[unroll]] for (uint k = 0; k < PER; ++k) {
      uint e = t + k * W;
      if (e < DV) o_buf[o_at(rows[rr].bh, rows[rr].i) + e] = acc[rr][k] * inv;
    }
    if ((pc.flags & FLAG_LSE) != 0u && t == 0u)
      lse_buf[rows[rr].bh * pc.nq + rows[rr].i] = l_all[rr] > 0.0 ? m_all[rr] + log(l_all[rr]) : NEG_INF;
  }
}
#endif
