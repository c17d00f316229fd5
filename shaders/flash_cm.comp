#version 460
#extension GL_GOOGLE_include_directive : require
// Cooperative-matrix kernel (TileLayout::cooperative_matrix: fp16 Q, K and V in fp16 or a block
// format): the tile products S = Q K^T and O += P V run on the device's matrix units, fp16 in
// and fp32 accumulate, through VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix, or
// emulated (coopmat.glsl); with VK_NV_cooperative_matrix2's row operations (or their stand-in)
// the softmax too stays in accumulators (CM_ROW_OPS, tile_row_ops). Built once per recurrence:
// -DCM_FLASH1, -DCM_FLASH2, -DCM_FLASHD, and -DCM_FLASH2 -DSPLIT_KV for splitkv's partial pass,
// each for every matrix API.
//
// The matrices are the device's shape (coopmat.glsl): CM_M x 16 times 16 x CM_N by a group of
// SUBGROUP lanes (16 x 16 by 32 on NVIDIA and AMD; 8-row shapes on Intel). A workgroup is NSG
// groups. A row block of RM x CM_M packed query rows (RM row matrices: 1, or 2 where a call asks:
// ExecutionHints::group_rows; past d = 64 Q_SHARED) belongs to SPLIT groups (LANES: 1, or 2 where d
// or dv is over 128, 64 on Arc's 8 x 8: tiling.cpp's coopmat_split), each of which keeps
// 1 / SPLIT of the block's head dims: D / SPLIT of its queries as matrices and DV / SPLIT of its
// output columns as accumulator matrices (fp32) from the first tile to the last, so that at
// d = 256 a lane holds what it does at 128. So 64 rows a workgroup, or 32 split (or 128 where
// a call asks: twice the groups, ExecutionHints::block_rows; or 4 groups of 2 row matrices).
// Each right operand read from shared memory feeds RM products. Per tile of
// BC keys, staged in shared memory as fp16 (decoded on the way where K or V is in a block
// format; K as rows, V transposed: every right operand is read as the transpose of rows, keys or
// head dims contiguous, which is how AMD's and Intel's lanes hold it; V as rows took a 16-bit
// load an element on RDNA3) and read by every group:
//   1. each group's part of S (CM_M x BC) = Q K^T as CM_M x CM_N products, stored to its scratch
//      in shared memory (a matrix's element layout is the driver's, so rows are read back through
//      memory);
//   2. LPR lanes per row add the parts, take the row's max and sum over the tile (exchanges
//      within the group: a split block's groups take 1 / SPLIT of its rows each), run the
//      variant's recurrence, and write P (fp16, at most 1: relative to a max) and the rows'
//      factors over the block's first S (keep and coef, each as an accumulator matrix whose row r
//      is row r's factor; keep alone for FlashAttention-2);
//   3. O <- O * keep + coef * P V on the accumulators, element by element (the factor matrices
//      share the accumulators' element layout, whatever the driver's is). FlashAttention-2's
//      coef is 1: P V accumulates straight into O, which is scaled only where a valid row of
//      the block has keep != 1 (the group votes, cm_any: a row that moved its max, or saw
//      nothing yet), and always in a split block.
// The output leaves the accumulators once, at the end, through the scratch.
// Rounding P to fp16 moves each weight by at most 2^-11 of itself, so the output by at most
// 2^-11 of max |v|; the tests allow for it.
// Every array the matrices are loaded from or stored to is of 16-byte elements (uvec4: 8 fp16
// values or 4 fp32), so that each matrix starts 16-byte aligned: with fp16 arrays, the
// NVIDIA driver read the tiles 4 bytes off.
// On the matrix units the kernel is on the Vulkan memory model, and the driver gets its shared
// memory coherent at the barriers alone (engine/src/spirv.hpp: not at every access, which made
// RADV wait on each load and store): whatever one invocation writes there, another reads only
// after a barrier() or cm_sync() between them.
#define FP16
#include "common.glsl"

const uint RM = CM_ROW_MATRICES;     // row matrices a group multiplies: 1, or 2 (group_rows)
const uint SG_ROWS = CM_M * RM;      // query rows per row block
const uint WG = gl_WorkGroupSize.x;  // invocations per workgroup
const uint NSG = WG / SUBGROUP;      // groups per workgroup: NSG * CM_M = 64 rows (or 128)
const uint SPLIT = LANES;            // groups per row block, each with D / SPLIT and DV / SPLIT
const uint QD = D / SPLIT;           // head dims of Q and K a group multiplies
const uint OD = DV / SPLIT;          // output columns a group holds
const uint WG_ROWS = SG_ROWS * (NSG / SPLIT);  // query rows per workgroup
const uint LPR = SUBGROUP * SPLIT / SG_ROWS;  // lanes a row's softmax takes, in one group
const uint PART = BC / LPR;          // keys of a tile each of them takes
// Row strides in shared memory, each padded by 16 bytes so that the rows a matrix load or
// store touches fall in different banks (unpadded, the 128- and 256-byte strides put them all
// in the same ones; padding made the kernel 2.5x faster on an H100).
const uint KS = D + 8u;                      // K tile (and the queries staged whole), fp16
const uint VTS = BC + 8u;                    // V^T tile: a head dim's row of keys, fp16
const uint OS = CM_N + 4u;                   // a CM_M x CM_N piece of the output, fp32
const uint VB = V_IN_K ? 0u : BC * KS;       // where the V^T tile starts, in fp16 values

// K tile, then V^T tile, or V^T in K's place once the scores are done (V_IN_K: a tile twice as long
// in about the same space, for two more barriers a tile); the queries pass through the same space
// first, Q_DIMS head dims of the workgroup's WG_ROWS rows at a time: all D where they fit in the
// tiles' space, else the most of D / 2, D / 4 and D / 8 (multiples of 16: 2, 4 or 8 passes) that
// do (128-row workgroups, and some short tiles; a split block's always pass whole), else the
// least of them, or all D where none is a multiple of 16, the space grown to hold them. Past the
// tile's n keys each piece repeats its last key:
// those keys' scores are -inf (tile_softmax's `seen`), their weights exactly 0, so what K and V
// hold there is never used (zeros there cost a select a value where every tile but the last has
// none past it).
const uint KV_TILES = V_IN_K ? (BC * KS > DV * VTS ? BC * KS : DV * VTS)
                             : BC * KS + DV * VTS;  // fp16
// (selects of comparisons alone: with && and || among these constants, RADV's compiler crashed)
#define Q_FITS(dims) (((dims) % 16u == 0u ? WG_ROWS * ((dims) + 8u) : 0xffffffffu) <= KV_TILES)
#define Q_PASS(dims) ((dims) % 16u == 0u)
const uint Q_DIMS = SPLIT > 1u       ? D
                    : Q_FITS(D)      ? D
                    : Q_FITS(D / 2u) ? D / 2u
                    : Q_FITS(D / 4u) ? D / 4u
                    : Q_FITS(D / 8u) ? D / 8u
                    : Q_PASS(D / 8u) ? D / 8u
                    : Q_PASS(D / 4u) ? D / 4u
                    : Q_PASS(D / 2u) ? D / 2u
                                     : D;
