// The row in K's and V's memory of key j of the K/V head whose first key is row kv_base: every
// kernel that reads keys (common.glsl) and rope.comp, which appends them to a cache, address
// them through this one definition (a paged cache will look the page up here).
uint key_row(uint kv_base, uint j) { return kv_base + j; }
