// K/V tiles, the scores of the query rows against them, and the output accumulators. Arrays
// are indexed only by unrolled (constant) indices: llvmpipe keeps a private array indexed at run
// time in memory and gathers from it.
//
// Three layouts, chosen by the host (Spec::registers, Spec::blocks). In the first two, an
// invocation owns ROWS query rows (their queries, scores, state and whole output rows) and a
// tile's keys are a chunk: CH keys whose scores it holds at once; in the third, LANES invocations
// share ROWS rows.
// - shared memory (default on GPUs): ROWS = 1; every invocation of the workgroup helps load BC
//   keys into shared memory, then each reads all of them, CH keys at a time.
// - registers (REG_TILE, default on CPU drivers): a tile is one key per subgroup lane, and every
//   lane fetches its share of each key's K and V rows as RGBA texels (the keys' rows spread over
//   the lanes: texel t of a row in lane t % BC). Each product reads the element it needs from
//   the lane that holds it with a constant-index subgroupShuffle, so one fetched texel serves
//   BC lanes x ROWS rows. No barriers and no shared memory, which on llvmpipe is a per-lane
//   gather.
// - register blocks (BLOCK_TILE, default on GPUs without cooperative matrices): the workgroup's
//   BR query rows and a tile's BC keys in shared memory, the queries and keys transposed. A row
//   group of LANES neighbouring invocations shares ROWS = 4 rows; each of them scores its
//   CH = BC / LANES keys of the tile against them (a 4 x CH block of S), and then updates its
//   OW = DV / LANES columns of their outputs (a 4 x OW block of O) from the tile's P and V. Every
//   shared-memory read is a 16-byte vector serving 4 rows (queries, P) or 4 keys or columns (K,
//   V): per multiply-add about 0.1-0.25 reads, where the shared layout makes one. A row's max and
//   sum over the tile are reduced over its row group with subgroup shuffles (BLOCK_SHUFFLE), or
//   through shared memory where a device has no subgroup operations.

#ifdef REG_TILE
const uint CH = BC;  // the whole tile: one key per lane

// The tile being worked on (its first key and key count), and for lane c whether key j0 + c is
// in it and not masked out by key_mask (1) or not (0).
uint tile_j0, tile_n, lane_key_ok;

// MOD_MASK: each row's additive mask against the tile's keys, fetched four keys a texel (j0 is a
// multiple of BC, and BC of 4); past the last texel, the last one (those keys are not seen).
float tile_mask[ROWS][BC];

void mark_tile_keys(Row r, uint j0, uint n) {
  tile_j0 = j0, tile_n = n;
  uint lane = gl_SubgroupInvocationID;
  bool keep = lane < n;
  lane_key_ok = keep ? 1u : 0u;
  if (KEY_MASK) {
    if (keep) lane_key_ok = mask_buf[r.b * pc.nk + j0 + lane] != 0u ? 1u : 0u;
  }
  if ((MODS & MOD_MASK) != 0u) {
    int last = textureSize(mask_tex) - 1;
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
      [[unroll]] for (uint t = 0; t < BC / 4u; ++t) {
        int at = int((rows[rr].mask_row * mask_stride() + j0) / 4u + t);
        vec4 x = texelFetch(mask_tex, min(at, last));
        [[unroll]] for (uint e = 0; e < 4u; ++e) tile_mask[rr][4u * t + e] = x[e];
      }
  }
}

float mask_value(uint rr, uint j) { return tile_mask[rr][j - tile_j0]; }

