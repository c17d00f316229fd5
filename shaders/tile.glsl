// K/V tiles staged in shared memory, and the scores of one query row against them.
// Every invocation of the workgroup helps load a tile; each then reads all of it, CH keys at a
// time. The scores of a chunk live in sc[], indexed only by unrolled (constant) indices: llvmpipe
// turns a private array indexed at run time into a select over every element.

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

float q_reg[D];  // this invocation's query row, kept in registers
float sc[CH];    // scaled scores of the current chunk, -inf where masked

void load_q(Row r) {
  uint base = (r.bh * pc.nq + r.i) * D;
  [[unroll]] for (uint k = 0; k < D; ++k) q_reg[k] = 0.0;
  if (r.valid)
    [[unroll]] for (uint k = 0; k < D; ++k) q_reg[k] = float(q_buf[base + k]);
}

// Scores of keys j0+c0 .. j0+c0+CH-1 (tile offsets c0..c0+CH-1 of a tile holding n keys).
void chunk_scores(Row r, uint j0, uint c0, uint n) {
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) {
    uint c = c0 + ci;
    float acc = 0.0;
    [[unroll]] for (uint k = 0; k < D; ++k) acc += q_reg[k] * tile_k[c * D + k];
    sc[ci] = (c < n && key_visible(r.b, r.key_end, j0 + c)) ? acc * pc.scale : NEG_INF;
  }
}

float chunk_max() {
  float m = NEG_INF;
  [[unroll]] for (uint ci = 0; ci < CH; ++ci) m = max(m, sc[ci]);
  return m;
}

// Highest key any row of this workgroup can see, so fully masked tiles are skipped.
shared uint wg_key_end;

uint workgroup_key_end(Row r) {
  if (gl_LocalInvocationID.x == 0u) wg_key_end = 0u;
  barrier();
  atomicMax(wg_key_end, r.key_end);
  barrier();
  return wg_key_end;
}