const uint QS = Q_DIMS + 8u;  // a staged query row's stride, fp16
// (With Q_SHARED the queries stay in q_sh instead.)
const uint KV_SIZE = Q_SHARED ? KV_TILES : WG_ROWS * QS > KV_TILES ? WG_ROWS * QS : KV_TILES;
shared uvec4 kv_sh[KV_SIZE / 8u];

// Q and K eight fp16 values at a time, V four (d and dv are multiples of 16).
layout(std430, binding = B_Q) readonly buffer QBuf8 { uvec4 q8[]; };
layout(std430, binding = B_K) readonly buffer KBuf8 { uvec4 k8[]; };
layout(std430, binding = B_V) readonly buffer VBuf4 { uvec2 v4[]; };
// K and V are in fp16 or a block format (K_FORMAT, V_FORMAT; the host's Format::matrix_kv). Of a
// block format, a run of values is read as the words that hold them and their block's head, and
// decoded to fp16 as the tile is staged (formats.glsl's fmt_halves4); d and dv are then multiples
// of 32. A head of one half (two blocks' scales a word) is read alone, 16 bits, so that decoding
// needs only a value's place in its block (x & 31), which the staging knows from the head dim.
const bool K_HALF = K_FORMAT == FMT_F16, V_HALF = V_FORMAT == FMT_F16;
layout(std430, binding = B_K) readonly buffer KWords { uint k_w[]; };
layout(std430, binding = B_K) readonly buffer KPairs { uvec2 k_w2[]; };
layout(std430, binding = B_K) readonly buffer KHalves { uint16_t k_h[]; };
layout(std430, binding = B_V) readonly buffer VWords { uint v_w[]; };
layout(std430, binding = B_V) readonly buffer VHalves { uint16_t v_h[]; };
// The head of value x's block of K (of_k) or V (formats.glsl's kv_head_half): w0 and w1 as
// fmt_head takes them for an x whose bit 5 is clear (a head of one half: its own half alone).
uvec2 block_head(bool of_k, uint x) {
  uint fmt = of_k ? K_FORMAT : V_FORMAT, halves = FMT_HEAD_HALVES(fmt);
  uint at = kv_head_half(fmt, x, of_k ? k_count() : v_count());
  if (halves == 1u) return uvec2(of_k ? uint(k_h[at]) : uint(v_h[at]), 0u);
  uint w = at / 2u;
  return uvec2(of_k ? k_w[w] : v_w[w], halves > 2u ? (of_k ? k_w[w + 1u] : v_w[w + 1u]) : 0u);
}

// Phases a timing diagnostic leaves out (CM_SKIP's bits: ContextOptions::matrix_skip, by name;
// docs/performance.md), to tell where a GPU's time goes; the results are then wrong, as below.
// What a phase's results fed goes too where nothing else reads it (the compiler's doing):
//   staging  no K or V is read from memory: the tiles stored are zeros (so S = 0, O = 0)
//   scores   no Q K^T products (nor Q's matrices): S = 0, every seen key weighed alike
//   softmax  S is not read: P = 1 (nv2's kernel: P = S, unscaled and unmasked), the factors 1,
//            the rows' state as it started (FlashAttention-2: O = 0, LSE = -inf)
//   pv       no P V products, nor O's rescaling (nor the reads of P and the factors, nor nv2's
//            conversion of P): O = 0
//   prefetch no tile is fetched during the work on the one before it: each is fetched at the
//            start of its own (with V_IN_K, V too, stored once the scores are done). The results
//            are the same: it tells what the registers that hold the next tile cost (a GPU's
//            occupancy) against the loads' latency they hide
//   queries  Q's matrices are not held in registers from the first tile to the last: each
//            tile reads them from shared memory, where they stay (the host sets Q_SHARED: the
//            results are the same). It refuses it where q_sh does not fit (ContextImpl::
//            driver_constants)
const bool SKIP_STAGING = (CM_SKIP & 1u) != 0u;
const bool SKIP_SCORES = (CM_SKIP & 2u) != 0u;
const bool SKIP_SOFTMAX = (CM_SKIP & 4u) != 0u;
const bool SKIP_PV = (CM_SKIP & 8u) != 0u;
const bool SKIP_PREFETCH = (CM_SKIP & 16u) != 0u;
shared uvec4 q_sh[Q_SHARED ? WG_ROWS * KS / 8u : 1u];  // the queries, with Q_SHARED

#define CM_B_ARRAY kv_sh  // every right operand comes from the K/V tile
#include "coopmat.glsl"

// A group's scratch row: its S (BC fp32); a block's first group's also takes, over S, P (BC fp16)
// in its first BC / 2 words and the factors keep and coef (CM_N fp32 each; keep alone for
// FlashAttention-2) after them. With the softmax in matrices (nv2) no S nor P passes through it:
// a row is the factors' columns (out_scale's, at the end), over which the output's pieces go.
// (The host's coopmat_bytes counts the same.) end_rows() passes the state through it too.
#ifdef CM_FLASH2
const uint FACTORS = 1u;  // keep alone: FlashAttention-2's coef is 1
#else
const uint FACTORS = 2u;
#endif
#ifdef CM_ROW_OPS  // (coopmat.glsl)
const uint FC = 0u;                     // where the factors start, in fp32
const uint SS = FACTORS * CM_N + 4u;
#else
const uint FC = BC / 2u;
const uint SS = (BC > FC + FACTORS * CM_N ? BC : FC + FACTORS * CM_N) + 4u;
#endif
shared uvec4 s_sh[NSG * SG_ROWS * SS / 4u];  // per group: S, P and the factors; the output

// The arrays of matrices a group keeps across a tile's phases (the tile's P and its output; with
// the softmax in matrices, the tile's scores and the rows' state) are indexed by literals alone,
// never by a loop's variable (as glslang writes an [[unroll]] loop, an index that only the
// driver's unrolling makes constant): where a driver indexes an array at run time it keeps it in
// memory, as NVIDIA's appeared to keep o_acc (local memory of o_acc's size at 9811b21: 128 B at
// d = 64 beside 234 registers, 256 B at 128 beside 255). CM_EACH(n, F) is F(k) for each literal k
// below n (at most 16: tiling.cpp checks the shapes), CM_AT(k, n) is k, clamped to 0 where k is
// past n in code that never runs (such an index crashed RADV's compiler). tests/spirv_test.cpp
// checks every build for matrix units. The queries, read in one loop (score_piece), are the
// exception: NVIDIA kept q_frag in registers. (An element of a matrix is another matter: CM_NV's
// cm_scale and cm_blend index them in loops over the driver's length.)
// Emulated (llvmpipe, which has no matrix types), CM_EACH is a loop: written out, the nv2
// stand-in's kernels took llvmpipe twice as long to compile (SoftmaxInMatrices: 75 s to 182 s);
// as a loop whose index is CM_AT's select, 4x less than [[unroll]] loops did (19 s).
#ifdef CM_EMULATE
#define CM_EACH(n, F) \
  for (uint cm_k = 0u; cm_k < (n); ++cm_k) { F(cm_k) }
