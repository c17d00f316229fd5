// Register tiles (TileLayout::registers, -DREG_TILE; the default on CPU drivers): a tile is one
// key per subgroup lane, and every lane fetches its share of each key's K and V rows as RGBA
// texels (the keys' rows spread over the lanes: texel t of a row in lane t % BC). Each product
// reads the element it needs from the lane that holds it with a constant-index subgroupShuffle,
// so one fetched texel serves BC lanes x ROWS rows. No barriers and no shared memory, which on
// llvmpipe is a per-lane gather. An invocation owns ROWS query rows: their queries, scores,
// state and whole output rows.
// tile.glsl includes the tiles (tile_layout.glsl), fused_main.glsl the key loop (LAYOUT_MAIN).
#ifndef LAYOUT_MAIN
const uint CH = BC;  // the whole tile: one key per lane
const uint OW = DV;  // output columns of each invocation: whole rows
#include "tile_state.glsl"

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
    if (keep) lane_key_ok = table_words[r.b * pc.nk + j0 + lane] != 0u ? 1u : 0u;
  }
  if ((MODS & MOD_MASK) != 0u) {
    int last = textureSize(mask_tex) - 1;
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
      [[unroll]] for (uint t = 0; t < BC / 4u; ++t) {
        int at = int((mask_row_start(rr) + j0) / 4u + t);
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

// G texels fetched at once, decoded by texel(): a block format's words w with its block's head h,
// their first value x0, or one texel x of another format.
struct Fetch {
  uvec4 w;
  BlockHead h;
  uint x0;
  vec4 x;
};

// Texel g of a fetch.
vec4 texel(Fetch f, uint fmt, uint g) {
  if (kv_scaled(fmt)) return fmt_vec4(fmt, f.w[g], f.h, f.x0 + 4u * g);
  return f.x;
}

// The G texels from texel t (a multiple of G) of a tensor of `count` values in format fmt: its
// values 4t .. 4t + 4G - 1.
Fetch kv_fetch(KV_TEX tex, uint fmt, uint count, uint t) {
  Fetch f;
  f.w = uvec4(0u), f.h = no_head(), f.x0 = 4u * t, f.x = vec4(0.0);
#ifdef KV_QUANT
  uint x0 = 4u * t;
  if (kv_scaled(fmt)) {  // sixteen values of a block, in one texel, and its head
    uint s = kv_head_word(fmt, x0, count);
    uint w1 = FMT_HEAD_HALVES(fmt) > 2u ? texelFetch(tex, int((s + 1u) >> 2u))[(s + 1u) & 3u] : 0u;
    f.h = fmt_head(fmt, x0, texelFetch(tex, int(s >> 2u))[s & 3u], w1);
    f.w = texelFetch(tex, int(kv_word(fmt, x0) >> 2u));
    return f;
  }
  // The words that hold the four values, each fetched once: 4 x fmt_bits / 32 of them.
  uint w[4];
  uint words = fmt_bits(fmt) / 8u;
  [[unroll]] for (uint i = 0; i < 4u; ++i)
    if (i < words) w[i] = texelFetch(tex, int(kv_word(fmt, x0) + i)).x;
  [[unroll]] for (uint e = 0; e < 4u; ++e) f.x[e] = kv_value(fmt, x0 + e, w[e * words / 4u], f.h);
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
  if (t >= texels) f.h = no_head(), f.x = vec4(0.0);
  return f;
}

float q_reg[ROWS][D];  // queries, kept in registers

void load_q(uint rr) {
  Row r = rows[rr];
  uint base = q_at(r.bh, r.i);
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = float(q_buf[base + k]);
}

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

float row_max(float x) { return x; }  // an invocation holds its rows' whole chunks
float row_sum(float x) { return x; }

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

uint first_column() { return 0u; }

// The union [lo, hi) of the keys the subgroup's rows see: a subgroup walks its tiles together.
void layout_keys(inout uint lo, inout uint hi) {
  lo = subgroupMin(lo);
  hi = subgroupMax(hi);
}
#else
// Register tiles: no barriers; every lane of a subgroup runs every step together (rows outside
// the problem compute on zeros and store nothing), as the shuffles need. The rows of a workgroup
// share one batch and K/V head.
// One pass over the keys. Called with a constant pass, so that pass_needs_v(pass) is a constant:
// llvmpipe runs both sides of a branch on a value it cannot see is uniform, so in a loop over the
// passes the online softmax's first pass would fetch and add the values under a mask.
void key_pass(uint pass, uint begin, uint end) {
  for (uint j0 = next_seen_tile(begin, end); j0 < end; j0 = next_seen_tile(j0 + BC, end)) {
    uint n = min(BC, end - j0);
    mark_tile_keys(rows[0], j0, n);
    score_tile();
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      tile_begin(pass, rr);
      chunk_update(pass, 0u, rr);
    }
    if (pass_needs_v(pass)) accumulate_o(0u);
  }
}

void main() {
  start_rows();
  uint begin, end;
  key_range(begin, end);
  key_pass(0u, begin, end);
  if (PASSES > 1u) key_pass(1u, begin, end);
  finish_rows();
}
#endif
