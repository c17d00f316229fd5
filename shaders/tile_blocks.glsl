// Register blocks (TileLayout::blocks, -DBLOCK_TILE; the default on GPUs without cooperative
// matrices): the workgroup's BR query rows and a tile's BC keys in shared memory, the queries and
// keys transposed. A row group of LANES neighbouring invocations shares ROWS = 4 rows; each of
// them scores its CH = BC / LANES keys of the tile against them (a 4 x CH block of S), and then
// updates its OW = DV / LANES columns of their outputs (a 4 x OW block of O) from the tile's P
// and V. Every shared-memory read is a 16-byte vector serving 4 rows (queries, P) or 4 keys or
// columns (K, V): per multiply-add about 0.1-0.25 reads, where the shared layout makes one. A
// row's max and sum over the tile are reduced over its row group with subgroup shuffles
// (BLOCK_SHUFFLE), or through shared memory where a device has no subgroup operations.
// tile.glsl includes the tiles (tile_layout.glsl), fused_main.glsl the key loop (LAYOUT_MAIN).
#ifndef LAYOUT_MAIN
const uint CH = BC / LANES;  // the keys of a tile each invocation of a row group scores
const uint WG = gl_WorkGroupSize.x;
const uint BR = WG / LANES * ROWS;  // query rows of the workgroup
const uint OW = DV / LANES;         // output columns of each invocation (a multiple of 4)
#include "tile_state.glsl"
// Queries [D][BR], then per tile K [D][BC] and V [BC][DV] (from V_AT: after K, or in its place
// once the scores are done) and the coefficients of P [BC][BR], all as vectors of 4 (16 bytes, 8
// in fp16).
// BLOCK_F16 (ExecutionHints::fp16_arithmetic): the three in fp16, multiplied as f16vec2 (two
// rows a product), summed in fp16 over RUN head-dim elements or keys and then into the fp32
// scores and outputs, so that no fp16 sum runs longer than RUN terms.
#ifdef BLOCK_F16
#define BVEC f16vec4
#define BSCALAR float16_t
const uint RUN = 8u;
#else
#define BVEC vec4
#define BSCALAR float
#endif
shared BVEC q_sh[D * BR / 4u];
shared BVEC kv_sh[KV_VEC4];
shared BVEC p_sh[BC * BR / 4u];
const bool SHARE_KV = V_AT == 0u;

uint group_lane() { return gl_LocalInvocationID.x % LANES; }  // which keys and columns
uint row_group() { return gl_LocalInvocationID.x / LANES; }   // which 4 rows

// The workgroup's queries, transposed (rows past the problem are zeros). Neighbouring
// invocations take neighbouring rows, so that the shared-memory writes do not collide.
void load_q_tile() {
  uint group = pc.heads / pc.kv_heads, rows = group * pc.nq;
  uint b = workgroup_kv_head() / pc.kv_heads, hkv = workgroup_kv_head() % pc.kv_heads;
  const uint steps = (BR * D + WG - 1u) / WG;
  [[unroll]] for (uint s = 0; s < steps; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    uint lr = e % BR, k = e / BR, r = row_block() * BR + lr;
    float x = 0.0;
    if (e < BR * D && r < rows) {
      uint bh = b * pc.heads + hkv * group + r / pc.nq;
      x = float(q_buf[q_at(bh, r % pc.nq) + k]);
    }
    if (e < BR * D) q_sh[k * (BR / 4u) + lr / 4u][lr % 4u] = BSCALAR(x);
  }
}

// A tile's K and V as each invocation fetches them, 16-byte vectors: the next tile is fetched
// into registers while the current one is worked on, so that its loads are in flight during the
// products instead of before them.
const uint KF = (BC * D / 4u + WG - 1u) / WG;
const uint VF = (BC * DV / 4u + WG - 1u) / WG;
BVEC k_next[KF], v_next[VF];  // in the tile's precision: fp16 halves their registers

// Keys j0 .. j0 + n - 1 for K^T: an invocation reads four elements of a key row, which
// store_k_tile() writes down a column, neighbouring invocations neighbouring keys. Zeros past
// the keys.
void fetch_k_tile(uint kv_base, uint j0, uint n) {
  [[unroll]] for (uint s = 0; s < KF; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    uint c = e % BC, k = 4u * (e / BC);
    vec4 x = vec4(0.0);
    if (e < BC * D / 4u && c < n) {
      uint at = key_row(kv_base, j0 + c) * D + k;
      x = vec4(k_value(at), k_value(at + 1u), k_value(at + 2u), k_value(at + 3u));
    }
    k_next[s] = BVEC(x);
  }
}

void store_k_tile() {
  [[unroll]] for (uint s = 0; s < KF; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    uint c = e % BC, k = 4u * (e / BC);
    if (e < BC * D / 4u)
      [[unroll]] for (uint i = 0; i < 4u; ++i) kv_sh[(k + i) * (BC / 4u) + c / 4u][c % 4u] = k_next[s][i];
  }
}

