#include "plan.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "flashvk/context.hpp"

namespace flashvk::detail {

namespace {

// The texels of K or V in a storage format of its own (KV_QUANT kernels): q8_0 and q4_0 as four
// 32-bit words (sixteen quants of a block, or all 32 of a q4_0 block, in one fetch: tile.glsl's
// kv_fetch), other formats a word a texel.
bool word_quad(DType storage) {
  return storage == DType::q8_0 || storage == DType::q4_0;
}
VkFormat word_texel_format(DType storage) {
  return word_quad(storage) ? VK_FORMAT_R32G32B32A32_UINT : VK_FORMAT_R32_UINT;
}
uint64_t word_texel_bytes(DType storage) {
  return word_quad(storage) ? 16 : 4;
}

// Register tiles read K and V as RGBA texels (tile.glsl), or in storage formats of their own as
// 32-bit words (q8_0, q4_0: four words a texel, kv_fetch), so d and dv must be multiples of 4 and
// each of K and V must fit one texel-buffer binding.
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
  if (params.mask.data.empty() || dims.nk == 0) return 0;
  return params.mask.data.size() / dims.nk * ((dims.nk + 3) / 4);
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
  spec.group_rows = static_cast<uint32_t>(std::clamp<uint64_t>(rows / info.subgroup_size, 1, most));
  if (!auto_rows) return;
  uint64_t lanes = (rows + spec.group_rows - 1) / spec.group_rows;
  uint64_t subgroups = (lanes + info.subgroup_size - 1) / info.subgroup_size;
  spec.rows = static_cast<uint32_t>(std::min<uint64_t>(spec.rows, subgroups * info.subgroup_size));
}

// Register tiles where they are asked for, or by default on CPU drivers (docs/engine.md).
// `kv_views`: K's and V's buffers can have texel views (usage, offset alignment).
bool use_registers(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                   const Storage& kv, bool kv_views, uint32_t rows, bool trace) {
  bool fused = variant_info(params.variant).fused;
  bool usable = info.subgroup_shuffle && info.subgroup_size >= 4 && info.subgroup_size <= 64 &&
                rows % info.subgroup_size == 0 && kv_views && texels_fit(info, dims, kv) &&
                mask_texels(params, dims) <= info.max_texel_buffer_elements;
  if (params.tile_layout == TileLayout::registers) {
    if (!fused) throw Error("tile_layout registers applies to the fused variants, not naive");
    if (!usable)
      throw Error(
          "tile_layout registers needs subgroup shuffle and arithmetic operations in "
          "compute shaders, block_rows a multiple of the subgroup size (" +
          std::to_string(info.subgroup_size) +
          "), RGBA uniform texel buffers holding all of K and V (views: buffers with "
          "VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT at offsets that are multiples of "
          "minTexelBufferOffsetAlignment, " +
          std::to_string(info.min_texel_offset_alignment) + "), and d and dv multiples of 4; " +
          info.name + " with this shape does not qualify");
    if (params.block_keys && params.block_keys != info.subgroup_size)
      throw Error(
          "with tile_layout registers a tile is one key per subgroup lane, so block_keys "
          "must be 0 or the subgroup size (" +
          std::to_string(info.subgroup_size) + ")");
    return !trace;  // traces record from the shared-memory kernels
  }
  return params.tile_layout == TileLayout::automatic && fused && usable && !trace &&
         info.type == "cpu" && params.block_keys == 0;
}

// Keys per tile of the cooperative-matrix kernel (shaders/flash_cm.comp), the most of 64, 32 and
// 16 whose fp16 K/V tile and four subgroups' scratch (S in fp32, P in fp16) fit the shared
// memory, and whose K/V space can stage the workgroup's 64 queries first; 0 if none fits. Every
// row is padded by 16 bytes, as in the shader.
uint32_t coopmat_keys(uint32_t shared_bytes, uint32_t d, uint32_t dv) {
  for (uint32_t keys : {64u, 32u, 16u}) {
    uint32_t kv = 2 * keys * (d + 8 + dv + 8);
    uint32_t scratch = 4 * 16 * (4 * (std::max(keys, 16u) + 4) + 2 * (keys + 8));
    if (kv + scratch + 64 <= shared_bytes && 64 * (d + 8) <= keys * (d + dv + 16)) return keys;
  }
  return 0;
}

// The cooperative-matrix kernel where it is asked for, or by default wherever it can run.
bool use_coopmat(const ContextImpl& impl, const Dims& dims, const AttentionParams& params,
                 DType dtype, const Storage& kv, uint32_t shared_bytes, bool trace) {
  bool fits = variant_info(params.variant).matrix && dtype == DType::f16 && !kv.own_kv() &&
              dims.d % 16 == 0 && dims.dv % 16 == 0 && dims.d <= 128 && dims.dv <= 128 &&
              params.block_rows == 0 && params.block_keys == 0 &&
              coopmat_keys(shared_bytes, dims.d, dims.dv) > 0;
  if (params.tile_layout == TileLayout::cooperative_matrix) {
    if (!impl.coopmat_enabled)
      throw Error(
          "tile_layout cooperative_matrix needs VK_NV_cooperative_matrix (16x16x16 fp16 "
          "products into fp32, a subgroup of 32), shaderFloat16 and vulkanMemoryModel "
          "with device scope enabled; " +
          impl.info.name + " does not have them");
    if (!fits)
      throw Error(
          "tile_layout cooperative_matrix runs flash1, flash2, flashd and splitkv on fp16 "
          "Q, K and V with d and dv multiples of 16 up to 128, tile sizes chosen by the "
          "engine (block_rows and block_keys 0) and shared memory for the tiles");
    return !trace;  // traces record from the shared-memory kernels
  }
  return params.tile_layout == TileLayout::automatic && impl.coopmat_enabled && fits && !trace;
}

// TileLayout::lanes (shaders/splitkv_lanes.comp): lanes per key, so that each lane loads 16
// bytes of a key row at a time (4 floats, 8 halves, 16 q8_0 or 32 q4_0 quants); the most that
// divide both d and dv into whole loads, a power of two no larger than the subgroup. 0 when d or
// dv is not a whole number of loads.
uint32_t lane_vec(DType storage) {  // values of one 16-byte load
  switch (storage) {
    case DType::f32:
      return 4;
    case DType::q8_0:
      return 16;
    case DType::q4_0:
      return 32;
    default:
      return 8;
  }
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

// Invocations of a lanes workgroup: 64, or fewer where its clusters' merge would not fit the
// shared memory; never fewer than one cluster.
uint32_t lanes_workgroup(uint32_t lanes, uint32_t rows, uint32_t dv, uint32_t shared_bytes) {
  uint32_t size = std::max(64u, lanes);
  while (size > lanes && (size / lanes) * rows * (dv + 2) * 4 > shared_bytes) size /= 2;
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
                params.block_rows == 0 && params.block_keys <= kLaneKeys;
  if (params.tile_layout == TileLayout::lanes) {
    if (!usable)
      throw Error(
          "tile_layout lanes runs splitkv with workgroups sized by the engine (block_rows 0), "
          "block_keys (keys a cluster of lanes takes a step) at most " +
          std::to_string(kLaneKeys) + ", on devices with subgroup shuffles, d a multiple of " +
          std::to_string(lane_vec(kv.k)) + " and dv a multiple of " +
          std::to_string(lane_vec(kv.v)) + " (16-byte loads of K stored as " + dtype_name(kv.k) +
          " and V as " + dtype_name(kv.v) + "); " + info.name + " with this call does not qualify");
    return !trace;  // traces record from the shared-memory kernels
  }
  // At most four loads and 32 values of a row a lane, lest the registers spill.
  auto fits_lanes = [&](uint32_t width, DType storage) {
    return width <= std::min(4 * lane_vec(storage), 32u) * lanes;
  };
  uint64_t rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;  // per KV head
  bool fits = rows <= kLaneRows && rows * (dims.dv + 2) * 4 <= shared_bytes &&
              fits_lanes(dims.d, kv.k) && fits_lanes(dims.dv, kv.v);
  return params.tile_layout == TileLayout::automatic && usable && fits && params.block_keys == 0 &&
         !trace && info.type != "cpu";
}

// TileLayout::blocks (tile.glsl, BLOCK_TILE). A row group of `lanes` invocations shares 4 query
// rows, each taking dv / lanes output columns (a multiple of 4): 8 where dv allows, so that a
// row's reductions are three shuffles. The shared memory holds the queries [d][Br], K [d][Bc] and
// V [Bc][dv] (or V in K's place once the scores are done), P [Bc][Br], the workgroup's key range
// and, without subgroup operations, a float per invocation for the row reductions.
uint32_t block_lanes(const DeviceInfo& info, const Dims& dims, bool shuffle) {
  for (uint32_t lanes : {8u, 4u, 2u, 1u})
    if (dims.dv % (4 * lanes) == 0 && (!shuffle || lanes <= info.subgroup_size)) return lanes;
  return 0;
}

uint64_t block_bytes(const Dims& dims, uint32_t br, uint32_t bc, bool share_kv,
                     uint32_t invocations, bool shuffle) {
  uint64_t kv = share_kv ? std::max(dims.d, dims.dv) : dims.d + dims.dv;
  return 4 * (uint64_t(dims.d) * br + kv * bc + uint64_t(bc) * br) + (shuffle ? 0 : 4 * invocations) +
         8;
}

// The register blocks' tiles: the most rows that fit, then the most keys, then K and V apart (one
// barrier less a tile); block_rows and block_keys fix Br and Bc. False when none fits (or the
// shape cannot have blocks). Rows first: on an H100 (fp32, B=1 H=8 N=4096) 64 x 32 took 2.8 ms
// at d=64 against 6.8-7.4 for 32 x 32 and 32 x 64, and 64 x 16 took 8.0 ms at d=128 against 15.0
// for 32 x 32 (fewer, larger workgroups: one wave over the SMs, each K/V tile serving more rows).
bool size_blocks(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                 uint32_t shared_bytes, Spec& spec) {
  bool shuffle = info.subgroup_shuffle;
  uint32_t lanes = block_lanes(info, dims, shuffle);
  if (lanes == 0 || dims.d % 4 != 0) return false;
  uint32_t max_invocations = std::min(info.max_workgroup_invocations, 1024u);
  uint64_t best_score = 0;
  for (uint32_t br : {64u, 32u, 16u, 8u, 4u}) {
    if (params.block_rows && br != params.block_rows) continue;
    uint32_t invocations = br / 4 * lanes;
    if (invocations > max_invocations) continue;
    for (uint32_t bc : {64u, 32u, 16u, 8u, 4u}) {
      if (params.block_keys && bc != params.block_keys) continue;
      if (bc % lanes != 0) continue;
      for (bool share : {false, true}) {
        if (block_bytes(dims, br, bc, share, invocations, shuffle) > shared_bytes) continue;
        uint64_t score = uint64_t(br) * 1000 + bc * 10 + (share ? 0 : 1);
        if (score <= best_score) continue;
        best_score = score;
        spec.rows = invocations;
        spec.keys = bc;
        spec.group_rows = 4;
        spec.lanes_per_key = lanes;
        spec.block_shuffle = shuffle;
        spec.v_at = share ? 0 : dims.d * bc / 4;
        spec.kv_vec4 = (share ? std::max(dims.d, dims.dv) : dims.d + dims.dv) * bc / 4;
      }
    }
  }
  spec.blocks = best_score > 0;
  return spec.blocks;
}

// Register blocks where they are asked for, or by default on GPUs (where the cooperative-matrix
// kernel, chosen before, does not run), unless block_rows or block_keys ask for shared tiles.
bool use_blocks(const DeviceInfo& info, const Dims& dims, const AttentionParams& params,
                uint32_t shared_bytes, bool trace, Spec& spec) {
  bool fused = variant_info(params.variant).fused;
  if (params.tile_layout == TileLayout::blocks) {
    if (!fused) throw Error("tile_layout blocks applies to the fused variants, not naive");
    if (params.block_rows && params.block_rows % 4 != 0)
      throw Error("with tile_layout blocks, block_rows (query rows of a workgroup) must be a "
                  "multiple of 4 from 4 to 64");
    if (!size_blocks(info, dims, params, shared_bytes, spec))
      throw Error(
          "tile_layout blocks needs d a multiple of 4 and dv of 16 (or 4, 8 with fewer "
          "invocations a row group), block_rows and block_keys among 4, 8, 16, 32, 64 (or 0), "
          "and its tiles within the shared memory (" +
          std::to_string(shared_bytes) + " bytes) and " +
          std::to_string(info.max_workgroup_invocations) + " invocations; d=" +
          std::to_string(dims.d) + ", dv=" + std::to_string(dims.dv) + " on " + info.name +
          " does not fit");
    if (trace) spec.blocks = false;  // traces record from the shared-memory kernels
    return spec.blocks;
  }
  return params.tile_layout == TileLayout::automatic && fused && !trace && info.type != "cpu" &&
         params.block_rows == 0 && params.block_keys == 0 &&
         size_blocks(info, dims, params, shared_bytes, spec);
}

// Tile sizes from the device: Br rows per workgroup, and as many keys per tile as the K and V
// tiles can hold in shared memory. Only Vulkan's guaranteed minimums are assumed (16 KiB shared,
// 128 invocations); a device with more shared memory gets longer tiles.
Spec choose_spec(const ContextImpl& impl, const Dims& dims, const AttentionParams& params,
                 DType dtype, const Storage& kv, bool kv_views, uint32_t forced_keys, bool trace) {
  const DeviceInfo& info = impl.info;
  Spec spec;
  spec.d = dims.d;
  spec.dv = dims.dv;
  uint32_t limit = params.max_shared_memory ? params.max_shared_memory : info.max_shared_memory;
  uint32_t shared_bytes = std::min({limit, info.max_shared_memory, 48u * 1024u});
  spec.kv_quant = kv.own_kv();
  spec.k_format = static_cast<uint32_t>(kv.k);
  spec.v_format = static_cast<uint32_t>(kv.v);
  if (!forced_keys && use_lanes(info, dims, params, kv, shared_bytes, trace)) {
    spec.lanes = true;
    spec.lanes_per_key = lanes_per_key(info, dims, kv);
    uint64_t rows = uint64_t(dims.heads / dims.kv_heads) * dims.nq;
    spec.group_rows = static_cast<uint32_t>(std::min<uint64_t>(rows, kLaneRows));
    spec.rows = lanes_workgroup(spec.lanes_per_key, spec.group_rows, dims.dv, shared_bytes);
    spec.keys = params.block_keys ? params.block_keys : kLaneKeys;  // keys a cluster takes a step
    if ((spec.rows / spec.lanes_per_key) * spec.group_rows * (dims.dv + 2) * 4 > shared_bytes)
      throw Error("tile_layout lanes needs " + std::to_string(spec.group_rows * (dims.dv + 2) * 4) +
                  " bytes of shared memory for one cluster's output; this device or "
                  "max_shared_memory allows " +
                  std::to_string(shared_bytes));
    return spec;
  }
  if (!forced_keys && use_coopmat(impl, dims, params, dtype, kv, shared_bytes, trace)) {
    spec.coopmat = true;
    spec.rows = 128;  // four subgroups of 32, 16 query rows each
    spec.keys = coopmat_keys(shared_bytes, dims.d, dims.dv);
    return spec;
  }
  if (!forced_keys) {
    Spec blocks = spec;
    if (use_blocks(info, dims, params, shared_bytes, trace, blocks)) return blocks;
  }
  spec.rows = params.block_rows ? params.block_rows : 64;
  uint32_t max_rows = std::min(info.max_workgroup_invocations, 1024u);
  if (spec.rows > max_rows)
    throw Error("block_rows " + std::to_string(spec.rows) + " exceeds the device's " +
                "maxComputeWorkGroupInvocations (" + std::to_string(max_rows) + ")");
  if (use_registers(info, dims, params, kv, kv_views, spec.rows, trace)) {
    spec.registers = true;
    spec.keys = info.subgroup_size;
    size_register_tiles(spec, info, dims, params.block_rows == 0);
    return spec;
  }
  uint32_t budget = shared_bytes - 64u;
  uint32_t max_keys = budget / (4u * (dims.d + dims.dv));
  uint32_t keys = forced_keys ? forced_keys : params.block_keys;
  if (keys == 0) keys = std::min(64u, max_keys);
  if (keys > max_keys)
    throw Error("block_keys " + std::to_string(keys) + " with d=" + std::to_string(dims.d) +
                ", dv=" + std::to_string(dims.dv) + " needs " +
                std::to_string(4u * keys * (dims.d + dims.dv)) + " bytes of shared memory; the " +
                "device's maxComputeSharedMemorySize is " + std::to_string(info.max_shared_memory));
  spec.keys = keys;
  return spec;
}

}  // namespace

// The score modifiers, checked and handed to the kernels: the window (causal folded in) and the
// softcap as push constants, which of them are compiled in as Spec::mods, and per (batch, head)
// the ALiBi slope and the sink logit in one small buffer.
void set_modifiers(Plan& plan) {
  const AttentionParams& p = plan.params;
  const Dims& d = plan.dims;
  auto side = [&](int64_t w, const char* name) {
    if (w < -1)
      throw Error(std::string(name) + " must be -1 (unbounded) or at least 0; got " +
                  std::to_string(w));
    return w < 0 ? -1 : static_cast<int32_t>(std::min<int64_t>(w, int64_t(plan.most_keys) + d.nq));
  };
  side(p.window_left, "window_left");
  side(p.window_right, "window_right");  // checked even where causal overrides it
  Window w = effective_window(p);
  plan.push.window_left = side(w.left, "window_left");
  plan.push.window_right = side(w.right, "window_right");

  if (!std::isfinite(p.softcap) || p.softcap < 0)
    throw Error("softcap must be 0 (off) or a positive number; got " + std::to_string(p.softcap));
  if (p.softcap > 0) {
    plan.spec.mods |= kModSoftcap;
    plan.push.softcap = p.softcap;
  }

  if (!std::isfinite(p.alibi_max_bias) || p.alibi_max_bias < 0)
    throw Error("alibi_max_bias must be 0 (off) or a positive number; got " +
                std::to_string(p.alibi_max_bias));
  if (!p.alibi_slopes.empty() && p.alibi_max_bias > 0)
    throw Error("give ALiBi's slopes or its max_bias, not both");
  const std::vector<float>& slopes = p.alibi_slopes;
  bool alibi = !slopes.empty() || p.alibi_max_bias > 0;
  uint64_t rows = uint64_t(d.batch) * d.heads;
  if (!slopes.empty() && slopes.size() != d.heads && slopes.size() != rows)
    throw Error("alibi_slopes has " + std::to_string(slopes.size()) +
                " entries; expected one per query head (H = " + std::to_string(d.heads) +
                ") or per batch and head (B * H = " + std::to_string(rows) + ")");
  if (!p.sinks.empty() && p.sinks.size() != d.heads)
    throw Error("sinks has " + std::to_string(p.sinks.size()) +
                " entries; expected one per query head (H = " + std::to_string(d.heads) + ")");
  for (const std::vector<float>* values : {&slopes, &p.sinks})
    for (float x : *values)
      if (!std::isfinite(x))
        throw Error(std::string(values == &slopes ? "alibi_slopes" : "sinks") +
                    " must be finite numbers; got " + std::to_string(x));
  if (!alibi && p.sinks.empty()) return;
  if (alibi) plan.spec.mods |= kModAlibi;
  if (!p.sinks.empty()) plan.spec.mods |= kModSinks;
  std::vector<float> table(2 * rows, 0.0f);
  for (uint64_t bh = 0; bh < rows; ++bh) {
    uint32_t b = static_cast<uint32_t>(bh / d.heads), h = static_cast<uint32_t>(bh % d.heads);
    table[2 * bh] = alibi_slope(p, d.heads, b, h);
    if (!p.sinks.empty()) table[2 * bh + 1] = p.sinks[h];
  }
  plan.heads = plan.scratch(table.size() * 4);
  plan.heads.write(table.data(), table.size() * 4);
  plan.bindings[kHeads] = plan.heads.handle();
}

// The fused kernels' tile bitmap (common.glsl next_seen_tile): for each workgroup (x: a block of
// spec.block() packed rows, y: batch and KV head, as plan_fused and splitkv dispatch) a bit per
// tile of spec.keys keys, set where a row of the block has a finite mask entry in the tile. Every
// invocation of a workgroup reads the same bit, so fully masked tiles are skipped together, in
// the middle of a row's keys too (the ranges cut only the ends).
namespace {

void set_mask_tiles(Plan& plan, std::vector<uint32_t>& words, const std::vector<int64_t>& shape) {
  const Dims& d = plan.dims;
  const HostTensor& m = plan.params.mask;
  uint64_t tiles = (d.nk + plan.spec.keys - 1) / plan.spec.keys, per_row = (tiles + 31) / 32;
  uint64_t mask_rows = uint64_t(shape[0]) * uint64_t(shape[1]) * d.nq;
  std::vector<uint32_t> row_bits(mask_rows * per_row, 0);
  for (uint64_t r = 0; r < mask_rows; ++r)
    for (uint32_t j = 0; j < d.nk; ++j)
      if (m.data[r * d.nk + j] != -std::numeric_limits<float>::infinity()) {
        uint64_t t = j / plan.spec.keys;
        row_bits[r * per_row + t / 32] |= 1u << (t % 32);
      }
  uint32_t group = d.heads / d.kv_heads, block = plan.spec.block();
  uint64_t packed = uint64_t(group) * d.nq, blocks = (packed + block - 1) / block;
  plan.push.mask_tiles = static_cast<uint32_t>(words.size());
  words.resize(words.size() + uint64_t(d.batch) * d.kv_heads * blocks * per_row, 0);
  uint32_t* out = words.data() + plan.push.mask_tiles;
  for (uint32_t b = 0; b < d.batch; ++b)
    for (uint32_t hkv = 0; hkv < d.kv_heads; ++hkv)
      for (uint64_t x = 0; x < blocks; ++x, out += per_row)
        for (uint64_t r = x * block; r < std::min(packed, (x + 1) * block); ++r) {
          uint64_t h = hkv * group + r / d.nq, i = r % d.nq;
          uint64_t row = b * plan.push.mask_bstride + h * plan.push.mask_hstride + i;
          for (uint64_t w = 0; w < per_row; ++w) out[w] |= row_bits[row * per_row + w];
        }
}

}  // namespace

// The key mask [B, Nk] and the additive mask, in one buffer of 32-bit words (common.glsl's
// mask_buf): the key mask from word 0, then per row of the additive mask its first and last+1
// finite key (so that keys outside are never read), the fused kernels' tile bitmap
// (set_mask_tiles), then the additive mask's values.
void set_masks(Plan& plan) {
  const AttentionParams& p = plan.params;
  const Dims& d = plan.dims;
  std::vector<uint32_t> words;
  if (!p.key_mask.empty()) {
    if (p.key_mask.size() != uint64_t(d.batch) * d.nk)
      throw Error("key_mask has " + std::to_string(p.key_mask.size()) +
                  " entries; expected batch * Nk = " + std::to_string(uint64_t(d.batch) * d.nk));
    words.assign(p.key_mask.begin(), p.key_mask.end());
    plan.spec.key_mask = true;
  }
  if (const PageTable* pages = plan.options.pages) {  // common.glsl seq_pages, paged_row
    plan.push.page_table = static_cast<uint32_t>(words.size());
    words.insert(words.end(), pages->indptr.begin(), pages->indptr.end());
    words.insert(words.end(), pages->last_page_len.begin(), pages->last_page_len.end());
    words.insert(words.end(), pages->indices.begin(), pages->indices.end());
    words.push_back(0);  // a sequence without pages looks its keys up here (never weighed)
  }
  const HostTensor& m = p.mask;
  if (!m.shape.empty() || !m.data.empty()) {
    std::string want = "[Nq, Nk] = [" + std::to_string(d.nq) + ", " + std::to_string(d.nk) +
                       "] or [B or 1, H or 1, Nq, Nk]";
    auto shape = m.shape;
    if (shape.size() == 2) shape.insert(shape.begin(), {1, 1});
    if (shape.size() != 4 || shape[2] != d.nq || shape[3] != d.nk ||
        (shape[0] != 1 && shape[0] != d.batch) || (shape[1] != 1 && shape[1] != d.heads))
      throw Error("mask has shape " + shape_string(m.shape) + "; expected " + want);
    if (int64_t(m.data.size()) != numel(m.shape))
      throw Error("mask has " + std::to_string(m.data.size()) + " values for shape " +
                  shape_string(m.shape));
    uint64_t rows = uint64_t(shape[0]) * uint64_t(shape[1]) * d.nq;
    uint32_t stride = (d.nk + 3) / 4 * 4;  // rows padded to 4 keys (-inf): RGBA texels
    uint64_t total = words.size() + 2 * rows + 64 + rows * stride;
    if (total * 4 > plan.ctx.device().max_storage_buffer_range)
      throw Error("mask of shape " + shape_string(m.shape) + " needs " + std::to_string(total * 4) +
                  " bytes, more than the device's " + "maxStorageBufferRange (" +
                  std::to_string(plan.ctx.device().max_storage_buffer_range) + " bytes)");
    plan.push.mask_bstride = shape[0] == 1 ? 0 : static_cast<uint32_t>(shape[1]) * d.nq;
    plan.push.mask_hstride = shape[1] == 1 ? 0 : d.nq;
    plan.push.mask_ranges = static_cast<uint32_t>(words.size());
    words.resize(words.size() + 2 * rows);
    for (uint64_t r = 0; r < rows; ++r) {
      uint32_t first = d.nk, last = 0;  // the row's finite keys: [first, last)
      for (uint32_t j = 0; j < d.nk; ++j) {
        float x = m.data[r * d.nk + j];
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity())
          throw Error("mask holds " + std::string(std::isnan(x) ? "NaN" : "+inf") + " in row " +
                      std::to_string(r) + ", key " + std::to_string(j) +
                      "; it takes finite values and -inf (hidden)");
        if (x != -std::numeric_limits<float>::infinity()) first = std::min(first, j), last = j + 1;
      }
      words[plan.push.mask_ranges + 2 * r] = first;
      words[plan.push.mask_ranges + 2 * r + 1] = last;
    }
    if (variant_info(p.variant).fused && !plan.spec.coopmat && !plan.spec.lanes)
      set_mask_tiles(plan, words, shape);
    // The values last, from 256 bytes on (the largest minTexelBufferOffsetAlignment there is):
    // register tiles read them through a texel view from there to the end.
    plan.push.mask_values = static_cast<uint32_t>((words.size() + 63) / 64 * 64);
    total = plan.push.mask_values + rows * stride;
    if (total * 4 > plan.ctx.device().max_storage_buffer_range)
      throw Error("mask of shape " + shape_string(m.shape) + " with its tile bitmap needs " +
                  std::to_string(total * 4) + " bytes, more than the device's " +
                  "maxStorageBufferRange (" +
                  std::to_string(plan.ctx.device().max_storage_buffer_range) + " bytes)");
    words.resize(total, std::bit_cast<uint32_t>(-std::numeric_limits<float>::infinity()));
    for (uint64_t r = 0; r < rows; ++r)
      std::memcpy(words.data() + plan.push.mask_values + r * stride, m.data.data() + r * d.nk,
                  d.nk * 4);
    plan.spec.mods |= kModMask;
  }
  if (words.empty()) return;
  plan.mask = plan.scratch(words.size() * 4);
  plan.mask.write(words.data(), words.size() * 4);
  plan.bindings[kMask] = plan.mask.handle();
}

