#version 460
#extension GL_GOOGLE_include_directive : require
// Flash-Decoding partial pass for GPUs (TileLayout::lanes): FlashAttention-2 over one chunk of
// keys per workgroup (z), shaped for decoding, where a KV head has few query rows and the cost
// is reading K and V once, at the memory's speed.
//
// - Every query row of the workgroup's KV head (at most ROWS; the host gives them all to one
//   workgroup when they fit) is worked on by every invocation, so K and V are read once per
//   KV head, not once per query head (grouped-query attention).
// - A key's head dimension is spread over a cluster of LANES lanes, each loading 16 bytes a row
//   at a time (4 floats, 8 halves, or a block format's quants and their block's scale), so one
//   load instruction of the cluster reads a whole row and the memory sees wide, contiguous
//   requests. The score's partial sums meet by a butterfly of
//   subgroup shuffles within the cluster.
// - The workgroup's clusters walk the chunk KB keys at a time, interleaved, with every K and V
//   load of a step issued before its arithmetic; each cluster keeps its own (m, l, o) and the
//   clusters merge once at the end, through shared memory, as splitkv_merge.comp merges chunks.
// No shared memory in the loop and no barrier but the one before the merge.
// - A decode step is one dispatch: the workgroup that finishes a row block's chunks last (a
//   counter per row block in device memory, zeroed before each run) merges them
//   (chunk_merge.glsl), instead of splitkv_merge.comp after a barrier.
#extension GL_KHR_memory_scope_semantics : require
#define SPLIT_KV
#define LANE_TILE
#define CHUNK_MERGE
#include "common.glsl"
#include "flash2_step.glsl"  // the recurrence every FlashAttention-2 layout runs
#include "lse_merge.glsl"    // the clusters' merge

// Values in one 16-byte load of K (V) (formats.glsl), so that vector x / VEC holds value x.
const uint KVEC = FMT_LOAD_VALUES(K_FORMAT);
const uint VVEC = FMT_LOAD_VALUES(V_FORMAT);
const uint KE = D / LANES;    // elements of a key row per lane
const uint VE = DV / LANES;   // elements of a value row (and of the output) per lane
const uint KB = BC;           // keys a cluster takes per step, their loads all in flight
const uint CLUSTERS = gl_WorkGroupSize.x / LANES;

// The head of the block holding value x of K (V), for the block formats (formats.glsl); unused
// for the others. Values are decoded by kv_value, from their offset i in the 16-byte load (a whole
// number of loads from the row's start) and the load's word kv_word(fmt, i); quants by kv_quant,
// without the scale d and minimum m, which a load applies once to its sum of products (K: d times
// it, plus m times the sum of the queries) or to the weights (V: d w for each quant, plus m w).
uint kv_vec_word(bool is_k, uint i) { return is_k ? k_vec[i >> 2u][i & 3u] : v_vec[i >> 2u][i & 3u]; }
BlockHead kv_head(bool is_k, uint fmt, uint x) {
  if (!kv_scaled(fmt)) return no_head();
  uint w = kv_head_word(fmt, x, is_k ? k_count() : v_count());
  return fmt_head(fmt, x, kv_vec_word(is_k, w), FMT_HEAD_HALVES(fmt) > 2u ? kv_vec_word(is_k, w + 1u) : 0u);
}

float q_reg[ROWS][KE];
float o_acc[ROWS][VE];

// The subgroups of the workgroup (SUBGROUP: the device's size, at least a cluster), whose merged
// states meet in shared memory.
const uint SUBGROUPS = (gl_WorkGroupSize.x + SUBGROUP - 1u) / SUBGROUP;
shared float part_ml[SUBGROUPS][ROWS][2];
shared bool last_sh;  // this workgroup finished its row block's chunks last
shared float part_o[SUBGROUPS][ROWS][DV];
// The chunks' merge (chunk_merge.glsl's merge_rows, by the last workgroup of a row block) reuses
// them: a subgroup's maxima in part_ml, a batch of DV chunks' weights in part_o[0].
#define MERGE_M(g, rr) part_ml[g][rr][0]
#define MERGE_W(rr, c) part_o[0][rr][c]
const uint MERGE_BATCH = DV / 4u * 4u;
#define MERGE_LANES gl_WorkGroupSize.x
#include "chunk_merge.glsl"