#else
#define CM_EACH(n, F)                                                                 \
  if (0u < (n)) F(0u) if (1u < (n)) F(1u) if (2u < (n)) F(2u) if (3u < (n)) F(3u)     \
  if (4u < (n)) F(4u) if (5u < (n)) F(5u) if (6u < (n)) F(6u) if (7u < (n)) F(7u)     \
  if (8u < (n)) F(8u) if (9u < (n)) F(9u) if (10u < (n)) F(10u) if (11u < (n)) F(11u) \
  if (12u < (n)) F(12u) if (13u < (n)) F(13u) if (14u < (n)) F(14u) if (15u < (n)) F(15u)
#endif
#define CM_AT(k, n) ((k) < (n) ? (k) : 0u)
// (QD and OD are at most 8 CM_N, tiling.cpp's coopmat_whole_dims; BC at most 64; so 16 matrices
// in an array at most.) Row matrix r's matrices follow row matrix r - 1's in each array; where
// they would be more than 8 queries' (two row matrices past d = 64), Q_SHARED: none.
const uint Q_MATRICES = QD / 16u, P_MATRICES = BC / 16u, PIECES = OD / CM_N;
const uint RQ = RM * Q_MATRICES, RP = RM * P_MATRICES, RO = RM * PIECES;  // the arrays' lengths
CmA q_frag[RQ];      // the group's head dims of its block's queries, 16 a matrix
CmA p_frag[RP];      // the tile's P (step 2), 16 keys a matrix, as left operands of P V
CmAcc o_acc[RO];     // its columns of its block's output (unnormalised for FlashAttention-2)
CmAcc s_rows[RM];    // a CM_N-key piece of the tile's scores (step 1), a matrix a row matrix
CmAcc keep_m[RM], coef_m[RM];  // the tile's factors of step 3, a matrix a row matrix

uint lane() { return CM_LANE; }
uint sg() { return CM_GROUP; }
uint block() { return sg() / SPLIT; }  // the group's row block
uint part() { return sg() % SPLIT; }   // which 1 / SPLIT of the head dims it holds
// Where the block's scratch starts, in fp32 (its first group's: S, then P and the factors).
// (In s_sh's uvec4 elements, 4 fp32 each: SS, FC and OS are multiples of 4.)
uint block_scratch() { return (block() * SPLIT * SG_ROWS * SS) / 4u; }
uint group_scratch() { return (sg() * SG_ROWS * SS) / 4u; }  // the group's own
// The row of its block whose softmax (and state) is this lane's: a split block's groups take
// half of the rows each; of the row's keys in a tile, the lane takes PART from this one.
uint softmax_row() { return part() * (SG_ROWS / SPLIT) + lane() / LPR; }
uint lane_first_key() { return (lane() % LPR) * PART; }

// The shared-memory writes of a block's groups before it are seen by them after it.
void block_sync() {
  if (SPLIT == 1u) {
    cm_sync();
  } else {
    memoryBarrierShared();
    barrier();
  }
}
// x's maximum and sum over the LPR lanes of this lane's row.
float row_max(float x) {
  [[unroll]] for (uint m = 1u; m < LPR; m *= 2u) x = max(x, cm_xor(x, m));
  return x;
}
float row_sum(float x) {
  [[unroll]] for (uint m = 1u; m < LPR; m *= 2u) x += cm_xor(x, m);
  return x;
}

// The packed row (head in group, query) of local row r of this workgroup (see packed_row()).
Row local_row(uint r) {
  uint group = pc.heads / pc.kv_heads;
  uint b = workgroup_kv_head() / pc.kv_heads;
  uint hkv = workgroup_kv_head() % pc.kv_heads;
  uint packed = row_block() * WG_ROWS + r;
  bool valid = packed < group * pc.nq;
  uint hg = valid ? packed / pc.nq : 0u;
  uint i = valid ? packed % pc.nq : 0u;
  return make_row(b, hkv * group + hg, i, valid);
}

// The workgroup's query row r (rows past the problem are zeros), piece t (8 head dims).
uvec4 query_piece(uint r, uint t) {
  Row row = local_row(r);
  return row.valid ? q8[q_at(row.bh, row.i) / 8u + t] : uvec4(0u);
}

// Where row matrix r's head dims 16 k .. of the group's queries start, staged whole (in kv_sh, or
// q_sh), in uvec4 elements.
uint query_matrix(uint r, uint k) {
  return ((block() * SG_ROWS + r * CM_M) * KS + part() * QD + k * 16u) / 8u;
}

// Head dims x0 .. x0 + Q_DIMS - 1 of the workgroup's queries staged in kv_sh, and each group's
// matrices of them loaded (where Q_DIMS < D: SPLIT is 1). Every group loads in each pass (in
// passes of rows, with a test of which were a group's, RADV spilled the kernel).
void load_query_dims(uint x0) {
  const uint PIECES = WG_ROWS * Q_DIMS / 8u;  // 8 head dims each
  if (x0 > 0u) barrier();  // every group has its matrices from the pass before
  [[unroll]] for (uint i = 0u; i < (PIECES + WG - 1u) / WG; ++i) {
    uint e = gl_LocalInvocationID.x + i * WG, r = e / (Q_DIMS / 8u), t = e % (Q_DIMS / 8u);
    if (PIECES % WG == 0u || e < PIECES) kv_sh[r * QS / 8u + t] = query_piece(r, x0 / 8u + t);
  }
  barrier();
  [[unroll]] for (uint r = 0u; r < RM; ++r)
    [[unroll]] for (uint k = 0u; k < (Q_DIMS < QD ? Q_DIMS : QD) / 16u; ++k)
      cm_load_a(q_frag[r * Q_MATRICES + x0 / 16u + k], kv_sh,
                ((block() * SG_ROWS + r * CM_M) * QS + k * 16u) / 8u, QS / 8u);
}

// Stages the workgroup's queries in kv_sh and loads each group's rows and dims as matrices:
// all at once where they fit (its own loop, as before passes: through load_query_dims RADV gave
// the kernel 224 (d = 64) and 515 (d = 128) more instructions, and with that loop not unrolled
// spilled it), else Q_DIMS head dims at a time. Q_SHARED: stages them all in q_sh, where the
// tiles read them.
void load_queries() {
  if (Q_SHARED || Q_DIMS == D) {
    for (uint e = gl_LocalInvocationID.x; e < WG_ROWS * D / 8u; e += WG) {
      uint r = e / (D / 8u), t = e % (D / 8u);
      if (Q_SHARED)
        q_sh[r * KS / 8u + t] = query_piece(r, t);
      else
        kv_sh[r * KS / 8u + t] = query_piece(r, t);
    }
    barrier();
    if (Q_SHARED) return;
    [[unroll]] for (uint i = 0u; i < RQ; ++i)
      cm_load_a(q_frag[i], kv_sh, query_matrix(i / Q_MATRICES, i % Q_MATRICES), KS / 8u);
    return;
  }
  [[unroll]] for (uint x0 = 0u; x0 < D; x0 += Q_DIMS) load_query_dims(x0);  // 2, 4 or 8
}