// A lane fetches G texels (4 values each) of a row at once, as one 16-byte texel where the
// format asks (FMT_TEXEL_GROUP: the block formats' sixteen values of a block, fetched with their
// block's scale), else G = 1. Lane l holds the row's texels (l + BC * g) * G .. + G - 1 for g = 0,
// 1, ..: KT (VT) texels of a key (value) row a lane, of which texel_slot() says where texel t of
// the row is.
const uint KG = FMT_TEXEL_GROUP(K_FORMAT);
const uint VG = FMT_TEXEL_GROUP(V_FORMAT);
const uint KT = (D / 4u + KG * BC - 1u) / (KG * BC) * KG;
const uint VT = (DV / 4u + VG * BC - 1u) / (VG * BC) * VG;
uint texel_lane(uint t, uint g) { return (t / g) % BC; }
uint texel_slot(uint t, uint g) { return t / (g * BC) * g + t % g; }
uint slot_texel(uint lane, uint u, uint g) { return (lane + BC * (u / g)) * g + u % g; }
// Scores are computed for KB keys at a time, so that each query element loaded serves KB
// products, into ACC partial sums per score, so that the additions form ACC independent chains
// (one chain per score was bound by the latency of the add; measured at N = 2048: 10-17% faster
// than one key and one sum; 4 keys or 4 sums were no better).
const uint KB = 2u, ACC = 2u;

// G texels fetched at once, decoded by texel(): a block format's words w with its scale d, their
// first value x0, or one texel x of another format.
struct Fetch {
  uvec4 w;
  float d;
  uint x0;
  vec4 x;
};

// Texel g of a fetch.
vec4 texel(Fetch f, uint fmt, uint g) {
  if (kv_scaled(fmt)) return fmt_vec4(fmt, f.w[g], f.d, f.x0 + 4u * g);
  return f.x;
}

// The G texels from texel t (a multiple of G) of a tensor of `count` values in format fmt: its
// values 4t .. 4t + 4G - 1.
Fetch kv_fetch(KV_TEX tex, uint fmt, uint count, uint t) {
  Fetch f;
  f.w = uvec4(0u), f.d = 0.0, f.x0 = 4u * t, f.x = vec4(0.0);
#ifdef KV_QUANT
  uint x0 = 4u * t;
  if (kv_scaled(fmt)) {  // sixteen values of a block, in one texel, and its scale
    uint s = kv_scale_word(fmt, x0, count);
    f.d = kv_scale(texelFetch(tex, int(s >> 2u))[s & 3u], x0);
    f.w = texelFetch(tex, int(kv_word(fmt, x0) >> 2u));
    return f;
  }
  // The words that hold the four values, each fetched once: 4 x fmt_bits / 32 of them.
  uint w[4];
  uint words = fmt_bits(fmt) / 8u;
  [[unroll]] for (uint i = 0; i < 4u; ++i)
    if (i < words) w[i] = texelFetch(tex, int(kv_word(fmt, x0) + i)).x;
  [[unroll]] for (uint e = 0; e < 4u; ++e) f.x[e] = kv_value(fmt, x0 + e, w[e * words / 4u], 0.0);
#else
  f.x = texelFetch(tex, int(t));
#endif
  return f;
}

// This lane's texels u .. u + G - 1 (u a multiple of G) of row `key` of a tensor with `width`
// elements a row (D or DV), or zeros past the row's end (a constant test when the lanes cover the
// row exactly). Keys past the tile read the last key's row (their weight is 0).
Fetch lane_fetch(KV_TEX tex, uint fmt, uint g, uint count, uint width, uint key, uint u) {
  uint t = slot_texel(gl_SubgroupInvocationID, u, g), texels = width / 4u;
  if ((texels + g * BC - 1u) / (g * BC) * (g * BC) == texels)
    return kv_fetch(tex, fmt, count, key * texels + t);
  Fetch f = kv_fetch(tex, fmt, count, key * texels + min(t, texels - g));
  if (t >= texels) f.d = 0.0, f.x = vec4(0.0);
  return f;
}
#elif defined(BLOCK_TILE)
const uint WG = gl_WorkGroupSize.x;
const uint BR = WG / LANES * ROWS;  // query rows of the workgroup
const uint OW = DV / LANES;         // output columns of each invocation (a multiple of 4)
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
  uint b = gl_WorkGroupID.y / pc.kv_heads, hkv = gl_WorkGroupID.y % pc.kv_heads;
  const uint steps = (BR * D + WG - 1u) / WG;
  [[unroll]] for (uint s = 0; s < steps; ++s) {
    uint e = gl_LocalInvocationID.x + s * WG;
    uint lr = e % BR, k = e / BR, r = gl_WorkGroupID.x * BR + lr;
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
#else

shared float tile_k[BC * D];
shared float tile_v[BC * DV];

void load_k_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * D + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / D;
    float x = 0.0;
    if (e < BC * D && c < n) x = k_value(key_row(kv_base, j0 + c) * D + e % D);
    if (e < BC * D) tile_k[e] = x;  // keys past the end are zeros
  }
}

