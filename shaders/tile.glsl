// K/V tiles staged in shared memory, and the scores of one query row against a K tile.
// Every invocation of the workgroup helps load a tile; each then reads all of it.

shared float tile_k[BC * D];
shared float tile_v[BC * DV];

void load_k_tile(uint kv_base, uint j0, uint n) {
  for (uint e = gl_LocalInvocationID.x; e < BC * D; e += gl_WorkGroupSize.x) {
    uint c = e / D;
    tile_k[e] = c < n ? float(k_buf[(kv_base + j0 + c) * D + e % D]) : 0.0;
  }
}

void load_v_tile(uint kv_base, uint j0, uint n) {
  for (uint e = gl_LocalInvocationID.x; e < BC * DV; e += gl_WorkGroupSize.x) {
    uint c = e / DV;
    tile_v[e] = c < n ? float(v_buf[(kv_base + j0 + c) * DV + e % DV]) : 0.0;
  }
}

float q_reg[D];  // this invocation's query row, kept in registers

void load_q(Row r) {
  uint base = (r.bh * pc.nq + r.i) * D;
  for (uint k = 0; k < D; ++k) q_reg[k] = r.valid ? float(q_buf[base + k]) : 0.0;
}

// Scaled scores of keys j0 .. j0+n-1 against the tile in shared memory; -inf where masked.
void tile_scores(Row r, uint j0, uint n, inout float s[BC]) {
  for (uint c = 0; c < BC; ++c) {
    float acc = 0.0;
    for (uint k = 0; k < D; ++k) acc += q_reg[k] * tile_k[c * D + k];
    s[c] = (c < n && key_visible(r, j0 + c)) ? acc * pc.scale : NEG_INF;
  }
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