// A tile's K and V as each invocation fetches them: the next tile is fetched into registers
// while the current one is worked on, so its loads are in flight during the products instead of
// before them. K by 16-byte pieces of its rows (KF of them). V by items of 8 keys' same 4 head
// dims (VQ of them, 8 bytes a key), which go into V^T as 4 runs of 8 keys (16-byte stores). Lanes
// take 2 to a 16-byte piece, then other keys, then other pieces: a load's 32 lanes read 64
// contiguous bytes of each of 4 keys at 32 keys a tile (all 32-byte sectors whole), and the 8
// lanes of a 16-byte store pass write other banks (at 16 keys, 2 to a bank: pieces 8 head dims
// apart, 8 VTS fp16, a multiple of 128 bytes, write the same ones). In a block format a piece or
// a key of an item is the words that hold its values and its block's head (k_run, v_run).
const uint KF = (BC * D / 8u + WG - 1u) / WG;
const uint VG = BC / 8u;                              // 8-key groups of a tile
const uint VITEMS = VG * DV / 4u;                     // items of a tile
const uint VQ = (VITEMS + WG - 1u) / WG;              // items an invocation fetches
uvec4 k_next[KF];       // a piece: its 8 values as fp16; or their words and their block's head
uvec3 v_next[8u * VQ];  // a key of an item: its 4 values as fp16 (xy); or their word and head

// As fetched: piece t of K's row (its head dims 8 t .. 8 t + 7), and V's row's head dims dim ..
// dim + 3 (dim a multiple of 4).
uvec4 k_run(uint row, uint t) {
  if (K_HALF) return k8[row * (D / 8u) + t];
  uint x = row * D + t * 8u;
  return uvec4(k_w2[kv_word(K_FORMAT, x) / 2u], block_head(true, x));
}
uvec3 v_run(uint row, uint dim) {
  if (V_HALF) return uvec3(v4[row * (DV / 4u) + dim / 4u], 0u);
  uint x = row * DV + dim;
  return uvec3(v_w[kv_word(V_FORMAT, x)], block_head(false, x));
}

// V item e: its first head dim and key group.
void v_item(uint e, out uint dim, out uint g) {
  g = (e / 2u) % VG;
  dim = (e / 2u / VG) * 8u + (e % 2u) * 4u;
}

// Keys j0 .. j0 + n - 1 (n > 0) of this workgroup's K/V head into k_next and v_next, and the
// last of them where a piece is past them (see KV_TILES). Nothing reads what a
// load gave until store_tile, on the next tile: a load under a condition, or its value chosen
// here, was waited for at once (RADV), so that the loads overlapped neither each other nor the
// products. Where WG does not divide the V items (d = 64, 80, 96 at 32 keys), invocations
// past them skip their last item: those loads stay under a condition that differs between lanes.
void fetch_v(uint kv_base, uint j0, uint n) {
  [[unroll]] for (uint i = 0u; i < VQ; ++i) {
    uint e = gl_LocalInvocationID.x + i * WG, dim, g;
    if (VITEMS % WG != 0u && e >= VITEMS) continue;  // (store_tile skips it)
    v_item(e, dim, g);
    [[unroll]] for (uint q = 0u; q < 8u; ++q) {
      uint row = key_row(kv_base, j0 + min(g * 8u + q, n - 1u));
      v_next[i * 8u + q] = SKIP_STAGING ? uvec3(0u) : v_run(row, dim);
    }
  }
}
void fetch_k(uint kv_base, uint j0, uint n) {
  [[unroll]] for (uint i = 0u; i < KF; ++i) {
    uint e = gl_LocalInvocationID.x + i * WG;
    uint c = min(e / (D / 8u), n - 1u);
    k_next[i] = SKIP_STAGING ? uvec4(0u) : k_run(key_row(kv_base, j0 + c), e % (D / 8u));
  }
}
void fetch_tile(uint kv_base, uint j0, uint n) {
  fetch_v(kv_base, j0, n);
  fetch_k(kv_base, j0, n);
}

// The fetched runs as fp16, decoded where K or V is in a block format (zeros stay zeros: a head
// of 0 scales every value to 0): K's piece i, and V's key `at` of an item whose first head dim
// is dim. A run's place in its block is its first head dim's (d and dv are multiples of 32).
uvec4 k_halves(uint i) {
  if (K_HALF) return k_next[i];
  uvec4 r = k_next[i];
  uint x = (gl_LocalInvocationID.x + i * WG) % (D / 8u) * 8u % 32u;
  return uvec4(fmt_halves4(K_FORMAT, x, r.x, r.z, r.w),
               fmt_halves4(K_FORMAT, x + 4u, r.y, r.z, r.w));
}
uvec2 v_halves(uint at, uint dim) {
  if (V_HALF) return v_next[at].xy;
  return fmt_halves4(V_FORMAT, dim % 32u, v_next[at].x, v_next[at].y, v_next[at].z);
}

// Keys 2 p and 2 p + 1 of an item's 8 keys' head dim h (0 .. 3), as one word of fp16 values.
uint v_pair(uvec2 keys[8], uint p, uint h) {
  uint lo = keys[p * 2u][h / 2u];
  uint hi = keys[p * 2u + 1u][h / 2u];
  return h % 2u == 0u ? (lo & 0xffffu) | (hi << 16u) : (lo >> 16u) | (hi & 0xffff0000u);
}

// The fetched tile into kv_sh. Where the invocations share the
// pieces evenly (WG divides them, as K's do in every shape at d = 128), no invocation skips
// any: the test folds away once the constants are known, and with it the branch, at whose end
// RADV waited for each store.
void store_k() {
  [[unroll]] for (uint i = 0u; i < KF; ++i) {
    uint e = gl_LocalInvocationID.x + i * WG, c = e / (D / 8u);
    if ((BC * D / 8u) % WG == 0u || e < BC * D / 8u)
      kv_sh[c * KS / 8u + e % (D / 8u)] = k_halves(i);
  }
}
void store_v() {
  [[unroll]] for (uint i = 0u; i < VQ; ++i) {
    uint e = gl_LocalInvocationID.x + i * WG, dim, g;
    v_item(e, dim, g);
    if (VITEMS % WG != 0u && e >= VITEMS) continue;
    uvec2 keys[8];
    [[unroll]] for (uint q = 0u; q < 8u; ++q) keys[q] = v_halves(i * 8u + q, dim);
    [[unroll]] for (uint h = 0u; h < 4u; ++h)  // head dim dim + h, keys 8 g .. 8 g + 7
      kv_sh[(VB + (dim + h) * VTS) / 8u + g] = uvec4(v_pair(keys, 0u, h), v_pair(keys, 1u, h),
                                                     v_pair(keys, 2u, h), v_pair(keys, 3u, h));
  }
}
// K, and V^T unless it goes over K once the scores are done (V_IN_K: v_turn).
void store_tile() {
  store_k();
  if (!V_IN_K) store_v();
}
// With V in K's place (V_IN_K): V^T goes over K once every group has its scores (from
// accumulate(), before the P V products; uniform flow).
void v_turn() {
  if (!V_IN_K) return;
  barrier();  // every group is done with K
  store_v();
  barrier();
}

