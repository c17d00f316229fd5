#version 460
#extension GL_GOOGLE_include_directive : require
// The tile bitmap of user-written attention (flashvk::flex), run before the fused kernels: a bit
// per workgroup of theirs (TILE_ROWS query rows) and tile of BC keys, set where a row of the
// workgroup sees a key of the tile through every limit of modifiers.glsl: the window, the chunk,
// the key mask, an additive mask's -inf and mask_mod (score_mod is not run here: a score it makes
// -inf depends on the keys' values, which the kernels read). The kernels then step over the other tiles
// (next_seen_tile, tile_seen) as over an additive mask's: never read. It writes the words at
// pc.mask_tiles of the buffer they read as table_words (bound here at B_TileBits). Each invocation
// tests one tile and stops at its first visible pair; a workgroup of 32 writes one word, and in
// scratch1 (as uint bits) the length of its batch's keys it was made for: a recording runs the
// pass before every run, and a word already made for this length is kept as it is.
#define FLEX_TILES
#include "common.glsl"

shared uint bits_sh;

void main() {
  uint t = gl_LocalInvocationID.x, word = gl_WorkGroupID.x, block = gl_WorkGroupID.y;
  uint bkv = gl_WorkGroupID.z, group = pc.heads / pc.kv_heads;
  uint b = bkv / pc.kv_heads, hkv = bkv % pc.kv_heads;
  uint tiles = (lengths.tile_keys + BC - 1u) / BC, words = (tiles + 31u) / 32u;
  uint at = (bkv * gl_NumWorkGroups.y + block) * words + word, made_for = seq_len(b);
  if (floatBitsToUint(scratch1[at]) == made_for) return;  // the same for the whole workgroup
  if (t == 0u) bits_sh = 0u;
  barrier();
  uint tile = word * 32u + t;
  bool seen = false;
  if (tile < tiles) {
    uint first = block * TILE_ROWS, last = min(first + TILE_ROWS, group * pc.nq);
    for (uint r = first; r < last && !seen; ++r) {
      rows[0] = make_row(b, hkv * group + r / pc.nq, r % pc.nq, true);
      uint lo = max(tile * BC, rows[0].key_begin), hi = min(tile * BC + BC, rows[0].key_end);
      for (uint j = lo; j < hi && !seen; ++j)
        seen = key_visible(0u, j) && modify_score(0u, j, 0.0) != NEG_INF;
    }
  }
  if (seen) atomicOr(bits_sh, 1u << t);
  barrier();
  if (t == 0u) {
    tile_bits[pc.mask_tiles + at] = bits_sh;
    scratch1[at] = uintBitsToFloat(made_for);
  }
}