void fetch_v_tile(uint kv_base, uint j0, uint n) {
  [[unroll]] for (uint s = 0; s < VF; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    uint c = e / (DV / 4u), k = 4u * (e % (DV / 4u));
    vec4 x = vec4(0.0);
    if (e < BC * DV / 4u && c < n) {
      uint at = key_row(kv_base, j0 + c) * DV + k;
      x = vec4(v_value(at), v_value(at + 1u), v_value(at + 2u), v_value(at + 3u));
    }
    v_next[s] = BVEC(x);
  }
}

void store_v_tile() {
  [[unroll]] for (uint s = 0; s < VF; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    if (e < BC * DV / 4u) kv_sh[V_AT + e] = v_next[s];
  }
}

// A row's max and sum over the tile: over the LANES invocations of its row group.
#ifdef BLOCK_SHUFFLE
float row_max(float x) {
  [[unroll]] for (uint s = 1u; s < LANES; s *= 2u) x = max(x, subgroupShuffleXor(x, s));
  return x;
}
float row_sum(float x) {
  [[unroll]] for (uint s = 1u; s < LANES; s *= 2u) x += subgroupShuffleXor(x, s);
  return x;
}
#else
// Without subgroup operations (Vulkan's minimum): through shared memory, every invocation of the
// workgroup at every call (the recurrences call these outside any branch).
shared float reduce_sh[WG];
float row_reduce(float x, bool take_max) {
  reduce_sh[gl_LocalInvocationID.x] = x;
  barrier();
  uint first = row_group() * LANES;
  float r = reduce_sh[first];
  [[unroll]] for (uint t = 1u; t < LANES; ++t) {
    float y = reduce_sh[first + t];
    r = take_max ? max(r, y) : r + y;
  }
  barrier();  // read before the next call writes
  return r;
}
float row_max(float x) { return row_reduce(x, true); }
float row_sum(float x) { return row_reduce(x, false); }
#endif

void load_q(uint rr) {}  // the workgroup's queries are in q_sh (load_q_tile)

// Element k of this invocation's CH keys.
void block_keys(uint k, uint c0, out BSCALAR kk[CH]) {
  if (CH % 4u == 0u) {
    [[unroll]] for (uint v = 0; v < CH / 4u; ++v) {
      BVEC x = kv_sh[k * (BC / 4u) + c0 / 4u + v];
      [[unroll]] for (uint i = 0; i < 4u; ++i) kk[4u * v + i] = x[i];
    }
  } else {
    // The key's vector and lane within it do not depend on k: written so, the compiler computes
    // them once and each read's address is a constant offset from them (an expression of k * BC +
    // c0 cost a shift and an add a read, a third of the key loop's instructions at d = 128).
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
      uint c = c0 + ci;
      kk[ci] = kv_sh[k * (BC / 4u) + c / 4u][c % 4u];
    }
  }
}

// The row group's 4 rows against this invocation's CH keys of the tile (of n keys from j0): per
// head-dim element, one vector of 4 queries and CH / 4 vectors of keys for 4 x CH multiply-adds.
void block_scores(uint j0, uint n) {
  uint tr = row_group(), c0 = group_lane() * CH;
  float acc[ROWS][CH];
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[rr][ci] = 0.0;
#ifdef BLOCK_F16
  [[unroll]] for (uint k0 = 0; k0 < D; k0 += RUN) {
    f16vec2 h[2][CH];  // rows 0-1 and 2-3
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) h[0][ci] = h[1][ci] = f16vec2(0.0);
    [[unroll]] for (uint k = k0; k < k0 + RUN; ++k) {
      if (k >= D) continue;  // a constant
      f16vec4 q = q_sh[k * (BR / 4u) + tr];
      float16_t kk[CH];
      block_keys(k, c0, kk);
      [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
        h[0][ci] = fma(q.xy, f16vec2(kk[ci]), h[0][ci]);
        h[1][ci] = fma(q.zw, f16vec2(kk[ci]), h[1][ci]);
      }
    }
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)  // ROWS = 4
      [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[rr][ci] += float(h[rr / 2u][ci][rr % 2u]);
  }
#else
  [[unroll]] for (uint k = 0; k < D; ++k) {
    vec4 q = q_sh[k * (BR / 4u) + tr];
    float kk[CH];
    block_keys(k, c0, kk);
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
      [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[rr][ci] = fma(q[rr], kk[ci], acc[rr][ci]);
  }
#endif
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
      uint c = c0 + ci, j = j0 + c;
      sc[rr][ci] = row_score(rr, j, c < n && key_visible(rr, j), acc[rr][ci] * pc.scale);
    }
}

#ifdef BLOCK_F16
// Each row's coefficients of the tile go into P times a power of two that puts the largest in
// [1, 2), and the runs of P V are multiplied back in fp32 (p_unscale): coefficients that carry the
// normalisation (flash1, online's second pass, flashd: about 1/j) would otherwise fall below
// fp16's normal range (2^-14) past 16384 keys. The scaling is exact, so P's rounding stays u
// relative to each coefficient.
float p_unscale[ROWS];
#endif

