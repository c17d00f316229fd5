// K/V tiles, and the scores of one query row against them. The scores of a chunk live in sc[],
// indexed only by unrolled (constant) indices: llvmpipe turns a private array indexed at run
// time into a select over every element.
//
// Two layouts of a tile, chosen by the host (Spec::layout):
// - shared memory (default): every invocation of the workgroup helps load BC keys; each then
//   reads all of them, one key at a time. Suits GPUs, where shared memory broadcasts.
// - registers (REG_TILE): a tile is one key per subgroup lane, loaded straight from the buffer
//   into that lane's registers, and every lane reads the others' keys with subgroupShuffle. No
//   barriers and no shared memory: on llvmpipe a shared-memory read at a per-invocation address
//   is a gather of scalar loads, while a shuffle by a constant lane is one register permute.

#ifdef REG_TILE
float k_reg[D];  // this lane's key of the tile
float v_reg[DV];
#define K_AT(c, k) subgroupShuffle(k_reg[k], c)
#define V_AT(c, k) subgroupShuffle(v_reg[k], c)

uint lane_key_ok;  // 1 if this lane's key is in the tile and not masked out by key_mask

// Lane c loads key j0 + c, four elements per texel fetch; lanes past the n keys of the tile read
// the last key (in bounds) and hold zeros.
void load_reg_tile(Row r, uint j0, uint n, bool need_v) {
  uint c = gl_SubgroupInvocationID;
  uint key = r.kv_base + j0 + min(c, n - 1u);
  bool keep = c < n;
  lane_key_ok = keep ? 1u : 0u;
  if ((pc.flags & FLAG_KEY_MASK) != 0u) {
    if (keep) lane_key_ok = mask_buf[r.b * pc.nk + j0 + c] != 0u ? 1u : 0u;
  }
  [[unroll]] for (uint k = 0; k < D; k += 4) {
    vec4 x = keep ? texelFetch(k_tex, int((key * D + k) / 4u)) : vec4(0.0);
    k_reg[k] = x.x, k_reg[k + 1] = x.y, k_reg[k + 2] = x.z, k_reg[k + 3] = x.w;
  }
  if (!need_v) return;
  [[unroll]] for (uint k = 0; k < DV; k += 4) {
    vec4 x = keep ? texelFetch(v_tex, int((key * DV + k) / 4u)) : vec4(0.0);
    v_reg[k] = x.x, v_reg[k + 1] = x.y, v_reg[k + 2] = x.z, v_reg[k + 3] = x.w;
  }
}
#else
shared float tile_k[BC * D];
shared float tile_v[BC * DV];
#define K_AT(c, k) tile_k[(c) * D + (k)]
#define V_AT(c, k) tile_v[(c) * DV + (k)]

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

float q_reg[D];  // this invocation's query row, kept in registers
float sc[CH];    // scaled scores of the current chunk, -inf where masked

void load_q(Row r) {
  uint base = (r.bh * pc.nq + r.i) * D;
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[k] = float(q_buf[base + k]);
}

// Whether row r sees key j0 + c of a tile holding n keys. With register tiles this must not
// branch: a branch in the loop over the chunk's keys stops it being unrolled, and llvmpipe then
// keeps sc[] in memory and gathers from it.
#ifdef REG_TILE
bool tile_key_visible(Row r, uint j0, uint c, uint n) {
  return (subgroupShuffle(lane_key_ok, c) & uint(j0 + c < r.key_end)) != 0u;
}
#else
bool tile_key_visible(Row r, uint j0, uint c, uint n) {
  return c < n && key_visible(r.b, r.key_end, j0 + c);
}
#endif

// Scores of keys j0+c0 .. j0+c0+CH-1 (tile offsets c0..c0+CH-1 of a tile holding n keys).
void chunk_scores(Row r, uint j0, uint c0, uint n) {
  // Keys inner: CH independent sums in flight rather than one chain of D dependent adds (each
  // sum still adds in the order of k).
  float acc[CH];
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[ci] = 0.0;
  [[unroll]] for (uint k = 0; k < D; ++k)
    [[unroll]] for (uint ci = 0; ci < CH; ++ci) acc[ci] = fma(q_reg[k], K_AT(c0 + ci, k), acc[ci]);
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    sc[ci] = tile_key_visible(r, j0, c, n) ? acc[ci] * pc.scale : NEG_INF;
  }
}

// Every recurrence updates its output the same way, o <- o * o_keep + sum_c o_coef[c] v_c; the
// recurrence sets the two, and the caller applies them (accumulate_o) outside any branch a row
// took on its own, as register tiles need every lane at each shuffle.
float o_acc[DV];
float o_keep;
float o_coef[CH];

void o_hold() {  // leave the output as it is
  o_keep = 1.0;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) o_coef[ci] = 0.0;
}

void accumulate_o(uint c0) {
  [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] *= o_keep;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci)
    [[unroll]] for (uint k = 0; k < DV; ++k) o_acc[k] = fma(o_coef[ci], V_AT(c0 + ci, k), o_acc[k]);
}

float chunk_max() {
  float m = NEG_INF;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) m = max(m, sc[ci]);
  return m;
}

// Highest key any row of this workgroup (register tiles: subgroup) can see, so fully masked
// tiles are skipped. With register tiles the bound must be the same for the whole subgroup.
#ifdef REG_TILE
uint workgroup_key_end(Row r) { return subgroupMax(r.key_end); }
#else
shared uint wg_key_end;

uint workgroup_key_end(Row r) {
  if (gl_LocalInvocationID.x == 0u) wg_key_end = 0u;
  barrier();
  atomicMax(wg_key_end, r.key_end);
  barrier();
  return wg_key_end;
}
#endif