Range binding(const Tensor& t) {
  if (!t.is_view()) return Range(t.buffer());
  if (t.bytes() == 0) return Range(t.context()->impl().dummy.handle());  // nothing to read
  return Range(t.buffer(), t.offset(), t.bytes());
}

namespace {

// Whether a texel view of `t` can be made: its buffer's usage and its offset's alignment.
bool texel_viewable(const Tensor& t) {
  uint64_t align = t.context()->device().min_texel_offset_alignment;
  return (t.usage() & VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT) &&
         (align <= 1 || t.offset() % align == 0);
}

}  // namespace

// The constructors delegate to Plan(Context&), which creates the pools: once it has returned,
// a throw from their bodies runs ~Plan, which frees whatever was made so far.
Plan::Plan(Context& context, const Tensor& q, const Tensor& k, const Tensor& v,
           const AttentionParams& p, const PlanOptions& opts)
    : Plan(context) {
  params = p;
  options = opts;
  if (q.empty() || k.empty() || v.empty()) throw Error("attention: q, k and v must be set");
  if (q.context() != &ctx || k.context() != &ctx || v.context() != &ctx)
    throw Error("attention: q, k and v must live on the context they are used with");
  dtype = q.dtype();
  if (dtype != DType::f32 && dtype != DType::f16)
    throw Error(std::string("attention: Q is stored as f32 or f16 (got ") + dtype_name(dtype) +
                "); bf16, q8_0 and q4_0 are storage types for K and V");
  kv = Storage{dtype, k.dtype(), v.dtype()};
  if (q.is_prefix()) throw Error("attention: Q must be dense; prefix() views are for K and V");
  if (options.pages) {
    if (k.is_prefix() || v.is_prefix())
      throw Error("paged attention: K and V are whole tensors of pages, not prefix() views");
    dims = check_paged_shapes(q.shape(), k.shape(), v.shape(), *options.pages);
    check_paged();
  } else {
    dims = check_shapes(q.shape(), k.shape(), v.shape());
    if (k.row_capacity() != v.row_capacity())
      throw Error("attention: K and V are prefixes of caches of " +
                  std::to_string(k.row_capacity()) + " and " + std::to_string(v.row_capacity()) +
                  " keys a head; they must be alike");
    dims.kv_rows = static_cast<uint32_t>(k.row_capacity());
    dims.kv_keys = uint64_t(dims.batch) * dims.kv_heads * dims.kv_rows;
  }
  appends = options.append.k != nullptr;
  if (appends) check_append(q, k, v);
  bool rotates_k = params.rope != RopeLayout::none && !appends;  // a rotated copy of all of K
  if (rotates_k && dims.kv_rows != dims.nk)
    throw Error("attention: rope rotates a dense K; rotate K before it goes into the cache");
  most_keys = options.dynamic_keys || appends ? dims.kv_rows : dims.nk;
  uint64_t keys = dims.kv_keys;
  if (keys > 0xffffffffull || (kv.own_kv() && keys * std::max(dims.d, dims.dv) > 0xffffffffull))
    throw Error("K and V stored as " + std::string(dtype_name(kv.k)) + "/" + dtype_name(kv.v) +
                " are indexed by 32-bit value counts: " + std::to_string(keys) +
                " keys of d = " + std::to_string(std::max(dims.d, dims.dv)) +
                " are more than 2^32 values; split the batch");
  if (rotates_k && kv.k != dtype)
    throw Error(std::string("attention: rope rotates K stored as Q is (") + dtype_name(dtype) +
                "); rotate K before storing it as " + dtype_name(kv.k) +
                " (the CLI: --rope needs --kv-dtype equal to --dtype)");
  // With RoPE the kernels read the rotated copy of K, which is the plan's own.
  bool kv_views = (rotates_k || texel_viewable(k)) && texel_viewable(v);
  spec = choose_spec(impl, dims, params, dtype, kv, kv_views, options.keys, options.trace);
  if (options.pages) spec.page_size = options.pages->page_size;
  if (params.scale && !std::isfinite(*params.scale))
    throw Error("attention: scale must be a finite number");

  lengths = Buffer(impl, 16, true);
  if (appends)
    set_position(0);
  else
    set_keys(dims.nk);

  push = Push{.batch = dims.batch,
              .heads = dims.heads,
              .kv_heads = dims.kv_heads,
              .nq = dims.nq,
              .nk = dims.nk,
              .scale = params.scale.value_or(1.0f / std::sqrt(static_cast<float>(dims.d))),
              .flags = 0,
              .splits = 1,
              .keys_per_split = 0,
              .trace_bh = options.trace_bh,
              .trace_row = options.trace_row,
              .bh0 = 0,
              .window_left = -1,
              .window_right = -1,
              .softcap = 0.0f,
              .mask_ranges = 0,
              .mask_values = 0,
              .mask_bstride = 0,
              .mask_hstride = 0,
              .mask_tiles = 0,
              .kv_rows = dims.kv_rows,
              .kv_keys = static_cast<uint32_t>(dims.kv_keys),
              .page_table = 0};
  if (params.want_lse) push.flags |= kFlagLse;
  if (options.trace) push.flags |= kFlagTrace;

  bindings.fill(impl.dummy.handle());
  bindings[kQ] = binding(q);
  bindings[kK] = binding(k);
  bindings[kV] = binding(v);
  if (appends) {
    plan_append(q, k, v);
  } else if (rotates_k) {
    int64_t first = params.query_position.value_or(int64_t(dims.nk) - int64_t(dims.nq));
    plan_rope(*this, q, q_rot, first);
    plan_rope(*this, k, k_rot, 0);
    add_barrier();
    bindings[kQ] = binding(q_rot);
    bindings[kK] = binding(k_rot);
  }
  set_modifiers(*this);
  set_masks(*this);
  if (options.outputs.lse && !params.want_lse)
    throw Error("attention: an LSE output was given with want_lse false");
  out = output(options.outputs.out, dims.out_shape, "O");
  bindings[kO] = binding(out);
  if (params.want_lse) {
    lse = output(options.outputs.lse, dims.lse_shape, "LSE");
    bindings[kLse] = binding(lse);
  }
  if (options.trace) {
    uint32_t records =
        variant_info(params.variant).fused ? (dims.nk + spec.keys - 1) / spec.keys : dims.nk;
    trace = Buffer(impl, uint64_t(std::max(records, 1u)) * (6 + dims.dv) * 4);
    trace.fill(0x7fc00000u);  // NaN marks what a kernel did not record
    bindings[kTrace] = trace.handle();
  }
  check_binding(q_rot.empty() ? q : q_rot, "Q");
  check_binding(out, "O");
  if (spec.registers) {
    make_texel_views();
    // The kernels read K and V through the views only; the storage slots get the placeholder,
    // so K and V may exceed maxStorageBufferRange.
    bindings[kK] = bindings[kV] = impl.dummy.handle();
  } else {
    check_binding(k_rot.empty() ? k : k_rot, "K");
    check_binding(v, "V");
  }

  const VariantInfo& info = variant_info(params.variant);
  if (!info.fused)
    plan_naive(*this);
  else if (info.splits_keys)
    plan_splitkv(*this);
  else
    plan_fused(*this, info.name);
}

