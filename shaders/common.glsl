// Shared declarations for every attention kernel: storage type, bindings, push constants and
// the mapping from invocations to (batch, head, query row).
//
// Storage: Q/K/V are ELEM (fp32, or fp16 when compiled with -DFP16); O, LSE and scratch are fp32.
// Layout: Q [B, H, Nq, D], K [B, Hkv, Nk, D], V [B, Hkv, Nk, DV], O [B, H, Nq, DV], LSE [B, H, Nq],
// Q, K, V and O with rows anywhere their strides put them (q_at, key_row, o_at).
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : enable
// [[unroll]] on every loop whose trip count is a specialization constant. Besides speed, this is
// about correctness on llvmpipe: it stops every loop of an invocation once all its loops together
// have run 65535 iterations (LP_MAX_TGSI_LOOP_ITERATIONS), so only the loops over keys iterate.
#extension GL_EXT_control_flow_attributes : require
#if defined(REG_TILE) || defined(LANE_TILE) || defined(BLOCK_SHUFFLE)
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif

#ifdef FP16
#define ELEM float16_t
#else
#define ELEM float
#endif

// The specialization constants (workgroup size, BC, D, DV, ROWS, KEY_MASK, LANES, MODS, K_FORMAT,
// V_FORMAT, PAGE_SIZE, KV_VEC4, V_AT), declared once for shaders and host.
#include "spec_constants.glsl"
// What each storage format of K and V is, and how its values decode (FMT_*, kv_value).
#include "formats.glsl"
// The descriptor set: what each binding holds (B_Q, B_K, ...).
#include "bindings.glsl"
layout(std430, binding = B_Q) readonly buffer QBuf { ELEM q_buf[]; };
#ifdef LANE_TILE
// K and V as 16-byte vectors in their storage formats (formats.glsl: FMT_LOAD_VALUES values a
// vector, and the block formats' heads read from the same vectors), decoded by kv_value().
layout(std430, binding = B_K) readonly buffer KBuf { uvec4 k_vec[]; };
layout(std430, binding = B_V) readonly buffer VBuf { uvec4 v_vec[]; };
#elif defined(KV_QUANT)
layout(std430, binding = B_K) readonly buffer KBuf { uint k_words[]; };
layout(std430, binding = B_V) readonly buffer VBuf { uint v_words[]; };
#else
layout(std430, binding = B_K) readonly buffer KBuf { ELEM k_buf[]; };
layout(std430, binding = B_V) readonly buffer VBuf { ELEM v_buf[]; };
#endif
layout(std430, binding = B_O) writeonly buffer OBuf { float o_buf[]; };
layout(std430, binding = B_Lse) writeonly buffer LseBuf { float lse_buf[]; };
// The small tables (bindings.glsl: Tables), as 32-bit words: the key mask [B, Nk] (0 = masked) from word 0; with MOD_MASK each
// mask row's first and last+1 finite key from pc.mask_ranges, and the additive mask's floats
// from pc.mask_values, mask_stride() a row (Nk rounded up to 4, padded with -inf; mask row of
// (b, h, i): b * pc.mask_bstride + h * pc.mask_hstride + i, the strides 0 where broadcast), and
// for the fused kernels a bitmap of the tiles each workgroup sees from pc.mask_tiles
// (next_seen_tile). With PAGE_SIZE, the page table from pc.page_table: indptr [B + 1], then
// last_page_len [B], then the page numbers (and one more, 0, so that a lookup for a sequence
// without pages stays in the buffer).
layout(std430, binding = B_Tables) readonly buffer Tables { uint table_words[]; };
// CHUNK_MERGE (splitkv_lanes.comp): the chunks' partial results are read by the workgroup that
// finishes a row's chunks last, so they bypass caches another workgroup's writes would miss; the
// trace slot holds a counter per row block, of the chunks finished.
#ifdef CHUNK_MERGE
#define SCRATCH_COHERENCE coherent
#else
#define SCRATCH_COHERENCE
#endif
layout(std430, binding = B_Scratch1) SCRATCH_COHERENCE buffer Scratch1 { float scratch1[]; };
layout(std430, binding = B_Scratch2) SCRATCH_COHERENCE buffer Scratch2 { float scratch2[]; };
#ifdef CHUNK_MERGE
layout(std430, binding = B_ChunksDone) coherent buffer ChunkCounters { uint chunks_done[]; };
#elif defined(FLEX_TILES)
layout(std430, binding = B_TileBits) writeonly buffer TileBits { uint tile_bits[]; };  // the Tables buffer
#else
layout(std430, binding = B_Trace) buffer TraceBuf { float trace_buf[]; };
#endif
// Per (batch, query head): its ALiBi slope and its sink logit. Bound when MODS has either.
layout(std430, binding = B_Heads) readonly buffer HeadBuf { vec2 head_buf[]; };
#ifdef REG_TILE
// K and V again, as RGBA texels (fp32 or fp16, converted by the fetch). On llvmpipe a storage-buffer
// read at a per-lane address is a loop over the lanes with two branches per element, while a texel
// fetch is a branch-free gather of four elements per lane. Texel buffers also reach past
// maxStorageBufferRange.
#ifdef KV_QUANT
// KV_QUANT: K and V in their formats as 32-bit words (R32_UINT texels), the block formats as
// four words a texel (R32G32B32A32_UINT; tile.glsl kv_fetch).
#define KV_TEX usamplerBuffer
#else
#define KV_TEX samplerBuffer
#endif
layout(binding = B_KTexels) uniform KV_TEX k_tex;
layout(binding = B_VTexels) uniform KV_TEX v_tex;
// The additive mask's values (MOD_MASK), four keys a texel: rows are padded to mask_stride().
layout(binding = B_MaskTexels) uniform samplerBuffer mask_tex;
#endif

