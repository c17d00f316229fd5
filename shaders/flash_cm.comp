#version 460
#extension GL_GOOGLE_include_directive : require
// Cooperative-matrix kernel (TileLayout::cooperative_matrix, fp16 storage): the tile products
// S = Q K^T and O += P V run on the device's matrix units, fp16 in and fp32 accumulate, through
// VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix, or emulated (coopmat.glsl). Built once
// per recurrence: -DCM_FLASH1, -DCM_FLASH2, -DCM_FLASHD, and -DCM_FLASH2 -DSPLIT_KV for splitkv's
// partial pass, each for every matrix API.
//
// A workgroup is 4 groups of 32 lanes (subgroups on the matrix units); each group owns 16 packed
// query rows (64 per workgroup), keeps their queries as D/16 matrices and their output as DV/16
// accumulator matrices (16 x 16, fp32) from the first tile to the last. Per tile of BC keys,
// staged in shared memory as fp16 and read by all four groups:
//   1. S (16 x BC) = Q K^T as 16 x 16 products, stored to the group's scratch in shared memory
//      (a matrix's element layout is the driver's, so rows are read back through memory);
//   2. two lanes per row take the row's max and sum over the tile (one exchange each), run the
//      variant's recurrence, and write P (fp16, at most 1: relative to a max) and the rows'
//      factors back over S (keep and coef, each as a 16 x 16 matrix whose row r is row r's
//      factor);
//   3. O <- O * keep + coef * P V on the accumulators, element by element (the factor matrices
//      share the accumulators' element layout, whatever the driver's is). FlashAttention-2's
//      coef is 1: P V accumulates straight into O.
// The output leaves the accumulators once, at the end, through the scratch.
// Rounding P to fp16 moves each weight by at most 2^-11 of itself, so the output by at most
// 2^-11 of max |v|; the tests allow for it.
// Every array the matrices are loaded from or stored to is of 16-byte elements (uvec4: 8 fp16
// values or 4 fp32), so that each matrix starts 16-byte aligned: with fp16 arrays, the
// NVIDIA driver read the tiles 4 bytes off.
#define FP16
#include "common.glsl"

const uint SG_ROWS = 16u;            // query rows per group (the matrices' M)
const uint NSG = 4u;                 // groups per workgroup: local size 128
const uint WG_ROWS = SG_ROWS * NSG;  // query rows per workgroup
const uint HALF = BC / 2u;           // keys of a tile each of a row's two lanes takes
// Row strides in shared memory, each padded by 16 bytes so that the 16 rows a matrix load or
// store touches fall in different banks (unpadded, the 128- and 256-byte strides put them all
// in the same ones; padding made the kernel 2.5x faster on an H100).
const uint KS = D + 8u;                      // K tile (and the staged queries), fp16
const uint VS = DV + 8u;                     // V tile, fp16
// A group's scratch row: S (BC fp32), then P (BC fp16) in its first BC / 2 words and the
// factors keep and coef (16 fp32 each) after them.
const uint FC = BC / 2u;                          // where the factors start, in fp32
const uint SS = (BC > FC + 32u ? BC : FC + 32u) + 4u;
const uint OS = 20u;                         // a 16 x 16 piece of the output, fp32
const uint VB = BC * KS;                     // where the V tile starts, in fp16 values

// K tile, then V tile (the queries pass through the same space first); zeros past the keys.
shared uvec4 kv_sh[BC * (KS + VS) / 8u];
shared uvec4 s_sh[NSG * SG_ROWS * SS / 4u];  // per group: S, P and the factors, the output

// Q, K and V eight fp16 values at a time (d and dv are multiples of 16).
layout(std430, binding = B_Q) readonly buffer QBuf8 { uvec4 q8[]; };
layout(std430, binding = B_K) readonly buffer KBuf8 { uvec4 k8[]; };
layout(std430, binding = B_V) readonly buffer VBuf8 { uvec4 v8[]; };

#define CM_B_ARRAY kv_sh  // every right operand comes from the K/V tile
#include "coopmat.glsl"