Tensor Plan::output(const Tensor* given, const std::vector<int64_t>& shape, const char* name) {
  if (!given) {
    Tensor t(ctx, shape, DType::f32);
    device_bytes += t.bytes();
    return t;
  }
  const Tensor& t = *given;
  if (t.empty() || t.context() != &ctx)
    throw Error(std::string("attention: the ") + name + " output must be a tensor on this context");
  if (t.dtype() != DType::f32 || t.shape() != shape || t.is_prefix())
    throw Error(std::string("attention: the ") + name + " output is " + dtype_name(t.dtype()) +
                " " + shape_string(t.shape()) + "; attention writes f32 " + shape_string(shape));
  return Tensor::view(ctx, t.buffer(), t.offset(), shape, DType::f32, t.usage());
}

Plan::Plan(Context& context, const Tensor& x, const RopeParams& rope) : Plan(context) {
  if (x.empty() || x.context() != &ctx) throw Error("rope: x must be a tensor on this context");
  if (x.shape().size() < 2) throw Error("rope: x must have rank 2 or more ([.., N, d])");
  if (x.is_prefix()) throw Error("rope: x must be dense, not a prefix() of a longer tensor");
  if (rope.layout == RopeLayout::none) throw Error("rope: layout must be interleaved or half");
  params.rope = rope.layout;
  params.rope_base = rope.base;
  dtype = x.dtype();
  if (dtype != DType::f32 && dtype != DType::f16)
    throw Error(std::string("rope rotates f32 or f16 tensors; x is ") + dtype_name(dtype) +
                " (rotate before quantising)");
  plan_rope(*this, x, out, rope.position_offset);
}

