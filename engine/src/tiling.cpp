// The tiling policy: which kernel layout and tile sizes a call gets on a device (tiling.hpp).
#include "tiling.hpp"

#include <algorithm>
#include <span>
#include <utility>
#include <vector>

#include "flashvk/pipelines.hpp"

namespace flashvk::detail {

namespace {

// Whether a workgroup of `invocations` is whole subgroups of the context's size, within the
// subgroups a workgroup may have where the size is required (maxComputeWorkgroupSubgroups; 0:
// not known, as in the policy's tests): what a pipeline requiring full subgroups needs.
bool whole_subgroups(const DeviceInfo& info, uint32_t invocations) {
  uint32_t size = std::max(info.subgroup_size, 1u);
  return invocations % size == 0 &&
         (info.max_workgroup_subgroups == 0 || invocations / size <= info.max_workgroup_subgroups);
}

// Register tiles read K and V as RGBA texels (tile.glsl), or in storage formats of their own as
// 32-bit words (word_texel_bytes: the block formats four words a texel), so d and dv must be
// multiples of 4 and each of K and V must fit one texel-buffer binding.
bool texels_fit(const DeviceInfo& info, const Dims& dims, const Storage& kv) {
  uint64_t keys = dims.kv_keys;
  uint64_t texels = keys * std::max(dims.d, dims.dv) / 4;
  if (kv.own_kv())
    texels = std::max(buffer_bytes(kv.k, int64_t(keys * dims.d)) / word_texel_bytes(kv.k),
                      buffer_bytes(kv.v, int64_t(keys * dims.dv)) / word_texel_bytes(kv.v));
  return info.texel_buffers && dims.d % 4 == 0 && dims.dv % 4 == 0 &&
         texels <= info.max_texel_buffer_elements;
}

// RGBA texels of the additive mask's values: its rows padded to 4 keys.
uint64_t mask_texels(const AttentionParams& params, const Dims& dims) {
  if (params.mods.mask.data.empty() || dims.nk == 0) return 0;
  return params.mods.mask.data.size() / dims.nk * ((dims.nk + 3) / 4);
}

// Query rows each invocation of a register tile works on: every key element broadcast from the
// lane that fetched it serves all of them, so more rows mean fewer broadcasts and fetches per
// multiply-add, but each lane keeps rows x (d + dv) values of queries and outputs, and the
// kernels unroll rows x head dim x keys. 4 rows at d = 64 and 128 measured fastest on llvmpipe
// (a standalone flash2 of this layout at d = 128: 67% of the FMA peak, 57% with 6, 59% with 2); at
// most 512 / d, so that the queries and outputs stay within a core's 32 KiB level-1 data cache.
// Fewer when a KV head has few rows (decoding), so that they spread over the lanes instead of
// leaving lanes idle; and then no more invocations per workgroup than the rows need.
void size_register_tiles(Spec& spec, const DeviceInfo& info, const Dims& dims, bool auto_rows) {
  uint32_t most = std::clamp(512u / std::max(dims.d, dims.dv), 1u, 4u);
  uint64_t rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;  // per KV head
  spec.rows = static_cast<uint32_t>(std::clamp<uint64_t>(rows / info.subgroup_size, 1, most));
  if (!auto_rows) return;
  uint64_t lanes = (rows + spec.rows - 1) / spec.rows;
  uint64_t subgroups = (lanes + info.subgroup_size - 1) / info.subgroup_size;
  spec.workgroup =
      static_cast<uint32_t>(std::min<uint64_t>(spec.workgroup, subgroups * info.subgroup_size));
}

// Register tiles where they are asked for, or by default on CPU drivers (docs/engine.md).
// `kv_views`: K's and V's buffers can have texel views (usage, offset alignment).
bool use_registers(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                   const Storage& kv, bool kv_views, uint32_t rows, bool trace) {
  bool fused = variant_info(params.variant).fused;
  bool usable = info.subgroup_shuffle && info.subgroup_size >= 4 && info.subgroup_size <= 64 &&
                whole_subgroups(info, rows) && kv_views && texels_fit(info, dims, kv) &&
                mask_texels(params, dims) <= info.max_texel_buffer_elements;
  if (params.hints.tile_layout == TileLayout::registers) {
    if (!fused) throw Error("tile_layout registers applies to the fused variants, not naive");
    if (!usable)
      throw Error(
          "tile_layout registers needs subgroup shuffle and arithmetic operations in "
          "compute shaders with a subgroup size pipelines can require (an adopted device: "
          "ExternalDevice::subgroup_size_control_enabled), block_rows a multiple of the "
          "subgroup size (" +
          std::to_string(info.subgroup_size) +
          "), RGBA uniform texel buffers holding all of K and V (views: buffers with "
          "VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT at offsets that are multiples of "
          "minTexelBufferOffsetAlignment, " +
          std::to_string(info.min_texel_offset_alignment) + "), and d and dv multiples of 4; " +
          info.name + " with this shape does not qualify");
    if (params.hints.block_keys && params.hints.block_keys != info.subgroup_size)
      throw Error(
          "with tile_layout registers a tile is one key per subgroup lane, so block_keys "
          "must be 0 or the subgroup size (" +
          std::to_string(info.subgroup_size) + ")");
    return !trace;  // traces record from the shared-memory kernels
  }
  return params.hints.tile_layout == TileLayout::automatic && fused && usable && !trace &&
         info.type == "cpu" && params.hints.block_keys == 0;
}

// The matrices' shape the cooperative-matrix kernel takes: the context's (DeviceInfo::
// matrix_shape), or 16x16x16 by 32 for a made-up device that gives none.
MatrixShape coopmat_shape(const DeviceInfo& info) {
  return info.matrix_shape.m ? info.matrix_shape : kMatrixShapes[0];
}

// The row matrices each group of the cooperative-matrix kernel multiplies (CM_ROW_MATRICES in
// shaders/flash_cm.comp): 2 where a call asks for two matrices' rows a group (group_rows), else 1.
uint32_t coopmat_row_matrices(const MatrixShape& shape, uint32_t group_rows) {
  return group_rows == 2 * shape.m ? 2 : 1;
}

// The cooperative-matrix kernel's workgroup: groups of the shape's subgroup, each `rm` blocks of
// m rows, `rows` rows of matrices in all (NSG in shaders/flash_cm.comp; kMatrixRows, or twice it
// where a call asks): at 64, 4 groups of 32 at 16 x 16, 8 of 16 or 8 at Intel's 8-row shapes.
uint32_t coopmat_workgroup(const MatrixShape& shape, uint32_t rows = kMatrixRows, uint32_t rm = 1) {
  return rows / (shape.m * rm) * shape.subgroup;
}

// The rows of matrices a call's workgroups take: twice kMatrixRows where it asks for as many
// query rows (block_rows; their groups each hold their block's head dims whole), or for two row
// matrices a group (`rm`) whose queries stay in registers and leaves block_rows to the engine
// (4 groups on 16 x 16), else kMatrixRows (the queries of 128 rows in shared memory, beside the
// tiles, would take more than 48 KiB at d = 128).
uint32_t coopmat_rows(uint32_t block_rows, uint32_t rm = 1, bool q_shared = false) {
  return block_rows == 2 * kMatrixRows || (rm == 2 && !q_shared && block_rows == 0)
             ? 2 * kMatrixRows
             : kMatrixRows;
}

// The head dims a group holds whole: those at which a lane holds what it does at d = 128 on
// 16 x 16 matrices by 32 lanes (m / subgroup of a row's queries and output a lane): 128 there and
// on Xe2's 8 x 16 by 16, 64 on Arc's 8 x 8 by 8, where a lane holds a whole matrix row.
constexpr uint32_t coopmat_whole_dims(const MatrixShape& shape) {
  return 64 * shape.subgroup / shape.m;
}
// A group's output is at most coopmat_whole_dims / n matrices a row block (a split block's groups
// hold half of up to twice that), for one or two row blocks (group_rows, unsplit), which
// flash_cm.comp names by literal indices, 16 at most (CM_EACH): so in every shape.
constexpr bool at_most_sixteen_output_matrices() {
  for (const MatrixShape& shape : kMatrixShapes)
    if (2 * coopmat_whole_dims(shape) / shape.n > 16) return false;
  return true;
}
static_assert(at_most_sixteen_output_matrices(),
              "flash_cm.comp's CM_EACH names 16 matrices at most");

// Whether the queries stay in shared memory, each tile reading their matrices (Q_SHARED in
// shaders/flash_cm.comp), rather than in a group's registers: with two row matrices a group past
// half of coopmat_whole_dims (64 on 16 x 16), where its queries and output would take twice the
// registers they take at coopmat_whole_dims with one (RADV, navi31, flash2 at d = 128: 341
// pre-scheduling VGPRs, 116 spilled; with the queries shared, 227 and none at 16 keys a tile).
bool coopmat_queries_shared(const MatrixShape& shape, uint32_t d, uint32_t dv, uint32_t rm) {
  return rm == 2 && 2 * std::max(d, dv) > coopmat_whole_dims(shape);
}

// Groups of the cooperative-matrix kernel that share a block of query rows, each holding
// 1 / split of its head dims (LANES in shaders/flash_cm.comp): 2 where d or dv is over
// coopmat_whole_dims, so that a lane's queries and output take the registers they take there
// (at d = 256 on 16 x 16, whole, they would take all 256 of an RDNA3 lane's; NVIDIA's 255 a
// thread), or where a call asks for kMatrixRows / 2 rows a workgroup (block_rows: half a lane's
// queries and output, twice the workgroups), else 1. Up to twice coopmat_whole_dims.
uint32_t coopmat_split(const MatrixShape& shape, uint32_t d, uint32_t dv, uint32_t block_rows) {
  uint32_t whole = coopmat_whole_dims(shape);
  return d > whole || dv > whole || block_rows == kMatrixRows / 2 ? 2 : 1;
}

// The matrix API of the kernel a call runs: nv2's keeps its softmax in matrices only where a
// block of rows is one group's (split 1: d and dv up to 128); split, khr's kernel (emulated:
// emulated's), on the same units.
MatrixApi coopmat_kernel_api(MatrixApi api, uint32_t split) {
  if (split == 1) return api;
  return api == MatrixApi::nv2 ? MatrixApi::khr
         : api == MatrixApi::emulated_nv2 ? MatrixApi::emulated
                                          : api;
}

// Shared memory the cooperative-matrix kernel (shaders/flash_cm.comp) takes with `keys` a tile:
// its fp16 K tile and V^T tile (the workgroup's queries, 64 rows, 128 or 32 split, are staged
// there first, as many of their head dims at a time as fit) and the groups' scratch. Where the
// softmax runs on lanes, the scratch is a row of S in fp32 for each of the groups' matrix rows,
// over which P in fp16 and the rows' factor matrices go: at least keys / 2 + 2 n words a row, or
// keys / 2 + n where the variant's coef is always 1 (FlashAttention-2's); where it stays in
// matrices (nv2), a row is only the output's pieces and the out_scale column at the end (2 n
// words, or n). Every row is padded by 16 bytes, as in the shader; emulated, coopmat.glsl's
// exchange takes a float an invocation more (9 with nv2's stand-in), and nv2 keeps the
// workgroup's rows (common.glsl's Row, 11 words, taken as 16).
// `v_in_k`: V^T takes K's place once the scores are done (V_IN_K), so the larger of the two.
// The queries pass through the K/V space: their d head dims where they fit in the tiles' space,
// else the most of d / 2, d / 4 and d / 8 that do (multiples of 16), else the least of them, or
// all d where none is a multiple of 16, the space grown to hold them (Q_DIMS).
// `matrix_rows`: the groups' rows (coopmat_rows), `rm` row matrices each (coopmat_row_matrices);
// where the queries stay in shared memory (coopmat_queries_shared), they take rows of their own
// instead of passing through the K/V space.
uint32_t coopmat_bytes(const MatrixShape& shape, uint32_t keys, uint32_t d, uint32_t dv,
                       uint32_t split, MatrixApi api, Variant variant, bool v_in_k = false,
                       uint32_t matrix_rows = kMatrixRows, uint32_t rm = 1) {
  const uint32_t wg = coopmat_workgroup(shape, matrix_rows, rm);
  api = coopmat_kernel_api(api, split);
  uint32_t exchange = api == MatrixApi::emulated ? wg * 4 : 0;  // a float each
  if (api == MatrixApi::emulated_nv2) exchange = wg * 4 * 9;  // and 8 for cm_to_a
  const bool in_matrices = keeps_softmax_in_matrices(api);
  uint32_t rows = layout_row(TileLayout::cooperative_matrix)
                      .workgroup_rows({wg, 1, split, shape.subgroup, shape.m, rm});
  if (in_matrices) exchange += rows * 64;
  // keep alone where coef is 1: the lazy-output variants, built with CM_FLASH2 (builds.def)
  const uint32_t factors = variant_info(variant).lazy_output ? 1 : 2;
  uint32_t k = keys * (d + 8), vt = dv * (keys + 8);  // K and V^T, fp16
  uint32_t tiles = v_in_k ? std::max(k, vt) : k + vt;
  auto q_fits = [&](uint32_t dims) { return dims % 16 == 0 && rows * (dims + 8) <= tiles; };
  uint32_t q_dims = split > 1 || q_fits(d) ? d
                    : q_fits(d / 2)        ? d / 2
                    : q_fits(d / 4)        ? d / 4
                    : q_fits(d / 8)        ? d / 8
                    : d % 128 == 0         ? d / 8
                    : d % 64 == 0          ? d / 4
                    : d % 32 == 0          ? d / 2
                                           : d;
  const bool q_shared = coopmat_queries_shared(shape, d, dv, rm);
  uint32_t kv = q_shared ? 2 * (tiles + rows * (d + 8)) : 2 * std::max(tiles, rows * (q_dims + 8));
  uint32_t row = in_matrices ? factors * shape.n : std::max(keys, keys / 2 + factors * shape.n);
  return kv + matrix_rows * 4 * (row + 4) + exchange + 64;
}

// The cooperative-matrix kernel's tiles: keys a tile, 0 where none fits, and whether V^T takes
// K's place (V_IN_K).
struct MatrixTile {
  uint32_t keys = 0;
  bool v_in_k = false;
};

// Keys per tile of the cooperative-matrix kernel: `asked` (block_keys: 16, 32 or 64) where it
// fits the shared memory, K and V^T beside each other, else with V^T in K's place (which only a
// call that asks for a tile size gets, until a GPU has timed it), else 0; or, with `asked` 0,
// the engine's choice: the most of 64, 32 and
// 16 that fit (coopmat_bytes) and keep these bounds, 0 if none does. A lane holds at most what it
// does on NVIDIA at d = 128 with 64 keys: the next tile, which each invocation fetches into
// registers during the current one (KF uvec4 of K, and VQ items of V, 8 keys' 4 head dims: 4
// uvec4 each, 6 from the 5-bit formats: their values' word and two of their block's head), at
// most 16 uvec4 (8 with two row matrices a group, whose output takes twice the registers: RADV
// spilled 55 at d = 128 with 32 keys), and a softmax lane's scores and weights (keys / LPR each)
// at most 32. So
// Intel's 64-invocation workgroups and Arc's one lane a row take fewer keys. On RDNA a tile of
// more than 16 keys is taken only where whole workgroups leave 4 subgroups a SIMD
// (rdna_subgroups_per_simd: at d = 64, 64 keys would leave 3; at d = 256, 32 keys 2). Elsewhere
// (NVIDIA: registers bound these kernels) the most keys that fit. `matrix_rows` and `rm`:
// coopmat_rows and coopmat_row_matrices.
MatrixTile coopmat_tile(const DeviceInfo& info, uint32_t shared_bytes, uint32_t d, uint32_t dv,
                        uint32_t split, MatrixApi api, Variant variant, DType v_storage,
                        uint32_t asked, uint32_t matrix_rows, uint32_t rm) {
  const MatrixShape shape = coopmat_shape(info);
  const uint32_t wg = coopmat_workgroup(shape, matrix_rows, rm);
  const uint32_t lanes_a_row = shape.subgroup * split / (shape.m * rm);  // LPR
  for (uint32_t keys : {64u, 32u, 16u}) {
    if (asked && keys != asked) continue;
    uint32_t bytes = coopmat_bytes(shape, keys, d, dv, split, api, variant, false, matrix_rows, rm);
    uint32_t k_items = (keys * d / 8 + wg - 1) / wg, v_items = (keys / 8 * dv / 4 + wg - 1) / wg;
    uint32_t v_words = format(v_storage).head_halves > 2 ? 3 : 2;  // a key of an item
    bool prefetch = 4 * k_items + 8 * v_words * v_items <= 64 / rm && keys / lanes_a_row <= 32;
    // (two row matrices take the least tile where none keeps the bound: 5-bit V at d = 128)
    if (rm == 2 && keys == 16) prefetch = true;
    bool thin = keys > 16 && is_rdna(info) &&
                rdna_subgroups_per_simd(bytes, wg, shape.subgroup, 8) < 4;
    if (bytes <= shared_bytes && (asked || (prefetch && !thin))) return {keys, false};
    if (asked && coopmat_bytes(shape, keys, d, dv, split, api, variant, true, matrix_rows, rm) <=
                     shared_bytes)
      return {keys, true};
  }
  return {};
}

// Whether the device's matrix units are hardware the default should take. Intel's integrated
// GPUs without XMX (Gen12, Xe-LPG) list 8x8x16 as Arc's discrete Xe-HPG does, but their driver
// runs those products as ordinary instructions: they keep the register blocks unless the call
// asks for the matrix kernel. (Xe2's 8x16x16 has XMX on every part. So does Arrow Lake-H's
// integrated Xe-LPG+, which nothing Vulkan reports tells apart: it keeps the blocks too.)
bool matrix_hardware(const DeviceInfo& info) {
  return !(coopmat_shape(info) == kMatrixShapes[2] && info.type != "discrete");
}

// The keys a tile of the cooperative-matrix kernel the call asks for (block_keys where it asks
// for the layout; elsewhere block_keys asks for shared tiles), 0 for the engine's choice.
uint32_t asked_matrix_keys(const AttentionParams& params) {
  return params.hints.tile_layout == TileLayout::cooperative_matrix ? params.hints.block_keys : 0;
}

// The cooperative-matrix kernel where it is asked for, or by default wherever it runs on matrix
// units (emulated, only where it is asked for). d and dv are multiples of 16 up to
// coopmat_whole_dims (128; 64 on Arc), or of 32 up to twice that (a split block's groups take
// half each).
bool use_coopmat(const DeviceInfo& info, MatrixApi api, const Dims& dims,
                 const AttentionParams& params, DType dtype, const Storage& kv,
                 uint32_t shared_bytes, bool trace) {
  const MatrixShape shape = coopmat_shape(info);
  const uint32_t whole = coopmat_whole_dims(shape);
  const bool asked = params.hints.tile_layout == TileLayout::cooperative_matrix;
  const uint32_t keys = asked_matrix_keys(params), rows = params.hints.block_rows;
  const uint32_t split = coopmat_split(shape, dims.d, dims.dv, rows);
  const uint32_t rm = coopmat_row_matrices(shape, params.hints.group_rows);
  const uint32_t multiple = 16 * split,
                 matrix_rows =
                     coopmat_rows(rows, rm, coopmat_queries_shared(shape, dims.d, dims.dv, rm));
  // block_rows: the engine's (0), or where the call asks for the layout kMatrixRows / split, or
  // twice kMatrixRows (unsplit) where the device takes workgroups of as many groups (invocations,
  // and subgroups where they are known: maxComputeWorkgroupSubgroups)
  const uint32_t wide = coopmat_workgroup(shape, 2 * kMatrixRows, rm);
  bool rows_fit =
      rows == 0 || (asked && rows == kMatrixRows / split) ||
      (asked && rows == 2 * kMatrixRows && split == 1 && wide <= info.max_workgroup_invocations &&
       (info.max_workgroup_subgroups == 0 ||
        wide / shape.subgroup <= info.max_workgroup_subgroups));
  // group_rows: the engine's (0), a matrix's rows, or two matrices' where a block is one group's
  // (split 1: d and dv up to coopmat_whole_dims) and its softmax runs on lanes, a lane a row at
  // least
  const uint32_t group_rows = params.hints.group_rows;
  bool group_fits = group_rows == 0 || group_rows == shape.m ||
                    (rm == 2 && split == 1 && shape.subgroup >= 2 * shape.m &&
                     !keeps_softmax_in_matrices(coopmat_kernel_api(api, split)));
  if (asked && !group_fits)
    throw Error("tile_layout cooperative_matrix takes group_rows 0, " + std::to_string(shape.m) +
                " or " + std::to_string(2 * shape.m) + " (" + matrix_shape_name(shape) +
                " matrices; " + std::to_string(2 * shape.m) + " where d and dv are at most " +
                std::to_string(whole) +
                ", block_rows is 0, 64 or 128, the softmax runs on lanes (not matrix_api nv2) "
                "and a subgroup has at least as many lanes), got " +
                std::to_string(group_rows));
  bool shape_fits = variant_info(params.variant).matrix && dtype == DType::f16 &&
                    format(kv.k).matrix_kv() && format(kv.v).matrix_kv() &&
                    dims.d % multiple == 0 && dims.dv % multiple == 0 && dims.d <= 2 * whole &&
                    dims.dv <= 2 * whole && rows_fit && group_fits &&
                    (asked || params.hints.block_keys == 0);
  bool fits = shape_fits && coopmat_tile(info, shared_bytes, dims.d, dims.dv, split, api,
                                         params.variant, kv.v, keys, matrix_rows, rm)
                                    .keys > 0;
  if (asked) {
    if (api == MatrixApi::none)
      throw Error(
          "tile_layout cooperative_matrix needs matrix units (VK_KHR_cooperative_matrix or "
          "VK_NV_cooperative_matrix with fp16 products into fp32 in one of kMatrixShapes, and "
          "shaderFloat16) or ContextOptions::matrix_api emulated; " +
          info.name + " has none enabled");
    if (keys != 0 && keys != 16 && keys != 32 && keys != 64)
      throw Error(
          "tile_layout cooperative_matrix takes block_keys 16, 32 or 64 (0: the "
          "engine's choice), got " +
          std::to_string(keys));
    if (!shape_fits)
      throw Error(
          "tile_layout cooperative_matrix runs flash1, flash2, flashd and splitkv on fp16 "
          "Q, K and V in fp16 or a block format (q8_0, q4_0, ...), d and dv multiples of 16 up "
          "to " +
          std::to_string(whole) + ", or of 32 up to " + std::to_string(2 * whole) + " (" +
          matrix_shape_name(shape) + " matrices), and block_rows (rows a workgroup) 0 (the " +
          "engine's), " + std::to_string(kMatrixRows) + " or " + std::to_string(2 * kMatrixRows) +
          " (" + std::to_string(wide) + " invocations a workgroup; this device takes " +
          std::to_string(info.max_workgroup_invocations) + ") where d and dv are at most " +
          std::to_string(whole) + ", or " + std::to_string(kMatrixRows / 2) +
          " (each block of rows split over two groups, half the head dims each: d and dv "
          "multiples of 32)");
    if (!fits) {
      const uint32_t tried = keys ? keys : 16;  // the engine's least
      throw Error("tile_layout cooperative_matrix at d=" + std::to_string(dims.d) +
                  ", dv=" + std::to_string(dims.dv) + " needs " +
                  std::to_string(coopmat_bytes(shape, tried, dims.d, dims.dv, split, api,
                                               params.variant, keys != 0, matrix_rows, rm)) +
                  " bytes of shared memory with " + std::to_string(tried) +
                  " keys a tile; the kernels may take " + std::to_string(shared_bytes) +
                  " (the least of the device's, max_shared_memory and the engine's 48 KiB)");
    }
    return !trace;  // traces record from the shared-memory kernels
  }
  bool units = on_matrix_units(api) && matrix_hardware(info);
  return params.hints.tile_layout == TileLayout::automatic && units && fits && !trace;
}

// TileLayout::lanes (shaders/splitkv_lanes.comp): lanes per key, so that each lane loads 16
// bytes of a key row at a time (Format::load_values: 4 floats, 8 halves, a block format's
// quants); the most that divide both d and dv into whole loads, a power of two no larger than the
// subgroup. 0 when d or dv is not a whole number of loads.
uint32_t lane_vec(DType storage) {  // values of one 16-byte load
  return format(storage).load_values();
}

uint32_t lanes_per_key(const DeviceInfo& info, const Dims& dims, const Storage& kv) {
  uint32_t kvec = lane_vec(kv.k), vvec = lane_vec(kv.v);
  if (dims.d % kvec || dims.dv % vvec) return 0;
  uint32_t lanes = 1;
  while (lanes * 2 <= info.subgroup_size && (dims.d / kvec) % (lanes * 2) == 0 &&
         (dims.dv / vvec) % (lanes * 2) == 0)
    lanes *= 2;
  return lanes;
}

constexpr uint32_t kLaneRows = 8;  // query rows of a lanes workgroup at most
// Keys a cluster of lanes takes a step, all their loads in flight together: 8 read 5-8% faster
// than 4 on an H100. Also the most a caller may ask for: the step is unrolled over keys and rows,
// and NVIDIA's compiler took 213 s for one pipeline of 16 keys by 8 rows (4 s for 8 keys).
constexpr uint32_t kLaneKeys = 8;

// The 32-bit registers a lanes invocation needs, estimated: the loads of a step's `keys` keys
// in flight (16 bytes each, and a block scale for the block formats), its `rows` rows' queries and
// outputs (d / lanes and dv / lanes values each), and the step's scores. Fitted to RADV's
// "Pre-Sched VGPRs" for Mesa 25 on RDNA3 (`flashvk pipelines --suite kernels`): about 10 above it.
uint32_t lane_registers(const Dims& dims, const Storage& kv, uint32_t lanes, uint32_t rows,
                        uint32_t keys) {
  uint32_t ke = dims.d / lanes, ve = dims.dv / lanes;
  uint32_t loads = ke / lane_vec(kv.k) + ve / lane_vec(kv.v);
  bool scaled = dtype_quantised(kv.k) || dtype_quantised(kv.v);
  return keys * loads * (scaled ? 5 : 4) + rows * (ke + ve) + keys * rows;
}
// The most lane_registers() a lanes tiling may take: the registers with which 8 subgroups run
// on a SIMD, decoding's floor (memory latency is hidden by the loads of many subgroups in
// flight). Where the driver tells its register file (DeviceInfo::registers_per_simd, AMD), a
// quarter of it, as RADV's "Subgroups per SIMD" counts: 128 on RDNA2 and RDNA3.5, 192 on Navi 31;
// elsewhere 192.
uint32_t lane_register_budget(const DeviceInfo& info) {
  return info.registers_per_simd ? std::min(192u, info.registers_per_simd / 4) : 192u;
}

// Query rows of a lanes workgroup and keys a cluster takes a step: all of a KV head's rows (at
// most kLaneRows), so that K and V are read once, and as many keys (8, 4 or 2; or the
// `forced_keys` a call asks for, 1 to 8) as lane_register_budget() allows; fewer rows a
// workgroup (a KV head's rows over several workgroups, which read the same K and V at about the
// same time) where even 2 keys a step would not fit. {0, 0} when nothing fits.
std::pair<uint32_t, uint32_t> lane_tiles(const DeviceInfo& info, const Dims& dims,
                                         const Storage& kv, uint32_t lanes, uint32_t forced_keys) {
  uint64_t head_rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;  // per KV head
  const uint32_t steps[] = {kLaneKeys, kLaneKeys / 2, kLaneKeys / 4};
  std::span<const uint32_t> tried = steps;
  if (forced_keys) tried = {&forced_keys, 1};
  for (uint32_t rows = static_cast<uint32_t>(std::min<uint64_t>(head_rows, kLaneRows)); rows > 0;
       rows = rows > 1 ? (rows + 1) / 2 : 0)
    for (uint32_t keys : tried)
      if (lane_registers(dims, kv, lanes, rows, keys) <= lane_register_budget(info))
        return {rows, keys};
  return {0, 0};
}

// Invocations of a lanes workgroup: 64 (or one subgroup where that is more), or fewer where its
// subgroups' merge (one state per subgroup, splitkv_lanes.comp) would not fit the shared memory;
// never fewer than one subgroup, so that its pipeline can require full ones.
uint32_t lanes_workgroup(uint32_t lanes, uint32_t subgroup, uint32_t rows, uint32_t dv,
                         uint32_t shared_bytes) {
  uint32_t size = std::max({64u, lanes, subgroup});
  auto merge_bytes = [&](uint32_t n) {
    uint32_t subgroups = (n + subgroup - 1) / subgroup;
    return (subgroups > 1 ? subgroups * rows * (dv + 2) * 4 : 0) + 4;  // and a flag
  };
  while (size > std::max(lanes, subgroup) && merge_bytes(size) > shared_bytes) size /= 2;
  return size;
}

// The lanes layout where it is asked for, or by default for splitkv on GPUs when a KV head has
// few query rows (decoding), which all go to one workgroup; by default only where one cluster's
// merge fits the shared memory and each lane holds at most four 16-byte loads of a row (a head
// dim that splits badly, such as d = 80 in fp16 over 2 lanes, would keep 40 elements a row in
// every lane, and spill).
bool use_lanes(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
               const Storage& kv, uint32_t shared_bytes, bool trace) {
  uint32_t lanes = lanes_per_key(info, dims, kv);
  bool usable = variant_info(params.variant).splits_keys && info.subgroup_shuffle && lanes > 0 &&
                params.hints.block_rows == 0 && params.hints.block_keys <= kLaneKeys;
  if (params.hints.tile_layout == TileLayout::lanes) {
    if (!usable)
      throw Error(
          "tile_layout lanes runs splitkv with workgroups sized by the engine (block_rows 0), "
          "block_keys (keys a cluster of lanes takes a step) at most " +
          std::to_string(kLaneKeys) +
          ", on devices with subgroup shuffles and subgroup size "
          "control (an adopted device: ExternalDevice::subgroup_size_control_enabled), d a "
          "multiple of " +
          std::to_string(lane_vec(kv.k)) + " and dv a multiple of " +
          std::to_string(lane_vec(kv.v)) + " (16-byte loads of K stored as " + dtype_name(kv.k) +
          " and V as " + dtype_name(kv.v) + "); " + info.name + " with this call does not qualify");
    return !trace;  // traces record from the shared-memory kernels
  }
  // A KV head's rows within the register budget (lane_tiles), in one workgroup or, where they do
  // not fit, several that read the same K and V at about the same time: decoding in blocks
  // would run tiles of 16 to 64 rows for a KV head's few.
  uint64_t rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;  // per KV head
  uint32_t tile_rows = lanes ? lane_tiles(info, dims, kv, lanes, 0).first : 0;
  bool fits = rows <= kLaneRows && tile_rows > 0 && rows * (dims.dv + 2) * 4 <= shared_bytes;
  return params.hints.tile_layout == TileLayout::automatic && usable && fits &&
         params.hints.block_keys == 0 && !trace && info.type != "cpu" &&
         !params.hints.fp16_arithmetic;
}

// TileLayout::blocks (tile.glsl, BLOCK_TILE). A row group of `lanes` invocations shares 4 query
// rows, each taking dv / lanes output columns (a multiple of 4): 8 where dv allows, so that a
// row's reductions are three shuffles, or 16 where 8 would leave more than 16 columns an
// invocation (d = 256). The shared memory holds the queries [d][Br], K [d][Bc] and V [Bc][dv]
// (or V in K's place once the scores are done), P [Bc][Br] (the four in fp32, or fp16 with fp16
// arithmetic), the workgroup's key range and, without subgroup operations, a float per
// invocation for the row reductions.
std::vector<uint32_t> block_lanes(const DeviceInfo& info, const Dims& dims, bool shuffle) {
  std::vector<uint32_t> out;
  for (uint32_t lanes : {8u, 16u, 4u, 2u, 1u})
    if (dims.dv % (4 * lanes) == 0 && (!shuffle || lanes <= info.subgroup_size) &&
        (lanes != 16 || dims.dv > 128))
      out.push_back(lanes);
  return out;
}

uint64_t block_bytes(const Dims& dims, uint32_t br, uint32_t bc, bool share_kv,
                     uint32_t invocations, bool shuffle, uint32_t element) {
  uint64_t kv = share_kv ? std::max(dims.d, dims.dv) : dims.d + dims.dv;
  return element * (uint64_t(dims.d) * br + kv * bc + uint64_t(bc) * br) +
         (shuffle ? 0 : 4 * invocations) + 16;  // + common.glsl's wg_keys
}

// The 32-bit registers an invocation of the register blocks needs, estimated: its 4 x OW outputs,
// 4 x CH scores, coefficients and products a tile (fp16: and the fp16 sums of both), the next
// tile's K and V held in registers while this one is worked on (KF + VF vectors of 4), and what
// the rest takes. Fitted to the demand AMD's compiler reports before scheduling (RADV's
// "Pre-Sched VGPRs", `flashvk pipelines`) over Br x Bc x d at Mesa 25 for RDNA3: within about 30
// of it; above 256 the compiler spills.
uint32_t block_registers(const Dims& dims, uint32_t br, uint32_t bc, uint32_t lanes, bool f16) {
  uint32_t ow = dims.dv / lanes, ch = bc / lanes, invocations = br / 4 * lanes;
  uint32_t kf = (bc * dims.d / 4 + invocations - 1) / invocations;
  uint32_t vf = (bc * dims.dv / 4 + invocations - 1) / invocations;
  return f16 ? 8 * ow + 14 * ch + 2 * (kf + vf) + 30 : 4 * ow + 12 * ch + 4 * (kf + vf) + 30;
}
// The most block_registers() a tiling the engine picks may need where one fits the device: a
// margin under the 256 past which the compiler spills, for the estimate's error and the
// modifiers' code.
constexpr uint32_t kBlockRegisters = 240;

// The register blocks' tiles: the most rows that fit, then the most keys, then K and V apart (one
// barrier less a tile); block_rows and block_keys fix Br and Bc. False when none fits (or the
// shape cannot have blocks). Rows first: on an H100 (fp32, B=1 H=8 N=4096) 64 x 32 took 2.8 ms
// at d=64 against 6.8-7.4 for 32 x 32 and 32 x 64, and 64 x 16 took 8.0 ms at d=128 against 15.0
// for 32 x 32 (fewer, larger workgroups: one wave over the SMs, each K/V tile serving more rows).
// Within kBlockRegisters where some tiling is.
bool size_blocks(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                 uint32_t shared_bytes, Spec& spec) {
  bool shuffle = info.subgroup_shuffle;
  if (dims.d % 4 != 0) return false;
  uint32_t max_invocations = std::min(info.max_workgroup_invocations, 1024u);
  bool f16 = params.hints.fp16_arithmetic;
  uint32_t element = f16 ? 2 : 4;
  uint64_t best_score = 0;
  // Within the register budget where a tiling fits it, else the best that fits the device.
  // A CPU driver has no register file to spill from; llvmpipe is better off with long tiles,
  // whose fewer loop iterations stay under its cap (Plan::check_loop_budget).
  for (bool budget : {info.type != "cpu", false}) {
    if (!budget && best_score > 0) break;
    for (uint32_t lanes : block_lanes(info, dims, shuffle))
      for (uint32_t br : {64u, 32u, 16u, 8u, 4u}) {
        if (params.hints.block_rows && br != params.hints.block_rows) continue;
        uint32_t invocations = br / 4 * lanes;
        if (invocations > max_invocations) continue;
        for (uint32_t bc : {64u, 32u, 16u, 8u, 4u}) {
          if (params.hints.block_keys && bc != params.hints.block_keys) continue;
          if (bc % lanes != 0) continue;
          if (budget && block_registers(dims, br, bc, lanes, f16) > kBlockRegisters) continue;
          for (bool share : {false, true}) {
            // Shuffles where the workgroup is whole subgroups (their pipelines require full
            // ones), shared memory otherwise.
            bool shuffles = shuffle && whole_subgroups(info, invocations);
            if (block_bytes(dims, br, bc, share, invocations, shuffles, element) > shared_bytes)
              continue;
            uint64_t score = uint64_t(br) * 1000 + bc * 10 + (share ? 0 : 1);
            if (score <= best_score) continue;
            best_score = score;
            spec.workgroup = invocations;
            spec.bc = bc;
            spec.rows = 4;
            spec.lanes = lanes;
            spec.block_shuffle = shuffles;
            spec.v_at = share ? 0 : dims.d * bc / 4;
            spec.kv_vec4 = (share ? std::max(dims.d, dims.dv) : dims.d + dims.dv) * bc / 4;
          }
        }
      }
  }
  if (best_score > 0) spec.layout = TileLayout::blocks;
  return best_score > 0;
}

// Register blocks where they are asked for (or fp16 arithmetic is, which only they and the
// cooperative-matrix kernel, chosen before, have), or by default on GPUs (where the
// cooperative-matrix kernel does not run), unless block_rows or block_keys ask for shared tiles.
bool use_blocks(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                uint32_t shared_bytes, bool trace, Spec& spec) {
  bool fused = variant_info(params.variant).fused;
  if (params.hints.tile_layout == TileLayout::blocks || params.hints.fp16_arithmetic) {
    std::string what = params.hints.tile_layout == TileLayout::blocks
                           ? "tile_layout blocks"
                           : "fp16_arithmetic runs in register blocks, which";
    if (!fused) throw Error("tile_layout blocks applies to the fused variants, not naive");
    if (params.hints.block_rows && params.hints.block_rows % 4 != 0)
      throw Error("with " + what +
                  ", block_rows (query rows of a workgroup) must be a multiple of 4 from 4 to 64");
    if (!size_blocks(info, dims, params, shared_bytes, spec))
      throw Error(
          what +
          " needs d a multiple of 4 and dv of 16 (or 4, 8 with fewer "
          "invocations a row group), block_rows and block_keys among 4, 8, 16, 32, 64 (or 0), "
          "and its tiles within the shared memory (" +
          std::to_string(shared_bytes) + " bytes) and " +
          std::to_string(info.max_workgroup_invocations) +
          " invocations; d=" + std::to_string(dims.d) + ", dv=" + std::to_string(dims.dv) + " on " +
          info.name + " does not fit");
    if (trace) spec.layout = TileLayout::shared;  // traces record from the shared-memory kernels
    spec.block_f16 = params.hints.fp16_arithmetic;
    return spec.layout == TileLayout::blocks;
  }
  return params.hints.tile_layout == TileLayout::automatic && fused && !trace &&
         info.type != "cpu" && params.hints.block_rows == 0 && params.hints.block_keys == 0 &&
         size_blocks(info, dims, params, shared_bytes, spec);
}

// What fp16 arithmetic needs besides a register-block tiling (use_blocks says what that needs).
void check_fp16_arithmetic(const TilingRequest& request) {
  const AttentionParams& params = request.params;
  const DeviceInfo& info = request.info;
  if (!variant_info(params.variant).fused)
    throw Error("fp16_arithmetic applies to the fused variants, not naive");
  if (request.trace || request.forced_keys)
    throw Error("fp16_arithmetic does not apply to traces, which record fp32 arithmetic");
  TileLayout layout = params.hints.tile_layout;
  if (layout != TileLayout::automatic && layout != TileLayout::blocks &&
      layout != TileLayout::cooperative_matrix)
    throw Error(std::string("fp16_arithmetic runs in tile_layout blocks or cooperative_matrix, "
                            "not ") +
                tile_layout_name(layout));
  if (!request.fp16_arithmetic_enabled)
    throw Error("fp16_arithmetic needs shaderFloat16 enabled on the device; " + info.name +
                (info.fp16_arithmetic ? " has it, but the adopted device was created without it "
                                        "(ExternalDevice::fp16_arithmetic_enabled)"
                                      : " does not support it"));
}

// Tile sizes from the device: Br rows per workgroup, and as many keys per tile as the K and V
// tiles can hold in shared memory. Only Vulkan's guaranteed minimums are assumed (16 KiB shared,
// 128 invocations); a device with more shared memory gets longer tiles.
// The layout and its tile sizes (choose_tiling, before the subgroup rule).
Spec choose_layout(const TilingRequest& request) {
  const DeviceInfo& info = request.info;
  const Dims& dims = request.dims;
  const AttentionParams& params = request.params;
  const Storage& kv = request.kv;
  DType dtype = request.dtype;
  bool trace = request.trace;
  uint32_t forced_keys = request.forced_keys;
  Spec spec;
  spec.d = dims.d;
  spec.dv = dims.dv;
  uint32_t limit =
      params.hints.max_shared_memory ? params.hints.max_shared_memory : info.max_shared_memory;
  uint32_t shared_bytes = std::min({limit, info.max_shared_memory, 48u * 1024u});
  spec.kv_quant = kv.own_kv();
  spec.k_format = static_cast<uint32_t>(kv.k);
  spec.v_format = static_cast<uint32_t>(kv.v);
  if (params.hints.fp16_arithmetic) check_fp16_arithmetic(request);
  if (params.hints.group_rows && params.hints.tile_layout != TileLayout::cooperative_matrix)
    throw Error(
        "group_rows (query rows a group of the matrix kernel multiplies) applies to "
        "tile_layout cooperative_matrix");
  if (!forced_keys && use_lanes(info, dims, params, kv, shared_bytes, trace)) {
    spec.layout = TileLayout::lanes;
    spec.lanes = lanes_per_key(info, dims, kv);
    auto [rows, keys] = lane_tiles(info, dims, kv, spec.lanes, params.hints.block_keys);
    if (rows == 0) {  // asked for (tile_layout lanes) beyond the register budget: the least,
      // a row a workgroup (all of a KV head's rows built 18,000 to 52,000 instructions that
      // spilled: RADV, q4_1 K at d = 32; on the H200 a test of two such builds ran past 165 s)
      rows = 1;
      keys = params.hints.block_keys ? params.hints.block_keys : kLaneKeys / 4;
    }
    spec.rows = rows;
    spec.subgroup = std::max(info.subgroup_size, spec.lanes);
    spec.workgroup = lanes_workgroup(spec.lanes, spec.subgroup, spec.rows, dims.dv, shared_bytes);
    spec.bc = keys;  // keys a cluster takes a step
    if (spec.workgroup > spec.subgroup &&
        (spec.workgroup / spec.subgroup) * spec.rows * (dims.dv + 2) * 4 > shared_bytes)
      throw Error("tile_layout lanes needs " + std::to_string(spec.rows * (dims.dv + 2) * 4) +
                  " bytes of shared memory a subgroup for merging the workgroup's subgroups; "
                  "this device or max_shared_memory allows " +
                  std::to_string(shared_bytes));
    return spec;
  }
  if (!forced_keys &&
      use_coopmat(info, request.matrix_api, dims, params, dtype, kv, shared_bytes, trace)) {
    spec.layout = TileLayout::cooperative_matrix;
    const MatrixShape shape = coopmat_shape(info);
    const uint32_t rm = coopmat_row_matrices(shape, params.hints.group_rows);
    spec.q_shared = coopmat_queries_shared(shape, dims.d, dims.dv, rm);
    const uint32_t matrix_rows = coopmat_rows(params.hints.block_rows, rm, spec.q_shared);
    spec.workgroup = coopmat_workgroup(shape, matrix_rows, rm);  // a block to `lanes` groups
    spec.cm_row_matrices = rm;
    spec.subgroup = shape.subgroup;
    spec.cm_m = shape.m;
    spec.cm_n = shape.n;
    spec.lanes = coopmat_split(shape, dims.d, dims.dv, params.hints.block_rows);
    spec.matrix = coopmat_kernel_api(request.matrix_api, spec.lanes);
    MatrixTile tile =
        coopmat_tile(info, shared_bytes, dims.d, dims.dv, spec.lanes, spec.matrix, params.variant,
                     kv.v, asked_matrix_keys(params), matrix_rows, rm);
    spec.bc = tile.keys;
    spec.v_in_k = tile.v_in_k;
    return spec;
  }
  if (!forced_keys) {
    Spec blocks = spec;
    if (use_blocks(info, dims, params, shared_bytes, trace, blocks)) return blocks;
  }
  spec.workgroup = params.hints.block_rows ? params.hints.block_rows : 64;
  // A per-key trace (Bc = 1; usually one row's call, as the viewer's) in a workgroup no larger
  // than its rows, or a subgroup: rows past the problem are work under a mask on a CPU driver
  // (16384 keys took 0.4 s at 64 invocations on lavapipe). Not longer tiles: their loads, unrolled
  // over fewer invocations, would take llvmpipe minutes to build.
  if (trace && forced_keys == 1 && !params.hints.block_rows) {
    uint64_t rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;  // of a (batch, KV head)
    uint32_t fit = std::max(info.subgroup_size, 1u);
    while (fit < 64 && fit < rows) fit *= 2;
    spec.workgroup = std::min(spec.workgroup, fit);
  }
  uint32_t max_rows = std::min(info.max_workgroup_invocations, 1024u);
  if (spec.workgroup > max_rows)
    throw Error("block_rows " + std::to_string(spec.workgroup) + " exceeds the device's " +
                "maxComputeWorkGroupInvocations (" + std::to_string(max_rows) + ")");
  if (use_registers(info, dims, params, kv, request.kv_views, spec.workgroup, trace)) {
    spec.layout = TileLayout::registers;
    spec.bc = info.subgroup_size;
    size_register_tiles(spec, info, dims, params.hints.block_rows == 0);
    return spec;
  }
  uint32_t budget = shared_bytes - 64u;
  uint32_t max_keys = budget / (4u * (dims.d + dims.dv));
  uint32_t keys = forced_keys ? forced_keys : params.hints.block_keys;
  if (keys == 0) keys = std::min(64u, max_keys);
  if (keys > max_keys)
    throw Error("block_keys " + std::to_string(keys) + " with d=" + std::to_string(dims.d) +
                ", dv=" + std::to_string(dims.dv) + " needs " +
                std::to_string(4u * keys * (dims.d + dims.dv)) + " bytes of shared memory; the " +
                "device's maxComputeSharedMemorySize is " + std::to_string(info.max_shared_memory));
  spec.bc = keys;
  return spec;
}

}  // namespace

Spec choose_tiling(const TilingRequest& request) {
  return choose_layout(request);
}

uint32_t matrix_kernel_bytes(const Spec& spec) {
  const MatrixShape shape{spec.cm_m, spec.cm_n, 16, spec.subgroup};
  return coopmat_bytes(shape, spec.bc, spec.d, spec.dv, spec.lanes, spec.matrix, Variant::flash1,
                       spec.v_in_k, spec.block() * spec.lanes, spec.cm_row_matrices);
}

}  // namespace flashvk::detail
