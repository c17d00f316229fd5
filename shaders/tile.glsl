// K/V tiles, the scores of the query rows against them, and the output accumulators. Arrays
// are indexed only by unrolled (constant) indices: llvmpipe keeps a private array indexed at run
// time in memory and gathers from it.
//
// Two layouts, chosen by the host (Spec::registers):
// - shared memory (default on GPUs): one invocation owns one query row (ROWS = 1); every
//   invocation of the workgroup helps load BC keys into shared memory, then each reads all of
//   them, CH keys at a time, and keeps its row's scores, state and whole output row.
// - registers (REG_TILE, default on CPU drivers): a subgroup owns ROWS query rows together and a
//   tile is one key per lane. Lane c holds key c in registers and scores it against every row,
//   the queries being the same in every lane, so Q K^T needs no data movement at all; a row's
//   max and sum over the tile are subgroup reductions. Each lane keeps 4 * VT dimensions of every
//   row's output and reads the weights of the other lanes' keys with subgroupShuffle. No
//   barriers and no shared memory, which on llvmpipe is a per-lane gather.

#ifdef REG_TILE
const uint CH = 1u;  // scores per row held by a lane: its own key's
const uint VT = (DV / 4u + BC - 1u) / BC;  // texels of each value row a lane holds
const uint OD = 4u * VT;                    // output dimensions a lane holds per row
float v_reg[BC][OD];                        // this lane's dimensions of every key's value row
uint lane_key_ok;  // 1 if this lane's key is in the tile and not masked out by key_mask

// Row dimension of output element e of this invocation.
uint o_dim(uint e) { return 4u * (gl_SubgroupInvocationID + BC * (e / 4u)) + e % 4u; }
bool first_lane() { return gl_SubgroupInvocationID == 0u; }

// Lane c notes whether key j0 + c (a tile holds n keys) counts.
void mark_tile_keys(Row r, uint j0, uint n) {
  uint lane = gl_SubgroupInvocationID;
  bool keep = lane < n;
  lane_key_ok = keep ? 1u : 0u;
  if (KEY_MASK) {
    if (keep) lane_key_ok = mask_buf[r.b * pc.nk + j0 + lane] != 0u ? 1u : 0u;
  }
}

// Value fetch f (of BC * VT): texel lane + BC * (f % VT) of key f / VT's row, the lane's share of
// it, four elements at once. Fetches stay in bounds: keys past the tile read the last key's row
// (their weight is 0) and texels past the row read as zero.
const uint V_FETCHES = BC * VT;
void load_v_texel(uint kv_base, uint j0, uint n, uint f) {
  uint c = f / VT, t = f % VT;
  uint texel = gl_SubgroupInvocationID + BC * t;
  uint vkey = kv_base + j0 + min(c, n - 1u);
  vec4 x;
  if (BC * VT * 4u == DV) {  // a constant: no texel index can pass the row's end
    x = texelFetch(v_tex, int(vkey * (DV / 4u) + texel));
  } else {
    x = texelFetch(v_tex, int(vkey * (DV / 4u) + min(texel, DV / 4u - 1u)));
    x = texel < DV / 4u ? x : vec4(0.0);
  }
  v_reg[c][4 * t] = x.x, v_reg[c][4 * t + 1] = x.y;
  v_reg[c][4 * t + 2] = x.z, v_reg[c][4 * t + 3] = x.w;
}
#else
const uint OD = DV;
uint o_dim(uint e) { return e; }
bool first_lane() { return true; }

shared float tile_k[BC * D];
shared float tile_v[BC * DV];

void load_k_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * D + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / D;
    float x = 0.0;
    if (e < BC * D && c < n) x = float(k_buf[(kv_base + j0 + c) * D + e % D]);
    if (e < BC * D) tile_k[e] = x;  // keys past the end are zeros
  }
}

void load_v_tile(uint kv_base, uint j0, uint n) {
  const uint steps = (BC * DV + gl_WorkGroupSize.x - 1u) / gl_WorkGroupSize.x;
  [[unroll]] for (uint i = 0; i < steps; ++i) {
    uint e = gl_LocalInvocationID.x + i * gl_WorkGroupSize.x;
    uint c = e / DV;
    float x = 0.0;
    if (e < BC * DV && c < n) x = float(v_buf[(kv_base + j0 + c) * DV + e % DV]);
    if (e < BC * DV) tile_v[e] = x;
  }
}
#endif

// The ROWS query rows of this invocation (register tiles: of its subgroup, the same in every
// lane), with their queries and scores.
Row rows[ROWS];
float q_reg[ROWS][D];  // queries, kept in registers
float sc[ROWS][CH];    // scaled scores of the current chunk, -inf where masked

void load_q(uint rr) {
  Row r = rows[rr];
  uint base = (r.bh * pc.nq + r.i) * D;
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[rr][k] = float(q_buf[base + k]);
}