Plan::Plan(Context& context) : ctx(context), impl(context.impl()) {
  create_pools();
}

uint64_t Plan::loop_iterations(uint64_t keys) const {
  uint64_t tiles = (keys + spec.keys - 1) / spec.keys;
  uint64_t chunks = spec.registers || spec.lanes || spec.blocks ? 0 : spec.keys;  // shared: a key
  uint64_t passes = variant_info(params.variant).passes;
  uint64_t iterations = passes * tiles * (1 + chunks) + 64;  // tile and chunk loops, set-up
  // With the tile bitmap, next_seen_tile's loop: once a tile walked, once a word of 32 skipped.
  if (push.mask_tiles) iterations += passes * (tiles + tiles / 32 + 2);
  return iterations;
}

void Plan::check_loop_budget(uint64_t keys) const {
  if (!impl.loop_limited || loop_iterations(keys) <= kLoopBudget) return;
  throw Error(std::string(variant_name(params.variant)) + " over " + std::to_string(keys) +
              " keys with tiles of " + std::to_string(spec.keys) + " needs about " +
              std::to_string(loop_iterations(keys)) + " loop iterations per invocation, but " +
              ctx.device().name +
              " (llvmpipe) stops every shader loop after 65535; use splitkv, "
              "which splits the keys to fit, or fewer keys");
}