// Step 1: this group's part of its block's scores against the tile (over its head dims),
// unscaled, into its scratch.
// Row matrix r's scores of head dims 16 k .. against K^T's matrix kt, into acc.
void add_scores(inout CmAcc acc, uint r, uint k, CmBt kt) {
  if (Q_SHARED) {
    CmA qa;
    cm_load_a(qa, q_sh, query_matrix(r, k), KS / 8u);
    cm_mul_add(acc, qa, kt);
  } else {
    cm_mul_add(acc, q_frag[r * Q_MATRICES + k], kt);
  }
}

// The group's scores (its part of the head dims) for the tile's keys n CM_N .. n CM_N + CM_N - 1,
// into s_rows: each of K^T's matrices read from shared memory once for the RM row matrices.
// (A loop: written out by literal indices, as the kept matrices are, RADV's compiler held twice
// the queries' registers and spilled at d = 128.)
void score_piece(uint n) {
#define ZERO_ROWS(r) cm_zero(s_rows[CM_AT(r, RM)]);
  CM_EACH(RM, ZERO_ROWS)
  if (SKIP_SCORES) return;
  [[unroll]] for (uint k = 0u; k < Q_MATRICES; ++k) {
    CmBt kt;  // K^T: dims down, keys across
    cm_load_bt(kt, kv_sh, (n * CM_N * KS + part() * QD + k * 16u) / 8u, KS / 8u);
#define SCORE_ROWS(r) add_scores(s_rows[CM_AT(r, RM)], r, k, kt);
    CM_EACH(RM, SCORE_ROWS)
  }
}

void tile_scores() {
  [[unroll]] for (uint n = 0u; n < BC / CM_N; ++n) {
    score_piece(n);
#define STORE_ROWS(r)                                                                       \
  cm_store(s_rows[CM_AT(r, RM)], s_sh, group_scratch() + ((r) * CM_M * SS + n * CM_N) / 4u, \
           SS / 4u);
    CM_EACH(RM, STORE_ROWS)
  }
  block_sync();
}

// The variant's recurrence (the same hooks the fused kernels call), on this lane's row (its LPR
// lanes hold the same state).
#if defined(CM_FLASHD)
#include "flashd_step.glsl"
#elif defined(CM_FLASH1)
#include "flash1_step.glsl"
#else
#include "flash2_step.glsl"
#endif

// This lane's row's factors (keep alone for FlashAttention-2), each over CM_N / LPR of its CM_N
// columns in the block's scratch (CM_N / 4 words, a multiple of LPR in every shape).
void write_factors(float keep, float coef) {
  const uint words = CM_N / 4u / LPR;
  uint f_base = block_scratch() + (softmax_row() * SS + FC) / 4u + (lane() % LPR) * words;
  [[unroll]] for (uint w = 0u; w < words; ++w) {
    s_sh[f_base + w] = floatBitsToUint(vec4(keep));
#ifndef CM_FLASH2
    s_sh[f_base + CM_N / 4u + w] = floatBitsToUint(vec4(coef));
#endif
  }
}

// The additive mask's entries (MOD_MASK) of this lane's keys of a tile, fetched before the
// tile's scores so that their loads are in flight during the Q K^T products, 4 keys a load:
// read where the softmax uses them, each under its key's `seen`, they were waited for there. A
// mask row is mask_stride() words (a multiple of 4) from pc.mask_values (a multiple of 64:
// modifiers.cpp); past its end the last tile reads the row's last 4 again (keys never seen).
layout(std430, binding = B_Tables) readonly buffer Tables4 { uvec4 table4[]; };
vec4 mask4[PART / 4u];
void fetch_mask(uint j0) {
  if ((MODS & MOD_MASK) == 0u || SKIP_SOFTMAX) return;
  uint first = lane_first_key();
  uint row_at = (pc.mask_values + mask_row_start(0u)) / 4u;
  uint last = mask_stride() / 4u - 1u;
  [[unroll]] for (uint c4 = 0u; c4 < PART / 4u; ++c4)
    mask4[c4] = uintBitsToFloat(table4[row_at + min((j0 + first) / 4u + c4, last)]);
}

// Step 2 left out (SKIP_SOFTMAX): P = 1 for the lane's keys, the factors 1; no rescaling.
bool skip_softmax() {
  uint first = lane_first_key();
  uint p_at = softmax_row() * SS + first / 2u;
  [[unroll]] for (uint c = 0u; c < PART; c += 2u) {
    uint at = p_at + c / 2u;
    s_sh[block_scratch() + at / 4u][at % 4u] = 0x3c003c00u;  // two fp16 1.0
  }
  write_factors(1.0, 1.0);
  block_sync();
  return false;
}

// Step 2: the row's scores of keys j0.. (n in the tile), the parts added, the recurrence, then
// over the block's first S P and the factors of step 3 (o <- o * keep + coef * (P V)); returns
// whether step 3 must scale O by keep (the same in the group). `inner`:
// every key of the tile is inside every valid row's range (rows past the problem then see the
// keys too, harmlessly: their output is never written). main() calls a copy for each, inlined
// with the constant, so that inner tiles test no key: in a causal walk over consecutive queries
// of one head, all but the WG_ROWS / BC or so at the diagonal (GQA rows that wrap into the next
// head, or a window narrower than the rows, leave few). Emulated, one copy, which tests `inner`
// at run time.
bool tile_softmax(uint j0, uint n, bool inner) {
  if (SKIP_SOFTMAX) return skip_softmax();
  uint first = lane_first_key();
  uint s_at = block_scratch() + (softmax_row() * SS + first) / 4u;  // first: a multiple of 4
  // Every score is read first, 4 at a time (PART is a multiple of 4): read where each is used,
  // a score a load, RADV waited for each load in turn.
  vec4 dots[PART / 4u];
  [[unroll]] for (uint c = 0u; c < PART / 4u; ++c) {
    dots[c] = vec4(0.0);
    [[unroll]] for (uint g = 0u; g < SPLIT; ++g)
      dots[c] += uintBitsToFloat(s_sh[s_at + g * SG_ROWS * SS / 4u + c]);
  }
  // The lane's keys its row sees by its range (in_row_keys) and the tile's n, as the lane's
  // c in [c_lo, c_lo + width): one comparison a key where key_visible and the tile's end took
  // three and two ANDs (RADV).
  int base = int(j0 + first);
  int lo = max(int(rows[0].key_begin), base) - base;
  int hi = min(int(rows[0].key_end), int(j0 + n)) - base;
  uint c_lo = uint(lo), width = uint(max(hi - lo, 0));
  float s[PART];
  bool seen[PART];
  float m_loc = NEG_INF;
  [[unroll]] for (uint c = 0u; c < PART; ++c) {
    uint j = j0 + first + c;
    seen[c] = inner || c - c_lo < width;  // (c < c_lo wraps past width)
    if (KEY_MASK) seen[c] = seen[c] && key_visible(0u, j);
    float x = dots[c / 4u][c % 4u] * pc.scale;
    s[c] = (MODS & MOD_MASK) != 0u ? row_score_fetched(0u, j, seen[c], x, mask4[c / 4u][c % 4u])
                                   : row_score(0u, j, seen[c], x);
    m_loc = max(m_loc, s[c]);
  }
  cm_sync();  // the row's scores are read (by its lanes, all in this group) before P goes over them
  float ref = tile_ref(0u, row_max(m_loc));  // FLASH-D: the tile's own max; else the running one
  uint p_at = softmax_row() * SS + first / 2u;  // in the block's scratch, in fp32: 2 fp16 each
  float l_loc = 0.0;
  float p[PART];
  const float LOG2E = 1.4426950408889634;
  float ref2 = ref * LOG2E;  // e^(s - ref) as 2^(s log2(e) - ref log2(e)): one FMA a score
  [[unroll]] for (uint c = 0u; c < PART; ++c) {
    // exp(-inf) spelled out as 0, from `seen` where only it hides keys (a seen score is then
    // finite, and so is ref)
    bool hidden = SCORE_MAY_HIDE ? s[c] == NEG_INF : !seen[c];
    p[c] = hidden ? 0.0 : exp2(fma(s[c], LOG2E, -ref2));
    l_loc += p[c];
  }
  if (PART % 8u == 0u) {  // whole uvec4s (first / 2 is a multiple of 4)
    [[unroll]] for (uint c = 0u; c < PART; c += 8u)
      s_sh[block_scratch() + (p_at + c / 2u) / 4u] =
          uvec4(packHalf2x16(vec2(p[c], p[c + 1u])), packHalf2x16(vec2(p[c + 2u], p[c + 3u])),
                packHalf2x16(vec2(p[c + 4u], p[c + 5u])), packHalf2x16(vec2(p[c + 6u], p[c + 7u])));
  } else {
    [[unroll]] for (uint c = 0u; c < PART; c += 2u) {
      uint at = p_at + c / 2u;
      s_sh[block_scratch() + at / 4u][at % 4u] = packHalf2x16(vec2(p[c], p[c + 1u]));
    }
  }
  float keep, coef;
  tile_step(0u, ref, row_sum(l_loc), keep, coef);
  write_factors(keep, coef);
  block_sync();
  // Whether step 3 must scale O (FlashAttention-2's keep, whose other factor coef is 1): not
  // where no valid row of the block moved its max (keep exactly 1: a causal or long walk's
  // later tiles, mostly). A split block's other rows are another group's: it always does.
  return SPLIT > 1u || cm_any(rows[0].valid && keep != 1.0);
}

