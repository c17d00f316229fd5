// The state every tile layout keeps (tile_registers.glsl, tile_blocks.glsl, tile_shared.glsl,
// each of which includes this once its CH and OW are set): the scores of a chunk and the output
// accumulators, and how a recurrence hands its coefficients over.
// The queries and scores of this invocation's ROWS query rows (rows[] in common.glsl).
float sc[ROWS][CH];  // scaled scores of the current chunk, -inf where masked

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