void main() {
  uint lane = gl_LocalInvocationID.x;
  uint cluster = lane / LANES, sub = lane % LANES;
  uint group = pc.heads / pc.kv_heads;
  uint b = workgroup_kv_head() / pc.kv_heads, hkv = workgroup_kv_head() % pc.kv_heads;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    uint r = row_block() * ROWS + rr;
    bool valid = r < group * pc.nq;
    rows[rr] = make_row(b, hkv * group + (valid ? r / pc.nq : 0u), valid ? r % pc.nq : 0u, valid);
    uint base = q_at(rows[rr].bh, rows[rr].i) + sub * KE;
    [[unroll]] for (uint e = 0; e < KE; ++e)
      q_reg[rr][e] = valid ? float(q_buf[base + e]) * pc.scale : 0.0;
    [[unroll]] for (uint e = 0; e < VE; ++e) o_acc[rr][e] = 0.0;
    state_start(rr);  // empty: splitkv_merge.comp adds the sink
  }
  uint lo, hi, begin, end;
  rows_key_union(lo, hi);  // every invocation holds all the workgroup's rows
  walk_bounds(lo, hi, begin, end);
  uint kv_base = rows[0].kv_base;  // the rows share one K/V head

  for (uint j0 = begin + cluster * KB; j0 < end; j0 += CLUSTERS * KB) {
    if (!tile_seen(j0)) continue;  // hidden from every row by the additive mask: never read
    uvec4 kx[KB][KE / KVEC], vx[KB][VE / VVEC];
    BlockHead kh[KB][KE / KVEC], vh[KB][VE / VVEC];  // the loads' block heads (block formats)
    [[unroll]] for (uint c = 0; c < KB; ++c) {
      uint key = key_row(kv_base, min(j0 + c, end - 1u));  // past the end: the last key, weight 0
      [[unroll]] for (uint u = 0; u < KE / KVEC; ++u) {
        uint x = key * D + sub * KE + u * KVEC;
        kx[c][u] = k_vec[x / KVEC];
        kh[c][u] = kv_head(true, K_FORMAT, x);
      }
      [[unroll]] for (uint u = 0; u < VE / VVEC; ++u) {
        uint x = key * DV + sub * VE + u * VVEC;
        vx[c][u] = v_vec[x / VVEC];
        vh[c][u] = kv_head(false, V_FORMAT, x);
      }
    }
    float s[KB][ROWS];
    [[unroll]] for (uint c = 0; c < KB; ++c) {
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) s[c][rr] = 0.0;
      [[unroll]] for (uint u = 0; u < KE / KVEC; ++u) {
        // A quantised load's products are summed before its block's scale, applied once (and its
        // minimum, once to the sum of the queries).
        float part[ROWS], qsum[ROWS];
        [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) part[rr] = qsum[rr] = 0.0;
        [[unroll]] for (uint i = 0; i < KVEC; ++i) {
          uint word = kx[c][u][kv_word(K_FORMAT, i)];
          float k = kv_scaled(K_FORMAT) ? kv_quant(K_FORMAT, i, word, kh[c][u].qh)
                                        : kv_value(K_FORMAT, i, word, no_head());
          [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
            part[rr] = fma(q_reg[rr][u * KVEC + i], k, part[rr]);
            if (FMT_AFFINE(K_FORMAT)) qsum[rr] += q_reg[rr][u * KVEC + i];
          }
        }
        [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
          if (!kv_scaled(K_FORMAT)) s[c][rr] += part[rr];
          else s[c][rr] = fma(kh[c][u].d, part[rr], FMT_AFFINE(K_FORMAT) ? fma(kh[c][u].m, qsum[rr], s[c][rr]) : s[c][rr]);
        }
      }
    }
    [[unroll]] for (uint step = LANES / 2u; step > 0u; step /= 2u)
      [[unroll]] for (uint c = 0; c < KB; ++c)
        [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) s[c][rr] += subgroupShuffleXor(s[c][rr], step);
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      float m_step = NEG_INF;
      [[unroll]] for (uint c = 0; c < KB; ++c) {
        s[c][rr] = row_score(rr, j0 + c, j0 + c < end && key_visible(rr, j0 + c), s[c][rr]);
        m_step = max(m_step, s[c][rr]);
      }
      float ref = tile_ref(rr, m_step), l_step = 0.0;
      [[unroll]] for (uint c = 0; c < KB; ++c) {
        float p = s[c][rr] == NEG_INF ? 0.0 : exp(s[c][rr] - ref);  // exp(-inf) spelled out as 0
        l_step += p;
        s[c][rr] = p;
      }
      float keep, coef;  // coef = 1: FlashAttention-2 divides by l once, at the end
      tile_step(rr, ref, l_step, keep, coef);
      [[unroll]] for (uint e = 0; e < VE; ++e) o_acc[rr][e] *= keep;
      [[unroll]] for (uint c = 0; c < KB; ++c) s[c][rr] *= coef;
    }
    [[unroll]] for (uint c = 0; c < KB; ++c)
      [[unroll]] for (uint u = 0; u < VE / VVEC; ++u) {
        float w[ROWS], wm[ROWS];  // the weights, times the load's block scale (and minimum)
        [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
          w[rr] = kv_scaled(V_FORMAT) ? s[c][rr] * vh[c][u].d : s[c][rr];
          wm[rr] = s[c][rr] * vh[c][u].m;
        }
        [[unroll]] for (uint i = 0; i < VVEC; ++i) {
          uint word = vx[c][u][kv_word(V_FORMAT, i)];
          float v = kv_scaled(V_FORMAT) ? kv_quant(V_FORMAT, i, word, vh[c][u].qh)
                                        : kv_value(V_FORMAT, i, word, no_head());
          [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
            float o = fma(w[rr], v, o_acc[rr][u * VVEC + i]);
            o_acc[rr][u * VVEC + i] = FMT_AFFINE(V_FORMAT) ? o + wm[rr] : o;
          }
        }
      }
  }

  // The clusters' states merge with log-sum-exp (lse_merge.glsl), as chunks do in
  // splitkv_merge.comp: first the clusters of each subgroup, by a butterfly of shuffles (no shared
  // memory, which would bound how many workgroups a compute unit runs), then the subgroups'
  // through shared memory.
  [[unroll]] for (uint step = LANES; step < CLUSTERS * LANES && step < SUBGROUP; step *= 2u) {
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      float m_o = subgroupShuffleXor(m_run[rr], step), l_o = subgroupShuffleXor(l_run[rr], step);
      float m_all = max(m_run[rr], m_o);
      float w = merge_weight(m_run[rr], m_all), w_o = merge_weight(m_o, m_all);
      l_run[rr] = l_run[rr] * w + l_o * w_o;
      [[unroll]] for (uint e = 0; e < VE; ++e)
        o_acc[rr][e] = o_acc[rr][e] * w + subgroupShuffleXor(o_acc[rr][e], step) * w_o;
      m_run[rr] = m_all;
    }
  }
  // After the subgroups' merge, the first cluster holds the workgroup's state.
  bool holds = true;
  if (SUBGROUPS > 1u) {
    uint sg = lane / SUBGROUP;
    bool first = lane % SUBGROUP < LANES;  // the subgroup's first cluster
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      if (first) {
        if (sub == 0u) {
          part_ml[sg][rr][0] = m_run[rr];
          part_ml[sg][rr][1] = l_run[rr];
        }
        [[unroll]] for (uint e = 0; e < VE; ++e) part_o[sg][rr][sub * VE + e] = o_acc[rr][e];
      }
    }
    barrier();
    holds = cluster == 0u;
    if (holds) {
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
        float m_all = NEG_INF;
        for (uint g = 0u; g < SUBGROUPS; ++g) m_all = max(m_all, part_ml[g][rr][0]);
        l_run[rr] = 0.0;
        [[unroll]] for (uint e = 0; e < VE; ++e) o_acc[rr][e] = 0.0;
        for (uint g = 0u; g < SUBGROUPS; ++g) {
          float w = merge_weight(part_ml[g][rr][0], m_all);
          l_run[rr] += part_ml[g][rr][1] * w;
          [[unroll]] for (uint e = 0; e < VE; ++e) o_acc[rr][e] += part_o[g][rr][sub * VE + e] * w;
        }
        m_run[rr] = m_all;
      }
    }
  } else {
    holds = cluster == 0u;
  }
  // As Flash-Decoding has it, each chunk returns its normalised o', its max m and its denominator d'.
  if (holds)
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      if (!rows[rr].valid) continue;
      uint part = (rows[rr].bh * pc.nq + rows[rr].i) * pc.splits + gl_WorkGroupID.z;
      float inv = out_scale(rr);
      [[unroll]] for (uint e = 0; e < VE; ++e) scratch1[part * DV + sub * VE + e] = o_acc[rr][e] * inv;
      if (sub == 0u) {
        scratch2[part * 2u] = m_run[rr];
        scratch2[part * 2u + 1u] = l_run[rr];
      }
    }

  // The last workgroup of the row block to finish merges its rows' chunks, on the memory model's
  // terms (GL_KHR_memory_scope_semantics, at device scope): the workgroup's barrier orders every
  // invocation's chunk writes (scratch1, scratch2: coherent) before invocation 0's count, a
  // release at device scope; the merging workgroup's count is an acquire, and its barrier orders
  // the merge's reads after it. The counters start each run at zero: the dispatch list fills
  // them before this dispatch (Plan::add_fill), so a run that stopped part-way (a lost device)
  // leaves nothing wrong for the next.
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                 gl_SemanticsAcquireRelease);
  uint block = row_block() + workgroup_kv_head() * gl_NumWorkGroups.x;
  if (gl_LocalInvocationID.x == 0u)
    last_sh = atomicAdd(chunks_done[block], 1u, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                        gl_SemanticsAcquireRelease) == pc.splits - 1u;
  controlBarrier(gl_ScopeWorkgroup, gl_ScopeDevice,
                 gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
  if (!last_sh) return;
  merge_rows(gl_LocalInvocationID.x);
}