// acc += the CM_N columns of P V from the group's column CM_N nv, of the tile's keys 16 kc ..
// 16 kc + 15 (p: their weights, p_frag[kc]).
void add_pv_keys(inout CmAcc acc, uint nv, uint kc, CmA p) {
  CmBt vt;  // keys down, head dims across: V^T's rows, transposed
  cm_load_bt(vt, kv_sh, (VB + (part() * OD + nv * CM_N) * VTS + kc * 16u) / 8u, VTS / 8u);
  cm_mul_add(acc, p, vt);
}
// ... of all the tile's keys.
void add_pv(inout CmAcc acc, uint nv) {
#define PV_KEYS(k) add_pv_keys(acc, nv, k, p_frag[CM_AT(k, RP)]);
  CM_EACH(P_MATRICES, PV_KEYS)
}
// The same for two row matrices (RM = 2), into a0 and a1, each of V^T's matrices read once for
// both (p0, p1: p_frag[kc] and p_frag[P_MATRICES + kc]). (One function for both, its second
// matrix under a test of RM, gave RADV 3% more instructions and 17% more latency at RM = 1.)
void add_pv_keys2(inout CmAcc a0, inout CmAcc a1, uint nv, uint kc, CmA p0, CmA p1) {
  CmBt vt;
  cm_load_bt(vt, kv_sh, (VB + (part() * OD + nv * CM_N) * VTS + kc * 16u) / 8u, VTS / 8u);
  cm_mul_add(a0, p0, vt);
  cm_mul_add(a1, p1, vt);
}
void add_pv2(inout CmAcc a0, inout CmAcc a1, uint nv) {
#define PV_KEYS2(k) \
  add_pv_keys2(a0, a1, nv, k, p_frag[CM_AT(k, RP)], p_frag[CM_AT(P_MATRICES + (k), RP)]);
  CM_EACH(P_MATRICES, PV_KEYS2)
}

// Step 3: O <- O * keep + coef * P V on the accumulators (P in p_frag, the factors in keep_m
// and coef_m), one CM_N-column piece at a time, for each row matrix; FlashAttention-2's O is
// scaled only where `rescale` says (else keep is 1). Row matrix r's piece nv is o_acc[r PIECES +
// nv]; with one, add_pv2's second matrix (o_acc[0] again) is in code that never runs.
void accumulate(bool rescale) {
  v_turn();
  if (SKIP_PV) return;
#ifdef CM_FLASH2
  // One branch around every piece's scaling: one a piece, RADV ran the products and selected.
#define SCALE_PIECE(i) cm_scale(o_acc[CM_AT(i, RO)], keep_m[CM_AT((i) / PIECES, RM)]);
#define ADD_PV_PIECE(k)                                              \
  if (RM == 1u) {                                                    \
    add_pv(o_acc[CM_AT(k, RO)], k);                                  \
  } else {                                                           \
    add_pv2(o_acc[CM_AT(k, RO)], o_acc[CM_AT(PIECES + (k), RO)], k); \
  }
  if (rescale) {
    CM_EACH(RO, SCALE_PIECE)
  }
  CM_EACH(PIECES, ADD_PV_PIECE)  // coef is 1
#else
#define BLEND_PIECE(k)                                                     \
  {                                                                        \
    CmAcc pv0, pv1;                                                        \
    cm_zero(pv0);                                                          \
    if (RM == 1u) {                                                        \
      add_pv(pv0, k);                                                      \
    } else {                                                               \
      cm_zero(pv1);                                                        \
      add_pv2(pv0, pv1, k);                                                \
      cm_blend(o_acc[CM_AT(PIECES + (k), RO)], keep_m[CM_AT(1u, RM)], pv1, \
               coef_m[CM_AT(1u, RM)]);                                     \
    }                                                                      \
    cm_blend(o_acc[CM_AT(k, RO)], keep_m[0], pv0, coef_m[0]);              \
  }
  CM_EACH(PIECES, BLEND_PIECE)
#endif
}

// Step 3 after step 2: P and the factors from the block's scratch (row matrix r's rows r CM_M ..).
void tile_accumulate(bool rescale) {
  uint f = block_scratch();
#ifdef CM_FLASH2
#define LOAD_FACTORS(r)                                                                           \
  if (rescale) cm_load_acc(keep_m[CM_AT(r, RM)], s_sh, f + ((r) * CM_M * SS + FC) / 4u, SS / 4u);
#else
#define LOAD_FACTORS(r)                                                                       \
  {                                                                                           \
    cm_load_acc(keep_m[CM_AT(r, RM)], s_sh, f + ((r) * CM_M * SS + FC) / 4u, SS / 4u);        \
    cm_load_acc(coef_m[CM_AT(r, RM)], s_sh, f + ((r) * CM_M * SS + FC + CM_N) / 4u, SS / 4u); \
  }
#endif
  CM_EACH(RM, LOAD_FACTORS)
  // P's rows are SS fp32 apart, 2 SS fp16
#define LOAD_P(i)                                                                 \
  cm_load_a(p_frag[CM_AT(i, RP)], s_sh, f + ((i) / P_MATRICES * CM_M * SS) / 4u + \
            (i) % P_MATRICES * 2u, SS / 4u);
  CM_EACH(RP, LOAD_P)
  accumulate(rescale);
}