#ifdef REG_TILE
// Every row's score of this lane's key, and (need_v) the tile's value rows. No branches on
// lane values here: a branch would keep the loops from being unrolled.
// The key is fetched one texel at a time, right before the products that use it: llvmpipe
// calls a function for each fetch, and LLVM schedules each stretch between calls on its own,
// so the texel's four values stay in registers while every row uses them (one load, of the
// query, per multiply-add; fetching the whole key first left LLVM a schedule that reloaded the
// key for every row: two loads per multiply-add). Each value fetch follows the products of one
// key texel, so that the core has multiply-adds to run beside it (back to back before the
// scores, the value fetches took a quarter of the time; here, about a tenth). Splitting each
// row's sum in two or four chains, scoring 16 rows at d = 64, or two keys per lane measured no
// faster (the loop outgrows the instruction cache).
const uint K_FETCHES = D / 4u;
void score_tile(uint j0, uint n, bool need_v) {
  uint kv_base = rows[0].kv_base;
  uint key = kv_base + j0 + min(gl_SubgroupInvocationID, n - 1u);
  float acc[ROWS];
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) acc[rr] = 0.0;
  [[unroll]] for (uint t = 0; t < K_FETCHES; ++t) {
    vec4 x = texelFetch(k_tex, int(key * (D / 4u) + t));
    [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
      float a = acc[rr];
      a = fma(q_reg[rr][4u * t], x.x, a);
      a = fma(q_reg[rr][4u * t + 1u], x.y, a);
      a = fma(q_reg[rr][4u * t + 2u], x.z, a);
      acc[rr] = fma(q_reg[rr][4u * t + 3u], x.w, a);
    }
    if (need_v && t < V_FETCHES) load_v_texel(kv_base, j0, n, t);
  }
  if (need_v)
    [[unroll]] for (uint f = K_FETCHES; f < V_FETCHES; ++f) load_v_texel(kv_base, j0, n, f);
  uint key_index = j0 + gl_SubgroupInvocationID;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    float s = acc[rr];
    bool seen = (lane_key_ok & uint(key_index < rows[rr].key_end)) != 0u;
    sc[rr][0] = seen ? s * pc.scale : NEG_INF;
  }
}

// Max and sum over the chunk's keys, which lie one per lane, by butterfly shuffles: llvmpipe
// runs subgroupMax and subgroupAdd as a serial loop over the lanes through memory.
// (Steps of a counted loop, so that it unrolls; BC, the subgroup size, is at most 64.)
float chunk_max(uint rr) {
  float x = sc[rr][0];
  [[unroll]] for (uint i = 0u; i < 6u; ++i)
    if ((32u >> i) < BC) x = max(x, subgroupShuffleXor(x, 32u >> i));
  return x;
}

float chunk_sum(float x) {
  [[unroll]] for (uint i = 0u; i < 6u; ++i)
    if ((32u >> i) < BC) x += subgroupShuffleXor(x, 32u >> i);
  return x;
}
#else
// Scores of keys j0+c0 .. j0+c0+CH-1 (tile offsets c0..c0+CH-1 of a tile holding n keys).
void chunk_scores(uint j0, uint c0, uint n) {
  Row r = rows[0];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    float acc = 0.0;
    [[unroll]] for (uint k = 0; k < D; ++k) acc = fma(q_reg[0][k], tile_k[c * D + k], acc);
    sc[0][ci] = (c < n && key_visible(r.b, r.key_end, j0 + c)) ? acc * pc.scale : NEG_INF;
  }
}

float chunk_max(uint rr) {
  float m = NEG_INF;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) m = max(m, sc[rr][ci]);
  return m;
}
float chunk_sum(float x) { return x; }  // the caller summed its chunk
#endif

// Every recurrence updates its output the same way, o <- o * o_keep + sum_c o_coef[c] v_c; the
// recurrence sets the two (per lane with register tiles: the coefficient of the lane's key),
// and the caller applies them (accumulate_o) outside any branch a row took on its own, as
// register tiles need every lane at each shuffle.
float o_acc[ROWS][OD];
float o_keep[ROWS];
float o_coef[ROWS][CH];

void o_hold(uint rr) {  // leave the output as it is
  o_keep[rr] = 1.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[rr][ci] = 0.0;
}

#ifdef REG_TILE
// Row by row, each output element in a register across the tile's keys: the whole o_acc does
// not fit in registers, and this way each element is loaded and stored once per tile.
void accumulate_o(uint c0) {
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) {
    float p[BC];  // the weights of every lane's key
    [[unroll]] for (uint c = 0; c < BC; ++c) p[c] = subgroupShuffle(o_coef[rr][0], c);
    [[unroll]] for (uint e = 0; e < OD; ++e) {
      float o = o_acc[rr][e] * o_keep[rr];
      [[unroll]] for (uint c = 0; c < BC; ++c) o = fma(p[c], v_reg[c][e], o);
      o_acc[rr][e] = o;
    }
  }
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
void store_o(uint base, uint rr, float mul) {
  [[unroll]] for (uint e = 0; e < OD; ++e)
    if (o_dim(e) < DV) o_buf[base + o_dim(e)] = o_acc[rr][e] * mul;
}

#ifdef SPLIT_KV
void store_partial(uint base, uint rr, float mul) {
  [[unroll]] for (uint e = 0; e < OD; ++e)
    if (o_dim(e) < DV) scratch1[base + o_dim(e)] = o_acc[rr][e] * mul;
}
#endif

uint last_key_end() {
  uint end = 0u;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr) end = max(end, rows[rr].key_end);
  return end;
}

// Highest key any row of this workgroup (register tiles: subgroup) can see, so fully masked
// tiles are skipped. With register tiles every lane has the same rows, so the same bound.
#ifdef REG_TILE
uint workgroup_key_end() { return last_key_end(); }
#else
shared uint wg_key_end;

uint workgroup_key_end() {
  if (gl_LocalInvocationID.x == 0u) wg_key_end = 0u;
  barrier();
  atomicMax(wg_key_end, last_key_end());
  barrier();
  return wg_key_end;
}
#endif