void Plan::create_pools() {
  VkDescriptorPoolSize sizes[] = {{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 8 * kBindings},
                                  {VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, 8 * kTexelBindings},
                                  {VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER, 8}};
  VkDescriptorPoolCreateInfo pool_info{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pool_info.maxSets = 8;  // at most 4 so far: RoPE's or an append's 3 and attention's 1
  pool_info.poolSizeCount = 3;
  pool_info.pPoolSizes = sizes;
  check(vkCreateDescriptorPool(impl.device, &pool_info, nullptr, &pool_), "vkCreateDescriptorPool");
  objects_created();
  if (impl.timestamp_bits > 0 && ctx.device().timestamps) {
    VkQueryPoolCreateInfo query_info{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    query_info.queryType = VK_QUERY_TYPE_TIMESTAMP;
    query_info.queryCount = 2;
    check(vkCreateQueryPool(impl.device, &query_info, nullptr, &queries_), "vkCreateQueryPool");
    objects_created();
  }
}

// K and V as RGBA texels, and the additive mask's values as RGBA32F texels (a view of the dummy
// buffer without one): llvmpipe gathers texels per lane without the loop a storage buffer costs.
// K and V in storage formats of their own (Storage::own_kv) as 32-bit words (word_texel_format),
// decoded by the kernels.
void Plan::make_texel_views() {
  VkFormat format =
      dtype == DType::f16 ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
  VkFormat k_format = format, v_format = format;
  if (kv.own_kv()) k_format = word_texel_format(kv.k), v_format = word_texel_format(kv.v);
  auto keys = static_cast<int64_t>(dims.kv_keys);
  struct View {
    VkBuffer buffer;
    VkFormat format;
    uint64_t offset, bytes;
  };
  View views[kTexelBindings] = {
      {bindings[kK].buffer, k_format, bindings[kK].offset, buffer_bytes(kv.k, keys * dims.d)},
      {bindings[kV].buffer, v_format, bindings[kV].offset, buffer_bytes(kv.v, keys * dims.dv)},
      {impl.dummy.handle(), VK_FORMAT_R32G32B32A32_SFLOAT, 0, 16}};
  if (spec.mods & kModMask)  // four keys a texel, from the values' first word (256-byte aligned)
    views[2] = {mask.handle(), VK_FORMAT_R32G32B32A32_SFLOAT, uint64_t(push.mask_values) * 4,
                mask.bytes() - uint64_t(push.mask_values) * 4};
  for (uint32_t i = 0; i < kTexelBindings; ++i) {
    VkBufferViewCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    info.buffer = views[i].buffer;
    info.format = views[i].format;
    info.offset = views[i].offset;
    info.range = views[i].bytes;
    check(vkCreateBufferView(impl.device, &info, nullptr, &texel_views[i]), "vkCreateBufferView");
    objects_created();
  }
}

Plan::~Plan() {
  uint64_t destroyed = sets_;  // freed with their pool
  for (VkBufferView view : texel_views) {
    if (!view) continue;
    vkDestroyBufferView(impl.device, view, nullptr);
    ++destroyed;
  }
  if (queries_) {
    vkDestroyQueryPool(impl.device, queries_, nullptr);
    ++destroyed;
  }
  if (pool_) {
    vkDestroyDescriptorPool(impl.device, pool_, nullptr);
    ++destroyed;
  }
  objects_destroyed(destroyed);
}

std::string Plan::shader(const char* family) const {
  if (spec.coopmat) return std::string("flash_cm_") + family;
  if (spec.lanes) return std::string(family) + "_lanes" + (dtype == DType::f16 ? "_f16" : "_f32");
  return std::string(family) + (dtype == DType::f16 ? "_f16" : "_f32") +
         (spec.kv_quant ? "_kvq" : "") + (options.trace ? "_trace" : "") +
         (spec.registers ? "_reg" : "") + (spec.blocks ? (spec.block_shuffle ? "_blk" : "_blk_nosg") : "");
}

TileLayout Plan::tile_layout() const {
  if (spec.coopmat) return TileLayout::cooperative_matrix;
  if (spec.lanes) return TileLayout::lanes;
  if (spec.blocks) return TileLayout::blocks;
  return spec.registers ? TileLayout::registers : TileLayout::shared;
}

void Plan::check_binding(const Tensor& t, const char* name) const {
  uint64_t range = ctx.device().max_storage_buffer_range;
  if (t.bytes() <= range) return;
  throw Error(std::string(name) + " of shape " + shape_string(t.shape()) + " (" +
              std::to_string(t.bytes()) + " bytes) exceeds the device's maxStorageBufferRange of " +
              std::to_string(range) + " bytes" +
              (name == std::string("K") || name == std::string("V")
                   ? "; register tiles (docs/engine.md) lift this limit for K and V"
                   : ""));
}

Buffer Plan::scratch(uint64_t bytes) {
  uint64_t range = ctx.device().max_storage_buffer_range;
  if (bytes > range)
    throw Error("attention needs a scratch buffer of " + std::to_string(bytes) +
                " bytes, more than the device's maxStorageBufferRange (" + std::to_string(range) +
                " bytes)");
  device_bytes += bytes;
  return Buffer(impl, bytes);
}

VkDescriptorSet Plan::make_set(const Bindings& buffers) {
  VkDescriptorSetAllocateInfo alloc{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  alloc.descriptorPool = pool_;
  alloc.descriptorSetCount = 1;
  alloc.pSetLayouts = &impl.set_layout;
  VkDescriptorSet set = VK_NULL_HANDLE;
  check(vkAllocateDescriptorSets(impl.device, &alloc, &set), "vkAllocateDescriptorSets");
  objects_created();
  ++sets_;
  std::array<VkDescriptorBufferInfo, kBindings> infos{};
  std::array<VkWriteDescriptorSet, kBindings> writes{};
  for (uint32_t i = 0; i < kBindings; ++i) {
    infos[i] = {buffers[i].buffer, buffers[i].offset, buffers[i].bytes};
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstSet = set;
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &infos[i];
  }
  vkUpdateDescriptorSets(impl.device, kBindings, writes.data(), 0, nullptr);
  VkDescriptorBufferInfo length_info{lengths.handle() ? lengths.handle() : impl.dummy.handle(), 0,
                                     16};
  VkWriteDescriptorSet length_write{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
  length_write.dstSet = set;
  length_write.dstBinding = kLengthsBinding;
  length_write.descriptorCount = 1;
  length_write.descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER;
  length_write.pBufferInfo = &length_info;
  vkUpdateDescriptorSets(impl.device, 1, &length_write, 0, nullptr);
  if (!texel_views[0]) return set;
  std::array<VkWriteDescriptorSet, kTexelBindings> texel_writes{};
  for (uint32_t i = 0; i < kTexelBindings; ++i) {
    texel_writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    texel_writes[i].dstSet = set;
    texel_writes[i].dstBinding = kBindings + i;
    texel_writes[i].descriptorCount = 1;
    texel_writes[i].descriptorType = VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER;
    texel_writes[i].pTexelBufferView = &texel_views[i];
  }
  vkUpdateDescriptorSets(impl.device, kTexelBindings, texel_writes.data(), 0, nullptr);
  return set;
}

void Plan::check_groups(std::array<uint32_t, 3> groups) const {
  const char* axis[] = {"x", "y", "z"};
  for (int i = 0; i < 3; ++i)
    if (groups[i] > ctx.device().max_workgroup_count[i])
      throw Error(std::string("attention needs ") + std::to_string(groups[i]) +
                  " workgroups along " + axis[i] + ", more than the device's " +
                  "maxComputeWorkGroupCount[" + std::to_string(i) + "] (" +
                  std::to_string(ctx.device().max_workgroup_count[i]) + ")");
}

void Plan::add(VkPipeline pipeline, VkDescriptorSet set, std::array<uint32_t, 3> groups,
               const void* push_data, uint32_t push_bytes) {
  check_groups(groups);
  Dispatch d;
  d.pipeline = pipeline;
  d.set = set;
  d.groups = groups;
  if (!push_data) {
    push_data = &push;
    push_bytes = sizeof(Push);
  }
  std::memcpy(d.push.data(), push_data, push_bytes);
  d.push_bytes = push_bytes;
  steps_.push_back(d);
}

void Plan::set_keys(uint32_t n) {
  if (appends)
    throw Error(
        "attention: a recording that appends to a KV cache is told its position "
        "(set_position), and attends over the keys up to the appended ones");
  if (n > most_keys)
    throw Error("attention over " + std::to_string(n) + " keys, but " +
                (options.dynamic_keys ? "K and V hold at most " + std::to_string(most_keys) +
                                            " a head (their row_capacity())"
                                      : "this plan is for " + std::to_string(most_keys)));
  if (n != dims.nk && (spec.key_mask || (spec.mods & kModMask) || params.rope != RopeLayout::none))
    throw Error(
        "attention with a key mask, an additive mask or RoPE attends over the Nk it was "
        "recorded for (" +
        std::to_string(dims.nk) + "); record it again for " + std::to_string(n) + " keys");
  uint32_t words[4] = {n, 0, 0, 0};
  lengths.write(words, sizeof(words));
}

void Plan::set_position(uint32_t position) {
  if (!appends)
    throw Error(
        "attention: set_position is for a recording that appends to a KV cache; this one "
        "attends over K and V as given (set_keys)");
  uint64_t rows = dims.nq;  // as many appended as there are queries
  if (position + rows > dims.kv_rows)
    throw Error("attention: appending " + std::to_string(rows) + " rows at position " +
                std::to_string(position) + " overruns the KV cache's capacity of " +
                std::to_string(dims.kv_rows) + " tokens");
  uint32_t words[4] = {position + dims.nq, position, 0, 0};
  lengths.write(words, sizeof(words));
}

void Plan::check_paged() const {
  auto refuse = [](const std::string& what) { throw Error("paged attention: " + what); };
  if (!variant_info(params.variant).fused)
    refuse("naive materialises a score matrix of one Nk; use a fused variant");
  if (params.rope != RopeLayout::none) refuse("rope: rotate K before it goes into its page");
  if (!params.mask.shape.empty() || !params.mask.data.empty())
    refuse("an additive mask is [Nq, Nk] of one Nk; the sequences' lengths differ");
  if (!params.key_mask.empty())
    refuse("a key mask is [B, Nk] of one Nk; each sequence's length says which keys it has");
  if (options.append.k || options.dynamic_keys || options.trace)
    refuse("paged_attention() is a one-shot call");
}

void Plan::check_append(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Tensor* rows[2] = {options.append.k, options.append.v};
  const Tensor* cache[2] = {&k, &v};
  const char* names[2] = {"K", "V"};
  for (int i = 0; i < 2; ++i) {
    std::string name = std::string("attention: the new ") + names[i] + " rows";
    if (!rows[i] || rows[i]->empty() || rows[i]->context() != &ctx)
      throw Error(name + " must be a tensor on this context");
    const Tensor& t = *rows[i];
    if (t.is_prefix()) throw Error(name + " must be dense, not a prefix() view");
    if (cache[i]->is_prefix())
      throw Error(std::string("attention: the KV cache's ") + names[i] +
                  " must be the whole cache (its capacity), not a prefix() view");
    auto want = cache[i]->shape();
    want[want.size() - 2] = q.shape()[q.shape().size() - 2];
    if (t.shape() != want)
      throw Error(name + " are " + shape_string(t.shape()) + "; appending as many rows as Q has " +
                  "queries to this cache needs " + shape_string(want));
    DType stored = cache[i]->dtype();
    if (stored == DType::bf16)
      throw Error(
          "attention: appending to a bf16 KV cache is not supported; a cache that is appended "
          "to stores f32, f16, q8_0 or q4_0");
    bool quantised = stored == DType::q8_0 || stored == DType::q4_0;
    if (quantised ? t.dtype() != DType::f32 && t.dtype() != DType::f16 : t.dtype() != stored)
      throw Error(name + " are " + dtype_name(t.dtype()) + " but the cache stores " +
                  dtype_name(stored) + "; give them " +
                  (quantised ? "as f32 or f16 (they are quantised as they are appended)"
                             : "in the cache's dtype"));
  }
  if (!params.key_mask.empty() || !params.mask.data.empty())
    throw Error(
        "attention: a key mask or an additive mask covers a fixed number of keys; a recording "
        "that appends to a KV cache attends over more each step (use causal, a window, or "
        "AttentionRecording over prefix() views)");
  if (dims.nq > dims.kv_rows)
    throw Error("attention: appending " + std::to_string(dims.nq) + " rows (Q's queries) to a " +
                "KV cache of " + std::to_string(dims.kv_rows) + " tokens");
  if (params.query_position)
    throw Error(
        "attention: the queries of a recording that appends to a KV cache sit at the positions "
        "of the appended rows; leave query_position unset");
}

void Plan::plan_append(const Tensor& q, const Tensor& k, const Tensor& v) {
  VkBuffer angles = VK_NULL_HANDLE;
  uint32_t rotate = 0;
  if (params.rope != RopeLayout::none) {
    angles = plan_angles(*this, dims.kv_rows, dims.d, 0);  // one row per cache position
    rotate = kRowsRotate;
    q_rot = Tensor(ctx, q.shape(), q.dtype());
    device_bytes += q_rot.bytes();
    plan_rows(*this, q, q_rot, rotate | kAnglesAtPosition, angles);
    bindings[kQ] = binding(q_rot);
  }
  plan_rows(*this, *options.append.k, k, rotate | kRowsAtPosition | kAnglesAtPosition, angles);
  plan_rows(*this, *options.append.v, v, kRowsAtPosition, VK_NULL_HANDLE);
  add_barrier();
  options.append = {};  // the caller's tensors: bound above, not kept
}

void Plan::add_barrier() {
  steps_.push_back(Dispatch{});
}

void Plan::record(VkCommandBuffer cmd) {
  if (queries_) {
    vkCmdResetQueryPool(cmd, queries_, 0, 2);
    vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries_, 0);
  }
  for (const Dispatch& d : steps_) {
    if (!d.pipeline) {
      compute_barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                      VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);
      continue;
    }
    vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, d.pipeline);
    vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, impl.pipeline_layout, 0, 1, &d.set,
                            0, nullptr);
    vkCmdPushConstants(cmd, impl.pipeline_layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, d.push_bytes,
                       d.push.data());
    vkCmdDispatch(cmd, d.groups[0], d.groups[1], d.groups[2]);
  }
  if (queries_) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries_, 1);
  // Outputs become visible to whatever comes next: shaders, copies or the host.
  compute_barrier(cmd,
                  VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT |
                      VK_PIPELINE_STAGE_HOST_BIT,
                  VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                      VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_HOST_READ_BIT);
}

double Plan::gpu_ms() const {
  if (!queries_) return 0.0;
  uint64_t stamps[2] = {0, 0};
  VkResult r = vkGetQueryPoolResults(impl.device, queries_, 0, 2, sizeof(stamps), stamps,
                                     sizeof(uint64_t), VK_QUERY_RESULT_64_BIT);
  if (r != VK_SUCCESS) return 0.0;
  uint64_t valid = impl.timestamp_bits >= 64 ? ~0ull : ((1ull << impl.timestamp_bits) - 1);
  uint64_t ticks = (stamps[1] - stamps[0]) & valid;
  return double(ticks) * ctx.device().timestamp_period_ns * 1e-6;
}

}  // namespace flashvk::detail