#ifdef CM_ROW_OPS
// The softmax in accumulator matrices (VK_NV_cooperative_matrix2's row operations, or their
// stand-in): steps 1 to 3 without the scratch. A block is one group (SPLIT = 1, CM_N = 16: the
// host asks for nothing else), whose tile scores stay in accumulators: the score hook runs on
// each element with its row and key (cm_each), the rows' max and sum are row reductions, and the
// recurrence's state is a matrix per state word (STATE_WORDS) holding each row's value in every
// element of its row, so that the variant's own hooks (tile_ref, tile_step) run element by
// element on the state of the element's row, through the invocation's rows[0] and its state
// slot 0. P becomes the left operand of P V by conversion.
shared Row rows_sh[WG_ROWS];   // the workgroup's rows, for the hooks of any row of a block
CmAcc row_state[STATE_WORDS];  // the rows' state, a word a matrix
const uint S_PIECES = BC / CM_N;  // a tile's CM_N-key pieces, at most 4 (CM_N is 16 here)
CmAcc s_tile[S_PIECES];           // the tile's scores

// Row r of this group's block as rows[0] (main() sets the lane's own row again for finish()).
// cm_each's functions run in no set order, perhaps more than once (VK_NV_cooperative_matrix2),
// so each sets rows[0] before the hooks read it, and what follows a cm_each in the key loop
// (tile_ref, tile_step, accumulate) reads no field of rows[0]: after it, rows[0] is any row.
void use_block_row(uint r) { rows[0] = rows_sh[block() * SG_ROWS + r]; }

// Whether a score in an inner tile needs nothing of its row: no key mask, and a score hook that
// reads none (modifiers.glsl).
const bool ROWLESS_SCORES = !KEY_MASK && !SCORE_READS_ROW;
const uint CM_INNER = 0xffffffffu;  // cm_score's n in an inner tile (tile_softmax's `inner`)

// Element (r, c) of a tile's piece of scores whose first key is j0, n of its keys in the tile
// (CM_INNER: an inner tile, where no valid row's range hides a key; rows past the problem then
// see the keys too, harmlessly). An inner tile with ROWLESS_SCORES reads no row: on the matrix
// units, a row's fields from shared memory for every element.
float cm_score(const in uint r, const in uint c, const in float x, const in uint j0,
               const in uint n) {
  uint j = j0 + c;
  if (ROWLESS_SCORES && n == CM_INNER) return modify_score(0u, j, x * pc.scale);
  use_block_row(r);
  return row_score(0u, j, c < n && key_visible(0u, j), x * pc.scale);
}

// Row r's state word k before its first key.
float cm_start(const in uint r, const in uint c, const in float x, const in uint k,
               const in uint unused) {
  use_block_row(r);
  state_start(0u);
  return state_word(0u, k);
}

// The state of element i's row into slot 0, and back.
void load_state(int i) {
#define LOAD_WORD(k) set_state_word(0u, k, CM_EL(row_state[CM_AT(k, STATE_WORDS)], i));
  CM_EACH(STATE_WORDS, LOAD_WORD)
}
void save_state(int i) {
#define SAVE_WORD(k) CM_EL(row_state[CM_AT(k, STATE_WORDS)], i) = state_word(0u, k);
  CM_EACH(STATE_WORDS, SAVE_WORD)
}

// Row r's state word k in every element of its row of w.
void start_word(uint k, out CmAcc w) {
  cm_zero(w);
  cm_each(w, w, cm_start, k, 0u);
}
void start_rows() {
  for (uint r = gl_LocalInvocationID.x; r < WG_ROWS; r += WG) rows_sh[r] = local_row(r);
  barrier();
#define START_WORD(k) start_word(k, row_state[CM_AT(k, STATE_WORDS)]);
  CM_EACH(STATE_WORDS, START_WORD)
}

// Piece c of the tile's scores (its keys j0 + c CM_N ..) into sc, each through the score hook,
// and its rows' max into mx (over pieces 0 .. c).
void piece_scores(uint c, out CmAcc sc, inout CmAcc mx, uint j0, uint n, bool inner) {
  score_piece(c);
  sc = s_rows[0];
  uint in_piece = inner ? CM_INNER : n > c * CM_N ? n - c * CM_N : 0u;
  cm_each(sc, sc, cm_score, j0 + c * CM_N, in_piece);
  CmAcc m;
  cm_row_max(m, sc);
  if (c == 0u) {
    mx = m;
  } else {
    [[unroll]] for (int i = 0; i < cm_len(m); ++i) CM_EL(mx, i) = max(CM_EL(mx, i), CM_EL(m, i));
  }
}

// Piece c's weights e^(s - ref) as a left operand of P V, and their rows' sum into sum (over
// pieces 0 .. c).
void piece_weights(uint c, CmAcc sc, out CmA pa, CmAcc ref, inout CmAcc sum) {
  [[unroll]] for (int i = 0; i < cm_len(ref); ++i) {
    float x = CM_EL(sc, i);
    CM_EL(sc, i) = x == NEG_INF ? 0.0 : exp(x - CM_EL(ref, i));  // exp(-inf) spelled out
  }
  CmAcc l;
  cm_row_sum(l, sc);
  if (c == 0u) {
    sum = l;
  } else {
    [[unroll]] for (int i = 0; i < cm_len(l); ++i) CM_EL(sum, i) += CM_EL(l, i);
  }
  cm_to_a(pa, sc);
}

// Keys j0.. (n in the tile): the scores, the softmax and the recurrence, then O. `inner` as
// tile_softmax's.
void tile_row_ops(uint j0, uint n, bool inner) {
  CmAcc mx, sum, ref, keep, coef;
  if (SKIP_SOFTMAX) {  // P = S, the factors 1
#define SKIPPED_PIECE(k)                              \
  {                                                   \
    score_piece(k);                                   \
    cm_to_a(p_frag[CM_AT(k, P_MATRICES)], s_rows[0]); \
  }
    CM_EACH(S_PIECES, SKIPPED_PIECE)
    cm_zero(keep);
    [[unroll]] for (int i = 0; i < cm_len(keep); ++i) CM_EL(keep, i) = 1.0;
    keep_m[0] = keep;
    coef_m[0] = keep;
    accumulate(false);
    return;
  }
#define SCORES_PIECE(k) piece_scores(k, s_tile[CM_AT(k, S_PIECES)], mx, j0, n, inner);
  CM_EACH(S_PIECES, SCORES_PIECE)
  [[unroll]] for (int i = 0; i < cm_len(mx); ++i) {  // FLASH-D: the tile's own max
    load_state(i);
    CM_EL(ref, i) = tile_ref(0u, CM_EL(mx, i));
  }
#define WEIGHTS_PIECE(k) \
  piece_weights(k, s_tile[CM_AT(k, S_PIECES)], p_frag[CM_AT(k, P_MATRICES)], ref, sum);
  CM_EACH(S_PIECES, WEIGHTS_PIECE)
  [[unroll]] for (int i = 0; i < cm_len(ref); ++i) {
    load_state(i);
    float k_i, c_i;
    tile_step(0u, CM_EL(ref, i), CM_EL(sum, i), k_i, c_i);
    CM_EL(keep, i) = k_i;
    CM_EL(coef, i) = c_i;
    save_state(i);
  }
  keep_m[0] = keep;
  coef_m[0] = coef;
  accumulate(true);
}

