// The row in K's and V's memory of key j of the K/V head whose first key is row kv_base: every
// kernel that reads keys (common.glsl) and rope.comp, which appends them to a cache, address
// them through this one definition. The attention kernels step pc.kv_rstride rows a key (K and V
// viewed with strides, Tensor::view); in a paged cache (common.glsl's PAGE_SIZE, where kv_base
// is the K/V head's index b * Hkv + hkv) it looks the page up (paged_row). rope.comp appends to
// a KvCache, whose rows are dense.
#ifdef PAGED_KEY_ROW
uint key_row(uint kv_base, uint j) {
  return PAGE_SIZE == 0u ? kv_base + j * pc.kv_rstride : paged_row(kv_base, j);
}
#else
uint key_row(uint kv_base, uint j) { return kv_base + j; }
#endif