void load_v_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * DV + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / DV;
    float x = 0.0;
    if (e < BC * DV && c < n) x = v_value(key_row(kv_base, j0 + c) * DV + e % DV);
    if (e < BC * DV) tile_v[e] = x;
  }
}
#endif

// The queries and scores of this invocation's ROWS query rows (rows[] in common.glsl).
float sc[ROWS][CH];  // scaled scores of the current chunk, -inf where masked
#ifdef BLOCK_TILE
void load_q(uint rr) {}  // the workgroup's queries are in q_sh (load_q_tile)
#else
float q_reg[ROWS][D];  // queries, kept in registers

void load_q(uint rr) {
  Row r = rows[rr];
  uint base = q_at(r.bh, r.i);
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = float(q_buf[base + k]);
}
#endif

#ifdef REG_TILE
// Key c of the tile (past its end: the last key). The rows of a subgroup share one K/V head.
uint tile_key(uint c) { return key_row(rows[0].kv_base, tile_j0 + min(c, tile_n - 1u)); }

// Every row's scores against the tile's keys, KB keys at a time: their texels, fetched right
// before the products that use them, then element k from the lane that holds its texel
// (texel_lane). The shuffles have constant lanes, so llvmpipe makes each a broadcast from a
// register; the loops are unrolled and take no branch (one would keep them from unrolling;
// llvmpipe then keeps arrays in memory).
void score_tile() {
  [[unroll]] for (uint c0 = 0; c0 < BC; c0 += KB) {
    vec4 kt[KB][KT];
    [[unroll]] for (uint b = 0; b < KB; ++b)
      [[unroll]] for (uint u = 0; u < KT; u += KG) {
        Fetch f = lane_fetch(k_tex, K_FORMAT, KG, k_count(), D, tile_key(c0 + b), u);
        [[unroll]] for (uint g = 0; g < KG; ++g) kt[b][u + g] = texel(f, K_FORMAT, g);
      }
    float acc[ROWS][KB][ACC];
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
      [[unroll]] for (uint b = 0; b < KB; ++b)
        [[unroll]] for (uint a = 0; a < ACC; ++a) acc[rr][b][a] = 0.0;
    [[unroll]] for (uint k = 0; k < D; ++k) {
      float x[KB];
      [[unroll]] for (uint b = 0; b < KB; ++b)
        x[b] = subgroupShuffle(kt[b][texel_slot(k / 4u, KG)][k % 4u], texel_lane(k / 4u, KG));
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
        float q = q_reg[rr][k];
        [[unroll]] for (uint b = 0; b < KB; ++b)
          acc[rr][b][k % ACC] = fma(q, x[b], acc[rr][b][k % ACC]);
      }
    }
    [[unroll]] for (uint b = 0; b < KB; ++b) {
      uint c = c0 + b;
      if (c >= BC) continue;  // a constant
      bool key_ok = subgroupShuffle(lane_key_ok, c) != 0u;
      [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
        float dot = 0.0;
        [[unroll]] for (uint a = 0; a < ACC; ++a) dot += acc[rr][b][a];
        uint j = tile_j0 + c;
        bool seen = key_ok && in_row_keys(rr, j);
        sc[rr][c] = row_score(rr, j, seen, dot * pc.scale);
      }
    }
  }
}
#elif defined(BLOCK_TILE)
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
#else
// Scores of keys j0+c0 .. j0+c0+CH-1 (tile offsets c0..c0+CH-1 of a tile holding n keys).
void chunk_scores(uint j0, uint c0, uint n) {
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    float acc = 0.0;
    [[unroll]] for (uint k = 0; k < D; ++k) acc = fma(q_reg[0][k], tile_k[c * D + k], acc);
    sc[0][ci] = row_score(0u, j0 + c, c < n && key_visible(0u, j0 + c), acc * pc.scale);
  }
}