// State word k of the lane's row from w (its row's value in every element), through the group's
// scratch.
void end_word(uint k, CmAcc w) {
  cm_store(w, s_sh, group_scratch(), SS / 4u);
  cm_sync();
  set_state_word(0u, k, uintBitsToFloat(s_sh[group_scratch() + softmax_row() * SS / 4u].x));
  cm_sync();  // read before the next word overwrites it
}

// The lane's own row and its state (from row_state, through the group's scratch), as the other
// flow leaves them for finish().
void end_rows(Row own) {
  rows[0] = own;
#define END_WORD(k) end_word(k, row_state[CM_AT(k, STATE_WORDS)]);
  CM_EACH(STATE_WORDS, END_WORD)
}
#endif

// The keys this workgroup walks (its chunk for splitkv), from the union of those its rows see.
void key_range(out uint begin, out uint end) {
  uint lo, hi;
  rows_key_union(lo, hi);
  workgroup_keys(lo, hi);
  walk_bounds(lo, hi, begin, end);
}

// Where a row's output (or, for splitkv, its chunk's part: normalised o', m and d') starts.
uint output_at(Row row) {
#ifdef SPLIT_KV
  return ((row.bh * pc.nq + row.i) * pc.splits + gl_WorkGroupID.z) * DV;
#else
  return o_at(row.bh, row.i);
#endif
}

// Output piece nv (o, its columns CM_N nv ..) through the group's scratch, at `at` there: this
// lane's 8 values of its row, times mul, to the row's output from `base` (where the row is valid).
void write_piece(CmAcc o, uint nv, uint at, float mul, uint base, bool valid) {
  cm_store(o, s_sh, group_scratch(), OS / 4u);
  cm_sync();
  [[unroll]] for (uint e = 0u; e < 8u; ++e) {
    float x = uintBitsToFloat(s_sh[at + e / 4u][e % 4u]) * mul;
#ifdef SPLIT_KV
    if (valid) scratch1[base + nv * CM_N + e] = x;
#else
    if (valid) o_buf[base + nv * CM_N + e] = x;
#endif
  }
  cm_sync();  // read before the next piece overwrites it
}

// The output, times its row's out_scale, from the accumulators through the group's scratch: each
// lane writes 8 values of row lane / CM_LPG of each row matrix a piece (CM_M * CM_N = 8 *
// SUBGROUP). Called by every lane in uniform flow.
void finish() {
  block_sync();  // the last tile's P and factors are read before out_scale overwrites them
  write_factors(out_scale(0u), 0.0);  // by the lanes that hold the row's state
  block_sync();
  uint r = lane() / CM_LPG, col = (lane() % CM_LPG) * 8u;
  float mul[RM];  // row r of each row matrix: its out_scale, where its output starts, its validity
  uint base[RM];
  bool valid[RM];
  [[unroll]] for (uint m = 0u; m < RM; ++m) {
    mul[m] = uintBitsToFloat(s_sh[block_scratch() + ((m * CM_M + r) * SS + FC) / 4u].x);
    Row row = local_row(block() * SG_ROWS + m * CM_M + r);
    base[m] = output_at(row) + part() * OD + col;
    valid[m] = row.valid;
  }
  block_sync();  // read before the pieces overwrite it
  uint at = group_scratch() + (r * OS + col) / 4u;
#define WRITE_PIECE(i)                                                                      \
  write_piece(o_acc[CM_AT(i, RO)], (i) % PIECES, at, mul[(i) / PIECES], base[(i) / PIECES], \
              valid[(i) / PIECES]);
  CM_EACH(RO, WRITE_PIECE)
  // The row's state, from the first of the lanes that ran its softmax.
  Row own = rows[0];
  if (!own.valid || lane() % LPR != 0u) return;
#ifdef SPLIT_KV
  uint state = output_at(own) / DV * 2u;
  scratch2[state] = m_run[0];
  scratch2[state + 1u] = l_run[0];
#else
  if ((pc.flags & FLAG_LSE) != 0u) lse_buf[own.bh * pc.nq + own.i] = row_lse(0u);
#endif
}

void main() {
  Row row = local_row(block() * SG_ROWS + softmax_row());
  rows[0] = row;
  state_start(0u);
#define ZERO_PIECE(k) cm_zero(o_acc[CM_AT(k, RO)]);
  CM_EACH(RO, ZERO_PIECE)
#ifdef CM_ROW_OPS
  start_rows();
  rows[0] = row;  // (cm_start went through the block's rows)
#endif
  load_queries();
  uint begin, end;
  key_range(begin, end);  // its barriers also keep kv_sh's queries until all are loaded
  uint inner_lo, inner_hi;  // the keys of the inner tiles (tile_softmax, tile_row_ops)
  workgroup_inner_keys(inner_lo, inner_hi);
  uint kv_base = row.kv_base;  // the same for every row of the workgroup
  // Tiles the additive mask hides from every row of the workgroup are skipped (next_seen_tile).
  uint j0 = next_seen_tile(begin, end);
  if (j0 < end && !SKIP_PREFETCH) fetch_tile(kv_base, j0, min(BC, end - j0));
  while (j0 < end) {
    uint n = min(BC, end - j0);
    if (SKIP_PREFETCH) fetch_tile(kv_base, j0, n);
    barrier();  // every group is done with the previous tile
    store_tile();
    barrier();
    uint next = next_seen_tile(j0 + BC, end);
    // with V_IN_K, V's loads once this tile's V^T is stored (below)
    if (next < end && !SKIP_PREFETCH) {
      if (!V_IN_K) fetch_v(kv_base, next, min(BC, end - next));
      fetch_k(kv_base, next, min(BC, end - next));
    }
    bool inner = n == BC && j0 >= inner_lo && j0 + BC <= inner_hi;  // the same in the workgroup
#ifdef CM_ROW_OPS
    tile_row_ops(j0, n, inner);
#else
    fetch_mask(j0);
    tile_scores();
#ifdef CM_EMULATE
    bool rescale = tile_softmax(j0, n, inner);  // one copy: llvmpipe compiles it for many tests
#else
    bool rescale;
    if (inner)
      rescale = tile_softmax(j0, n, true);
    else
      rescale = tile_softmax(j0, n, false);
#endif
    tile_accumulate(rescale);
#endif
    if (V_IN_K && next < end && !SKIP_PREFETCH) fetch_v(kv_base, next, min(BC, end - next));
    j0 = next;
  }
#ifdef CM_ROW_OPS
  end_rows(row);
#endif
  finish();
}
