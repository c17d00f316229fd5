// What a recording reads from memory when it runs, not from push constants, so that a command
// buffer recorded once serves every decode step: the host writes it between submits
// (AttentionRecording::set_keys, set_position). One declaration for every kernel.
//  nk: the number of keys attended, Nk (at most the capacity of the cache K and V view).
//  position: the cache row that a recording's appended K/V rows go to, and the RoPE position of
//    the first of them (and of the first query); 0 when nothing is appended.
//  tile_keys: the keys a row of the tile bitmap spans (MOD_TILES): the plan's Nk for an additive
//    mask's, the most a recording may attend over for mask_mod's (flex_tiles.comp).
layout(std140, binding = B_Lengths) uniform Lengths {
  uint nk;
  uint position;
  uint tile_keys;
}
lengths;