const uint FLAG_LSE = 4u;
const uint FLAG_TRACE = 8u;

#define PUSH_FIELD(type, name) type name;
layout(push_constant) uniform Params {
#include "push_fields.glsl"
}
pc;
#undef PUSH_FIELD

// The number of keys attended, Nk, read from memory (lengths.glsl). pc.nk is the Nk the plan was
// made for, the key and additive masks' row length.
#include "lengths.glsl"
uint kv_len() { return lengths.nk; }

// A paged cache: the keys of batch b (sequence b of the page table), and the row in K's memory
// of key j of K/V head kv_head = b * Hkv + hkv (key_row.glsl). Pages are [pages, Hkv, PAGE_SIZE]
// rows; keys past a sequence's end are looked up in its last page (and never weighed).
uint seq_pages(uint b, out uint first) {
  first = table_words[pc.page_table + b];
  return table_words[pc.page_table + b + 1u] - first;
}
uint seq_len(uint b) {
  if (PAGE_SIZE == 0u) return kv_len();
  uint first, pages = seq_pages(b, first);
  return pages == 0u ? 0u : (pages - 1u) * PAGE_SIZE + table_words[pc.page_table + pc.batch + 1u + b];
}
uint paged_row(uint kv_head, uint j) {
  uint b = kv_head / pc.kv_heads, first, pages = seq_pages(b, first);
  uint slot = min(j / PAGE_SIZE, max(pages, 1u) - 1u);
  uint page = table_words[pc.page_table + 2u * pc.batch + 1u + first + slot];
  return (page * pc.kv_heads + kv_head % pc.kv_heads) * PAGE_SIZE + j % PAGE_SIZE;
}
#define PAGED_KEY_ROW

#define NEG_INF uintBitsToFloat(0xff800000u)

// Values of K and V in memory: pc.kv_keys rows of D (K) and DV (V) values, in which key_row()
// finds each head's keys.
uint k_count() { return pc.kv_keys * D; }
uint v_count() { return pc.kv_keys * DV; }

#if defined(KV_QUANT) && !defined(REG_TILE)
float k_value(uint x) {
  BlockHead h = no_head();
  if (kv_scaled(K_FORMAT)) {
    uint w = kv_head_word(K_FORMAT, x, k_count());
    h = fmt_head(K_FORMAT, x, k_words[w], FMT_HEAD_HALVES(K_FORMAT) > 2u ? k_words[w + 1u] : 0u);
  }
  return kv_value(K_FORMAT, x, k_words[kv_word(K_FORMAT, x)], h);
}
float v_value(uint x) {
  BlockHead h = no_head();
  if (kv_scaled(V_FORMAT)) {
    uint w = kv_head_word(V_FORMAT, x, v_count());
    h = fmt_head(V_FORMAT, x, v_words[w], FMT_HEAD_HALVES(V_FORMAT) > 2u ? v_words[w + 1u] : 0u);
  }
  return kv_value(V_FORMAT, x, v_words[kv_word(V_FORMAT, x)], h);
}
#elif !defined(REG_TILE) && !defined(LANE_TILE)
float k_value(uint x) { return float(k_buf[x]); }
float v_value(uint x) { return float(v_buf[x]); }
#endif

