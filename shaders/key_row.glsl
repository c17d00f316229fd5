// The row in K's and V's memory of key j of the K/V head whose first key is row kv_base: every
// kernel that reads keys (common.glsl) and rope.comp, which appends them to a cache, address
// them through this one definition. In a paged cache (common.glsl's PAGE_SIZE, where kv_base is
// the K/V head's index b * Hkv + hkv) it looks the page up (paged_row).
#ifdef PAGED_KEY_ROW
uint key_row(uint kv_base, uint j) { return PAGE_SIZE == 0u ? kv_base + j : paged_row(kv_base, j); }
#else
uint key_row(uint kv_base, uint j) { return kv_base + j; }
#endif