// This invocation's coefficients of the tile's keys into P, a vector of 4 rows a key.
void store_p() {
  uint tr = row_group(), c0 = group_lane() * CH;
  vec4 scale = vec4(1.0);
#ifdef BLOCK_F16
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {  // ROWS = 4
    float most = 0.0;
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) most = max(most, abs(o_coef[rr][ci]));
    int e;
    frexp(row_max(most), e);  // the row's largest coefficient of the tile, in [2^(e-1), 2^e)
    scale[rr] = ldexp(1.0, 1 - e);
    p_unscale[rr] = ldexp(1.0, e - 1);
  }
#endif
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    vec4 p = vec4(0.0);
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) p[rr] = o_coef[rr][ci] * scale[rr];  // ROWS = 4
    p_sh[(c0 + ci) * (BR / 4u) + tr] = BVEC(p);
  }
}

// The row group's 4 rows, this invocation's OW columns: per key one vector of P and OW / 4 of V
// for 4 x OW multiply-adds.
void accumulate_o(uint c0) {
  uint tr = row_group(), col = group_lane() * (OW / 4u);
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    [[unroll]] for (uint e = 0; e < OW; ++e) o_acc[rr][e] *= o_keep[rr];
#ifdef BLOCK_F16
  [[unroll]] for (uint run = 0; run < BC; run += RUN) {
    f16vec2 h[2][OW];  // rows 0-1 and 2-3
    [[unroll]] for (uint e = 0; e < OW; ++e) h[0][e] = h[1][e] = f16vec2(0.0);
    [[unroll]] for (uint c = run; c < run + RUN; ++c) {
      if (c >= BC) continue;  // a constant
      f16vec4 p = p_sh[c * (BR / 4u) + tr];
      [[unroll]] for (uint v = 0; v < OW / 4u; ++v) {
        f16vec4 x = kv_sh[V_AT + c * (DV / 4u) + col + v];
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
          h[0][4u * v + i] = fma(p.xy, f16vec2(x[i]), h[0][4u * v + i]);
          h[1][4u * v + i] = fma(p.zw, f16vec2(x[i]), h[1][4u * v + i]);
        }
      }
    }
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)  // ROWS = 4
      [[unroll]] for (uint e = 0; e < OW; ++e)
        o_acc[rr][e] = fma(float(h[rr / 2u][e][rr % 2u]), p_unscale[rr], o_acc[rr][e]);
  }
#else
  [[unroll]] for (uint c = 0; c < BC; ++c) {
    vec4 p = p_sh[c * (BR / 4u) + tr];
    [[unroll]] for (uint v = 0; v < OW / 4u; ++v) {
      vec4 x = kv_sh[V_AT + c * (DV / 4u) + col + v];
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
          o_acc[rr][4u * v + i] = fma(p[rr], x[i], o_acc[rr][4u * v + i]);
    }
  }
#endif
}

uint first_column() { return group_lane() * OW; }

// The union [lo, hi) of the keys the workgroup's rows see.
void layout_keys(inout uint lo, inout uint hi) { workgroup_keys(lo, hi); }
#else
// Register blocks: the workgroup's queries once, then per tile K (and V) into shared memory, each
// invocation's block of scores, every row's recurrence (its max and sums reduced over the row
// group), the coefficients into P, and each invocation's block of the outputs. Every invocation
// runs every step, rows outside the problem on zeros: the barriers and reductions need them all.
void main() {
  load_q_tile();
  start_rows();
  uint begin, end;
  key_range(begin, end);  // its barriers also complete the queries in shared memory
  uint kv_base = rows[0].kv_base;  // the same for every row of the workgroup
  for (uint pass = 0u; pass < PASSES; ++pass) {
    bool with_v = pass_needs_v(pass);
    uint j0 = next_seen_tile(begin, end);
    if (j0 < end) {
      fetch_k_tile(kv_base, j0, min(BC, end - j0));
      if (with_v) fetch_v_tile(kv_base, j0, min(BC, end - j0));
    }
    while (j0 < end) {
      uint n = min(BC, end - j0);
      uint next = next_seen_tile(j0 + BC, end);
      uint next_n = next < end ? min(BC, end - next) : 0u;
      barrier();  // every invocation is done with the previous tile
      store_k_tile();
      if (with_v && !SHARE_KV) store_v_tile();
      barrier();  // the tile is complete in shared memory
      if (next_n > 0u) {  // the next tile's loads, in flight during this one's products
        fetch_k_tile(kv_base, next, next_n);
        if (with_v && !SHARE_KV) fetch_v_tile(kv_base, next, next_n);
      }
      block_scores(j0, n);
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
        tile_begin(pass, rr);
        chunk_update(pass, 0u, rr);
      }
      if (with_v) {
        if (SHARE_KV) barrier();  // every invocation is done with K: V takes its place
        store_p();
        if (SHARE_KV) {
          store_v_tile();
          if (next_n > 0u) fetch_v_tile(kv_base, next, next_n);
        }
        barrier();  // P and V are complete
        accumulate_o(0u);
      }
      j0 = next;
    }
  }
  finish_rows();
}
#endif