#include "key_row.glsl"

// Where query i of head bh = b * H + h starts in Q, and its output in O, in elements: the rows'
// strides (push_fields.glsl) from the tensors the host binds; LSE and the scratch stay dense,
// [B, H, Nq] by bh * Nq + i.
uint q_at(uint bh, uint i) {
  uint b = bh / pc.heads, h = bh % pc.heads;
  return (b * pc.q_bstride + h * pc.q_hstride + i * pc.q_rstride) * D;
}
uint o_at(uint bh, uint i) {
  uint b = bh / pc.heads, h = bh % pc.heads;
  return (b * pc.o_bstride + h * pc.o_hstride + i * pc.o_rstride) * DV;
}

// One query row as seen by one invocation.
struct Row {
  bool valid;
  uint bh;         // b * H + h
  uint kv_base;    // element offset of this row's K/V head, in keys
  uint i;          // query index in [0, Nq)
  uint key_begin;  // keys [key_begin, key_end) are visible (row_keys); empty for invalid rows
  uint key_end;
  uint b;
  int diag;     // the key this query sits on, i + Nk - Nq (bottom-right aligned)
  float slope;  // ALiBi's slope for this head (MOD_ALIBI)
  float sink;   // the sink logit the recurrence starts from (MOD_SINKS), else -inf
  uint mask_row;  // MOD_MASK: this row's index among the mask's rows
};

// The rows this invocation works on (ROWS; one but for register tiles and lanes), set by each
// kernel from make_row. The functions below take a row's index, not the Row: llvmpipe gives
// every by-value struct argument fresh stack space, and a call per key overflowed its fixed
// per-invocation stack after a few hundred keys.
Row rows[ROWS];

// Whether key j is inside row rr's keys (row_keys).
bool in_row_keys(uint rr, uint j) { return j >= rows[rr].key_begin && j < rows[rr].key_end; }

// The block of query rows this workgroup runs and its KV head (b * Hkv + kv head): the fused
// kernels' grid is x blocks of rows by y KV heads, and workgroups start in the dispatch's order
// (x fastest), which these take as every KV head's last block, then every head's block before
// it, and so on. In a causal walk later rows see more keys, so the longest blocks start first
// and the short ones fill the dispatch's end (in order, the longest were the last to start and
// the GPU waited on them; with each head's blocks in turn, the last heads' long blocks started
// after the first heads' short ones: on 264 workgroup slots, 8 heads of 64 blocks took 0.79x
// the full walk's time where 0.5 is its share of keys, modelled as list scheduling). Every mapping
// of a workgroup to its rows, and the tile bitmap's (mask_tile_word), goes through these.
uint workgroup_order() { return gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x; }
uint row_block() { return gl_NumWorkGroups.x - 1u - workgroup_order() / gl_NumWorkGroups.y; }
uint workgroup_kv_head() { return workgroup_order() % gl_NumWorkGroups.y; }

// Which keys a row sees, its sink, and the score hook (the modifiers).
#include "modifiers.glsl"

Row make_row(uint b, uint h, uint i, bool valid) {
  Row r;
  r.valid = valid;
  r.b = b;
  r.bh = b * pc.heads + h;
  uint group = pc.heads / pc.kv_heads;
  r.kv_base = b * pc.kv_bstride + (h / group) * pc.kv_hstride;
  r.i = i;
  row_keys(b, h, i, r.key_begin, r.key_end);
  if (!valid) r.key_begin = r.key_end = 0u;
  r.diag = int(i) + int(seq_len(b)) - int(pc.nq);
  row_modifiers(r, h);
  return r;
}

// Fused kernels pack the query rows of all heads that share one KV head into the same
// workgroups (grouped-query attention), so every K/V tile serves them all. A workgroup's KV head
// b * Hkv + kv head, and its block of packed rows (head in group, query), ROWS per invocation
// (one with shared tiles): workgroup_kv_head() and row_block().
// The packed index of this invocation's row rr: ROWS consecutive rows an invocation, or with
// BLOCK_TILE those of its row group (LANES invocations share them).
uint row_slot(uint rr) {
#ifdef BLOCK_TILE
  return (row_block() * gl_WorkGroupSize.x + gl_LocalInvocationID.x) / LANES * ROWS + rr;
#else
  return (row_block() * gl_WorkGroupSize.x + gl_LocalInvocationID.x) * ROWS + rr;
#endif
}