CmA q_frag[D / 16u];
CmA p_frag[BC / 16u];   // the tile's P (step 2), as left operands of P V
CmAcc o_acc[DV / 16u];  // the group's 16 rows of output (unnormalised for FlashAttention-2)

uint lane() { return CM_LANE; }
uint sg() { return CM_GROUP; }

// The packed row (head in group, query) of local row r of this workgroup (see packed_row()).
Row local_row(uint r) {
  uint group = pc.heads / pc.kv_heads;
  uint b = gl_WorkGroupID.y / pc.kv_heads;
  uint hkv = gl_WorkGroupID.y % pc.kv_heads;
  uint packed = gl_WorkGroupID.x * WG_ROWS + r;
  bool valid = packed < group * pc.nq;
  uint hg = valid ? packed / pc.nq : 0u;
  uint i = valid ? packed % pc.nq : 0u;
  return make_row(b, hkv * group + hg, i, valid);
}

// Stages the workgroup's queries in kv_sh (the host checks WG_ROWS * KS fits) and loads each
// group's rows as matrices; rows past the problem are zeros.
void load_queries() {
  for (uint e = gl_LocalInvocationID.x; e < WG_ROWS * D / 8u; e += gl_WorkGroupSize.x) {
    uint r = e / (D / 8u), t = e % (D / 8u);
    Row row = local_row(r);
    uvec4 x = row.valid ? q8[q_at(row.bh, row.i) / 8u + t] : uvec4(0u);
    kv_sh[r * KS / 8u + t] = x;
  }
  barrier();
  [[unroll]] for (uint k = 0u; k < D / 16u; ++k)
    cm_load_a(q_frag[k], kv_sh, (sg() * SG_ROWS * KS + k * 16u) / 8u, KS / 8u);
}

// A tile's K and V as each invocation fetches them (8 fp16 values per element): the next tile
// is fetched into registers while the current one is worked on, so its loads are in flight
// during the products instead of before them.
const uint KF = (BC * D / 8u + NSG * 32u - 1u) / (NSG * 32u);
const uint VF = (BC * DV / 8u + NSG * 32u - 1u) / (NSG * 32u);
uvec4 k_next[KF], v_next[VF];

// Keys j0 .. j0 + n - 1 of this workgroup's K/V head into k_next and v_next, zeros after them.
void fetch_tile(uint kv_base, uint j0, uint n) {
  [[unroll]] for (uint i = 0u; i < KF; ++i) {
    uint e = gl_LocalInvocationID.x + i * NSG * 32u, c = e / (D / 8u);
    k_next[i] = e < BC * D / 8u && c < n ? k8[(key_row(kv_base, j0 + c) * D) / 8u + e % (D / 8u)]
                                         : uvec4(0u);
  }
  [[unroll]] for (uint i = 0u; i < VF; ++i) {
    uint e = gl_LocalInvocationID.x + i * NSG * 32u, c = e / (DV / 8u);
    v_next[i] = e < BC * DV / 8u && c < n ? v8[(key_row(kv_base, j0 + c) * DV) / 8u + e % (DV / 8u)]
                                          : uvec4(0u);
  }
}

void store_tile() {
  [[unroll]] for (uint i = 0u; i < KF; ++i) {
    uint e = gl_LocalInvocationID.x + i * NSG * 32u;
    if (e < BC * D / 8u) kv_sh[(e / (D / 8u)) * KS / 8u + e % (D / 8u)] = k_next[i];
  }
  [[unroll]] for (uint i = 0u; i < VF; ++i) {
    uint e = gl_LocalInvocationID.x + i * NSG * 32u;
    if (e < BC * DV / 8u) kv_sh[(VB + (e / (DV / 8u)) * VS) / 8u + e % (DV / 8u)] = v_next[i];
  }
}

