// The kernels' specialization constants, declared once for both sides, as push_fields.glsl does
// the push constants: a shader includes this file and gets each one declared below (constant_id
// = its ID), and engine/src/vk.hpp includes it with its own SPEC_WORKGROUP and SPEC_CONSTANT to
// make Spec's fields (named after the constants, lower case) and the VkSpecializationMapEntry
// list, and static_asserts that every ID is its entry's position. Every constant is 32 bits (a
// bool is a VkBool32).
//   SPEC_WORKGROUP(id, field, default)                 the workgroup size (local_size_x_id)
//   SPEC_CONSTANT(id, type, NAME, field, default)
#ifndef SPEC_CONSTANT
#define SPEC_WORKGROUP(id, field, value) layout(local_size_x_id = id) in;
#define SPEC_CONSTANT(id, type, NAME, field, value) layout(constant_id = id) const type NAME = value;
#define SPEC_CONSTANTS_IN_GLSL
#endif
SPEC_WORKGROUP(0, workgroup, 64)                  // invocations per workgroup
SPEC_CONSTANT(1, uint, BC, bc, 32)                // keys per K/V tile (lanes: keys a cluster takes a step)
SPEC_CONSTANT(2, uint, D, d, 64)                  // head dim of Q and K
SPEC_CONSTANT(3, uint, DV, dv, 64)                // head dim of V and O
SPEC_CONSTANT(4, uint, ROWS, rows, 1)             // query rows each invocation works on (blocks: each row group)
// A key mask is bound. A constant, not a push-constant flag: llvmpipe runs a branch on a value it
// cannot see is uniform under a mask, so every tile paid for a per-lane read of the mask.
SPEC_CONSTANT(5, bool, KEY_MASK, key_mask, false)
// Lanes that share one key's head dimension (lanes), the invocations that share a group of
// query rows (blocks), or the groups that share a block of CM_M query rows (cooperative matrices).
SPEC_CONSTANT(6, uint, LANES, lanes, 1)
// The score modifiers compiled in (bits MOD_* of modifiers.glsl), a constant for the same reason as
// KEY_MASK: a call without them runs none of their code.
SPEC_CONSTANT(7, uint, MODS, mods, 0)
// KV_QUANT builds, lanes and the matrix kernels: K's and V's storage formats (FMT_* in
// formats.glsl, DType's numbers);
// rope.comp's QUANT_OUT build: the format it writes (K_FORMAT).
SPEC_CONSTANT(8, uint, K_FORMAT, k_format, 0)
SPEC_CONSTANT(9, uint, V_FORMAT, v_format, 0)
// A paged KV cache (attention over a PageTable): tokens a page; 0 for K and V as [B, Hkv, rows].
SPEC_CONSTANT(10, uint, PAGE_SIZE, page_size, 0)
// Blocks: the K/V tile's shared memory in vectors of 4 elements (16 bytes, 8 with BLOCK_F16), and
// where the V tile starts in it: 0 when V takes K's place once the scores are done (a smaller
// footprint, for long head dims).
SPEC_CONSTANT(11, uint, KV_VEC4, kv_vec4, 1)
SPEC_CONSTANT(12, uint, V_AT, v_at, 0)
// Lanes: the device's subgroup size, so that the clusters of a subgroup merge by shuffles and only
// the subgroups of a workgroup through shared memory, which is sized by it. Cooperative matrices:
// the invocations that hold a matrix (a subgroup on the matrix units; coopmat.glsl).
SPEC_CONSTANT(13, uint, SUBGROUP, subgroup, 32)
// flex_tiles.comp: the query rows of a workgroup of the attention kernel whose tile bitmap it
// writes (Spec::block()).
SPEC_CONSTANT(14, uint, TILE_ROWS, tile_rows, 1)
// Cooperative matrices: the device's shape (DeviceInfo::matrix_shape), CM_M x 16 times 16 x CM_N.
SPEC_CONSTANT(15, uint, CM_M, cm_m, 16)
SPEC_CONSTANT(16, uint, CM_N, cm_n, 16)
// Cooperative matrices: phases a timing diagnostic leaves out (FLASHVK_MATRIX_SKIP; flash_cm.comp's
// SKIP_*): 0 in every real run, where the tests fold away.
SPEC_CONSTANT(17, uint, CM_SKIP, cm_skip, 0)
// Cooperative matrices: V^T takes K's place in shared memory once the scores are done (longer
// tiles in the same space; flash_cm.comp's V_IN_K), where a call asks for keys a tile that do
// not fit beside each other.
SPEC_CONSTANT(18, bool, V_IN_K, v_in_k, false)
// Cooperative matrices: the row matrices each group multiplies (CM_M rows each), 1 or 2 where a
// call asks (ExecutionHints::group_rows): with 2, each K^T and V^T matrix read from shared memory
// feeds two products.
SPEC_CONSTANT(19, uint, CM_ROW_MATRICES, cm_row_matrices, 1)
// Cooperative matrices: the queries stay in shared memory and each tile reads their matrices
// there, instead of each group holding its own in registers: with two row matrices past d = 64
// (tiling.cpp), or where FLASHVK_MATRIX_SKIP's `queries` asks (ContextImpl::driver_constants).
SPEC_CONSTANT(20, bool, Q_SHARED, q_shared, false)
#ifdef SPEC_CONSTANTS_IN_GLSL
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT
#undef SPEC_CONSTANTS_IN_GLSL
#endif
