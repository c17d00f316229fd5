// The attention kernels' push constants, declared once for both sides: common.glsl includes
// it into its `Params` block and engine/src/plan.hpp into `struct Push`, each with its own
// PUSH_FIELD(type, name). Every member is a 32-bit uint, int or float, so the two layouts agree
// member for member (std430 push constants: 4-byte scalars, no padding), in at most 128 bytes
// (plan.hpp static_asserts it: 32 members at most).
PUSH_FIELD(uint, batch)
PUSH_FIELD(uint, heads)
PUSH_FIELD(uint, kv_heads)
PUSH_FIELD(uint, nq)
PUSH_FIELD(uint, nk)
PUSH_FIELD(float, scale)
PUSH_FIELD(uint, flags)
PUSH_FIELD(uint, splits)          // splitkv: number of key chunks
PUSH_FIELD(uint, keys_per_split)  // splitkv: keys per chunk, a multiple of BC
PUSH_FIELD(uint, trace_bh)        // traced row: b * H + h
PUSH_FIELD(uint, trace_row)       // traced row: query index
PUSH_FIELD(uint, bh0)             // naive: first (b, h) of this chunk
PUSH_FIELD(int, window_left)      // keys before its diagonal a query sees; -1 = all (row_keys)
PUSH_FIELD(int, window_right)     // keys after it; -1 = all, 0 = causal (causal is folded in)
PUSH_FIELD(uint, chunk_size)      // Llama 4's chunks of keys (modifiers.glsl row_keys); 0 = off
PUSH_FIELD(float, softcap)        // c of MOD_SOFTCAP
PUSH_FIELD(uint, mask_ranges)     // MOD_MASK: word offsets in table_words, and the strides of
PUSH_FIELD(uint, mask_values)     // batch and head in mask rows (0 where the mask is broadcast)
PUSH_FIELD(uint, mask_bstride)
PUSH_FIELD(uint, mask_hstride)
PUSH_FIELD(uint, mask_tiles)      // MOD_MASK, fused kernels: word offset of the tile bitmap
// Where rows sit in memory, in rows of D (Q, K) or DV (V, O) from one batch, head and row to
// the next (dense [B, H, N, d]: H N, N, 1; a prefix of a cache of capacity C: Hkv C, C, 1;
// token-major [B, N, H, d]: N H, 1, H). K and V share theirs. Paged K and V: Hkv, 1, 1, kv_base
// then being the K/V head's index, which key_row looks up in the page table.
PUSH_FIELD(uint, kv_bstride)
PUSH_FIELD(uint, kv_hstride)
PUSH_FIELD(uint, kv_rstride)
PUSH_FIELD(uint, q_bstride)
PUSH_FIELD(uint, q_hstride)
PUSH_FIELD(uint, q_rstride)
PUSH_FIELD(uint, o_bstride)
PUSH_FIELD(uint, o_hstride)
PUSH_FIELD(uint, o_rstride)
PUSH_FIELD(uint, kv_keys)         // key rows in K's memory (its span / d; paged: pages * Hkv * page size)
PUSH_FIELD(uint, page_table)      // paged: word offset of the page table in table_words