// Step 1: this group's scores against the tile, unscaled, into its scratch.
void tile_scores() {
  [[unroll]] for (uint n = 0u; n < BC / 16u; ++n) {
    CmAcc acc;
    cm_zero(acc);
    [[unroll]] for (uint k = 0u; k < D / 16u; ++k) {
      CmBt kt;  // K^T: dims down, keys across
      cm_load_bt(kt, kv_sh, (n * 16u * KS + k * 16u) / 8u, KS / 8u);
      cm_mul_add(acc, q_frag[k], kt);
    }
    cm_store(acc, s_sh, (sg() * SG_ROWS * SS + n * 16u) / 4u, SS / 4u);
  }
  cm_sync();
}

// The variant's recurrence (the same hooks the fused kernels call), on this lane's row (both
// lanes of a row hold the same state).
#if defined(CM_FLASHD)
#include "flashd_step.glsl"
#elif defined(CM_FLASH1)
#include "flash1_step.glsl"
#else
#include "flash2_step.glsl"
#endif

// Step 2: the row's scores of keys j0.. (n in the tile), the recurrence, then over S in the
// scratch P and the factors of step 3 (o <- o * keep + coef * (P V)).
void tile_softmax(uint j0, uint n) {
  uint r = lane() / 2u, first = (lane() % 2u) * HALF;
  uint s_base = (sg() * SG_ROWS * SS + r * SS + first) / 4u;
  float s[HALF];
  float m_loc = NEG_INF;
  [[unroll]] for (uint c = 0u; c < HALF; ++c) {
    uint j = j0 + first + c;
    bool seen = first + c < n && key_visible(0u, j);
    s[c] = row_score(0u, j, seen, uintBitsToFloat(s_sh[s_base + c / 4u][c % 4u]) * pc.scale);
    m_loc = max(m_loc, s[c]);
  }
  cm_sync();  // every row's scores are read before P and the factors overwrite them
  float m_tile = max(m_loc, cm_xor1(m_loc));
  float ref = tile_ref(0u, m_tile);  // FLASH-D: the tile's own max; else the running one
  uint row_base = (sg() * SG_ROWS * SS + r * SS) / 4u;  // in uvec4: 8 fp16 or 4 fp32
  uint p_base = row_base + first / 8u;
  float l_loc = 0.0;
  float p[HALF];
  [[unroll]] for (uint c = 0u; c < HALF; ++c) {
    p[c] = s[c] == NEG_INF ? 0.0 : exp(s[c] - ref);  // exp(-inf) spelled out as 0
    l_loc += p[c];
  }
  [[unroll]] for (uint c = 0u; c < HALF; c += 8u)
    s_sh[p_base + c / 8u] =
        uvec4(packHalf2x16(vec2(p[c], p[c + 1u])), packHalf2x16(vec2(p[c + 2u], p[c + 3u])),
              packHalf2x16(vec2(p[c + 4u], p[c + 5u])), packHalf2x16(vec2(p[c + 6u], p[c + 7u])));
  float l_tile = l_loc + cm_xor1(l_loc);
  float keep, coef;
  tile_step(0u, ref, l_tile, keep, coef);
  uint f_base = row_base + FC / 4u + (lane() % 2u) * 2u;
  s_sh[f_base] = s_sh[f_base + 1u] = floatBitsToUint(vec4(keep));
#ifndef CM_FLASH2
  s_sh[f_base + 4u] = s_sh[f_base + 5u] = floatBitsToUint(vec4(coef));
#endif
  cm_sync();
}

// acc += the 16 columns of P V from column 16 nv.
void add_pv(inout CmAcc acc, uint nv) {
  [[unroll]] for (uint kc = 0u; kc < BC / 16u; ++kc) {
    CmB vb;
    cm_load_b(vb, kv_sh, (VB + kc * 16u * VS + nv * 16u) / 8u, VS / 8u);
    cm_mul_add(acc, p_frag[kc], vb);
  }
}