#endif

#ifndef BLOCK_TILE
const uint OW = DV;  // output columns of each invocation: whole rows
float row_max(float x) { return x; }  // an invocation holds its rows' whole chunks
float row_sum(float x) { return x; }
#endif

// The max of row rr's scores in the chunk; and row_sum(), which every recurrence applies to its
// chunk's sum of e^(s - m): over every invocation that holds part of the row's chunk.
float chunk_max(uint rr) {
  float m = NEG_INF;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) m = max(m, sc[rr][ci]);
  return row_max(m);
}

// Every recurrence updates its output the same way, o <- o * o_keep + sum_c o_coef[c] v_c; the
// recurrence sets the two, and the caller applies them (accumulate_o) outside any branch a row
// took on its own, as register tiles need every lane at each shuffle.
float o_acc[ROWS][OW];
float o_keep[ROWS];
float o_coef[ROWS][CH];

void o_hold(uint rr) {  // leave the output as it is
  o_keep[rr] = 1.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = 0.0;
}

#ifdef REG_TILE
// A fetch (G value texels) of every key of the tile at a time; each output element is loaded,
// rescaled, gets every key's term and is stored once per tile (the rows' outputs do not fit in
// registers).
void accumulate_o(uint c0) {
  [[unroll]] for (uint u0 = 0; u0 < VT; u0 += VG) {
    Fetch vf[BC];
    [[unroll]] for (uint c = 0; c < BC; ++c) vf[c] = lane_fetch(v_tex, V_FORMAT, VG, v_count(), DV, tile_key(c), u0);
    [[unroll]] for (uint g = 0; g < VG; ++g) {
      vec4 vt[BC];
      [[unroll]] for (uint c = 0; c < BC; ++c) vt[c] = texel(vf[c], V_FORMAT, g);
      [[unroll]] for (uint lane = 0; lane < BC; ++lane)
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
          uint e = 4u * slot_texel(lane, u0 + g, VG) + i;
          if (e >= DV) continue;  // a constant
          float v[BC];
          [[unroll]] for (uint c = 0; c < BC; ++c) v[c] = subgroupShuffle(vt[c][i], lane);
          [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
            float o = o_acc[rr][e] * o_keep[rr];
            [[unroll]] for (uint c = 0; c < BC; ++c) o = fma(o_coef[rr][c], v[c], o);
            o_acc[rr][e] = o;
          }
        }
    }
  }
}
#elif defined(BLOCK_TILE)
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
#else
void accumulate_o(uint c0) {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[0][k] *= o_keep[0];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci)
    [[unroll]] for (uint k = 0; k < DV; ++k)
      o_acc[0][k] = fma(o_coef[0][ci], tile_v[(c0 + ci) * DV + k], o_acc[0][k]);
}
#endif

// Writes row rr's output, times mul, to dst[base .. base + DV): the dimensions this invocation
// holds.
#ifdef BLOCK_TILE
uint first_column() { return group_lane() * OW; }
#else
uint first_column() { return 0u; }
#endif

void store_o(uint base, uint rr, float mul) {
  base += first_column();
  [[unroll]] for (uint e = 0; e < OW; ++e) o_buf[base + e] = o_acc[rr][e] * mul;
}

#ifdef SPLIT_KV
void store_partial(uint base, uint rr, float mul) {
  base += first_column();
  [[unroll]] for (uint e = 0; e < OW; ++e) scratch1[base + e] = o_acc[rr][e] * mul;
}
#endif

// The keys this workgroup (register tiles: subgroup) walks, from the union of those its rows see,
// so that tiles no row sees are skipped: all of them, or its chunk for splitkv (walk_bounds).
void key_range(out uint begin, out uint end) {
  uint lo, hi;
  rows_key_union(lo, hi);
#ifdef REG_TILE
  lo = subgroupMin(lo);
  hi = subgroupMax(hi);
#else
  workgroup_keys(lo, hi);
#endif
  walk_bounds(lo, hi, begin, end);
}