Row packed_row(uint rr) {
  uint group = pc.heads / pc.kv_heads;
  uint b = workgroup_kv_head() / pc.kv_heads;
  uint hkv = workgroup_kv_head() % pc.kv_heads;
  uint r = row_slot(rr);
  bool valid = r < group * pc.nq;
  uint hg = valid ? r / pc.nq : 0u;
  uint i = valid ? r % pc.nq : 0u;
  return make_row(b, hkv * group + hg, i, valid);
}

// The union of the keys this invocation's rows see, [lo, hi) (lo >= hi: none).
void rows_key_union(out uint lo, out uint hi) {
  lo = 0xffffffffu;
  hi = 0u;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    if (rows[rr].key_begin < rows[rr].key_end) {
      lo = min(lo, rows[rr].key_begin);
      hi = max(hi, rows[rr].key_end);
    }
}

#if !defined(REG_TILE) && !defined(LANE_TILE)
// [0] lo, [1] hi (workgroup_keys), [2] and [3] (workgroup_inner_keys); 16 bytes, so that the
// arrays declared after it stay 16-byte aligned (RADV places shared variables at their
// components' alignment: two uints put the next uvec4 array 8 bytes off, and every 16-byte
// access to it split in two, with moves to put the halves together).
shared uint wg_keys[4];

// Over the workgroup, the least of the invocations' x_min into wg_keys[at_min] and the greatest
// of their x_max into wg_keys[at_max], both returned.
void workgroup_min_max(uint at_min, inout uint x_min, uint at_max, inout uint x_max) {
  if (gl_LocalInvocationID.x == 0u) {
    wg_keys[at_min] = 0xffffffffu;
    wg_keys[at_max] = 0u;
  }
  barrier();
  atomicMin(wg_keys[at_min], x_min);
  atomicMax(wg_keys[at_max], x_max);
  barrier();
  x_min = wg_keys[at_min];
  x_max = wg_keys[at_max];
}

// The union over a workgroup of the keys its invocations' rows see, [lo, hi), each invocation
// giving its own union (lo >= hi when it sees none).
void workgroup_keys(inout uint lo, inout uint hi) {
  if (lo >= hi) {  // none: what changes neither bound
    lo = 0xffffffffu;
    hi = 0u;
  }
  workgroup_min_max(0u, lo, 1u, hi);
}

// The keys every valid row of the workgroup sees by its range, [lo, hi) (lo >= hi: none), in
// wg_keys[2] and [3]: a whole tile inside them needs no test a key for the ranges.
void workgroup_inner_keys(out uint lo, out uint hi) {
  lo = 0u;
  hi = 0xffffffffu;
  [[unroll]] for (uint rr = 0; rr < ROWS; ++rr)
    if (rows[rr].valid) {
      lo = max(lo, rows[rr].key_begin);
      hi = min(hi, rows[rr].key_end);
    }
  workgroup_min_max(3u, hi, 2u, lo);
}
#endif

// The keys a workgroup (or, for splitkv, its chunk) walks, given the union [lo, hi) of the keys
// its rows see: begin rounded down to a whole tile of BC keys, so that tiles (and their trace
// records) stay where a walk from key 0 would put them.
void walk_bounds(uint lo, uint hi, out uint begin, out uint end) {
  begin = 0u;
  end = kv_len();
#ifdef SPLIT_KV
  begin = min(kv_len(), gl_WorkGroupID.z * pc.keys_per_split);
  end = min(kv_len(), begin + pc.keys_per_split);
#endif
  begin = max(begin, lo / BC * BC);
  end = min(end, hi);
}

// Tracing is compiled in only for the -DTRACE builds, so the kernels users run carry none of it.
#ifdef TRACE
bool is_traced(Row r) {
  return (pc.flags & FLAG_TRACE) != 0u && r.valid && r.bh == pc.trace_bh && r.i == pc.trace_row;
}
#else
bool is_traced(Row r) { return false; }
#endif

// Trace records, one per tile (or per key when BC = 1): s, m, l, w, lse, spare, then o[DV].
const uint TRACE_FIELDS = 6u;

#if !defined(CHUNK_MERGE) && !defined(FLEX_TILES)
void trace_put(uint record, uint field, float v) {
  trace_buf[record * (TRACE_FIELDS + DV) + field] = v;
}
#endif

// log(1 + exp(x)) without overflow or cancellation.
float softplus(float x) {
  float e = exp(-abs(x));
  float l1p = e < 1e-4 ? e - 0.5 * e * e : log(1.0 + e);
  return max(x, 0.0) + l1p;
}