// Step 3: O <- O * keep + coef * P V on the accumulators, one 16-column piece at a time.
void tile_accumulate() {
  uint f = sg() * SG_ROWS * SS;
  CmAcc keep;
  cm_load_acc(keep, s_sh, (f + FC) / 4u, SS / 4u);
#ifndef CM_FLASH2
  CmAcc coef;
  cm_load_acc(coef, s_sh, (f + FC + 16u) / 4u, SS / 4u);
#endif
  [[unroll]] for (uint kc = 0u; kc < BC / 16u; ++kc)  // P's rows are SS fp32 apart, 2 SS fp16
    cm_load_a(p_frag[kc], s_sh, f / 4u + kc * 2u, SS / 4u);
  [[unroll]] for (uint nv = 0u; nv < DV / 16u; ++nv) {
#ifdef CM_FLASH2
    cm_scale(o_acc[nv], keep);  // coef is 1: P V accumulates into O
    add_pv(o_acc[nv], nv);
#else
    CmAcc pv;
    cm_zero(pv);
    add_pv(pv, nv);
    cm_blend(o_acc[nv], keep, pv, coef);
#endif
  }
}

// The keys this workgroup walks (its chunk for splitkv), from the union of those its rows see.
void key_range(out uint begin, out uint end) {
  uint lo, hi;
  rows_key_union(lo, hi);
  workgroup_keys(lo, hi);
  walk_bounds(lo, hi, begin, end);
}

// The output, times out_scale, from the accumulators through the group's scratch: each lane
// writes 8 values of its row a piece. Called by every lane (the scratch is shared by the group).
void finish(Row row) {
  uint index = row.bh * pc.nq + row.i;
#ifdef SPLIT_KV
  uint part = index * pc.splits + gl_WorkGroupID.z;  // as splitkv's chunks: normalised o', m and d'
  uint base = part * DV;
#else
  uint base = o_at(row.bh, row.i);
#endif
  float mul = out_scale(0u);
  cm_sync();  // the last tile's P and factors are read before the pieces overwrite them
  uint piece = sg() * SG_ROWS * SS, half_col = (lane() % 2u) * 8u;
  uint at = (piece + (lane() / 2u) * OS + half_col) / 4u;
  [[unroll]] for (uint nv = 0u; nv < DV / 16u; ++nv) {
    cm_store(o_acc[nv], s_sh, piece / 4u, OS / 4u);
    cm_sync();
    [[unroll]] for (uint e = 0u; e < 8u; ++e) {
      float x = uintBitsToFloat(s_sh[at + e / 4u][e % 4u]) * mul;
#ifdef SPLIT_KV
      if (row.valid) scratch1[base + nv * 16u + half_col + e] = x;
#else
      if (row.valid) o_buf[base + nv * 16u + half_col + e] = x;
#endif
    }
    cm_sync();  // read before the next piece overwrites it
  }
  if (!row.valid || lane() % 2u != 0u) return;
#ifdef SPLIT_KV
  scratch2[part * 2u] = m_run[0];
  scratch2[part * 2u + 1u] = l_run[0];
#else
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[index] = row_lse(0u);
#endif
}

void main() {
  Row row = local_row(sg() * SG_ROWS + lane() / 2u);
  rows[0] = row;
  state_start(0u);
  [[unroll]] for (uint nv = 0u; nv < DV / 16u; ++nv) cm_zero(o_acc[nv]);
  load_queries();
  uint begin, end;
  key_range(begin, end);  // its barriers also keep kv_sh's queries until all are loaded
  uint kv_base = row.kv_base;  // the same for every row of the workgroup
  // Tiles the additive mask hides from every row of the workgroup are skipped (next_seen_tile).
  uint j0 = next_seen_tile(begin, end);
  if (j0 < end) fetch_tile(kv_base, j0, min(BC, end - j0));
  while (j0 < end) {
    uint n = min(BC, end - j0);
    barrier();  // every group is done with the previous tile
    store_tile();
    barrier();
    uint next = next_seen_tile(j0 + BC, end);
    if (next < end) fetch_tile(kv_base, next, min(BC, end - next));
    tile_scores();
    tile_softmax(j0, n);
    tile_accumulate();
    j0 = next;
  }
  finish(row);
}
