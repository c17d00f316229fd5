// The kernel builds (kernels.hpp): shaders/builds.def read as a constexpr table, checked at
// compile time against the variants' table, and the names the registry knows the builds by.
#include "kernels.hpp"

#include "flashvk/error.hpp"
#include "shader_registry.hpp"
#include "variants.hpp"

namespace flashvk::detail {

namespace {

namespace builds {
using namespace build_option;
constexpr KernelBuilds kTable[] = {
#define KERNEL(program, source, layout, options, defines, library) \
  {#program, #source, TileLayout::layout, options},
#include "../../shaders/builds.def"
#undef KERNEL
};
}  // namespace builds

constexpr const KernelBuilds* find(std::string_view program, TileLayout layout) {
  for (const KernelBuilds& b : builds::kTable)
    if (b.program == program && b.layout == layout) return &b;
  return nullptr;
}

// Whether builds.def builds `program` in `layout` for every value of `options`.
constexpr bool has(std::string_view program, TileLayout layout, uint32_t options) {
  const KernelBuilds* b = find(program, layout);
  return b && (b->options & options) == options;
}

// Every build the planner can ask for, from the variants' table: each fused variant in shared
// tiles (traced too), register tiles and register blocks, in fp32 and fp16, with K and V in
// formats of their own; the matrix variants on cooperative matrices; the variants that split the
// keys in the decoding layout, and their merge; naive's three passes; RoPE and the calibrations.
constexpr bool builds_cover_the_planner() {
  using namespace build_option;
  for (const VariantInfo& v : kVariants) {
    if (!v.fused) {
      if (!has("naive_scores", TileLayout::shared, Q | KVQ | TRACE) ||
          !has("naive_softmax", TileLayout::shared, TRACE) ||
          !has("naive_pv", TileLayout::shared, Q | KVQ | TRACE))
        return false;
      continue;
    }
    if (!has(v.name, TileLayout::shared, Q | KVQ | TRACE) ||
        !has(v.name, TileLayout::registers, Q | KVQ) ||
        !has(v.name, TileLayout::blocks, Q | KVQ | SG | F16))
      return false;
    if (v.matrix && !has(v.name, TileLayout::cooperative_matrix, MAT)) return false;
    if (v.splits_keys &&
        (!has(v.name, TileLayout::lanes, Q) || !has("splitkv_merge", TileLayout::shared, NONE)))
      return false;
  }
  return has("rope", TileLayout::shared, Q | QUANT) && has("peak_fma", TileLayout::shared, NONE) &&
         has("peak_bandwidth", TileLayout::shared, NONE) &&
         has("peak_coopmat", TileLayout::shared, MATHW);
}
static_assert(builds_cover_the_planner(),
              "shaders/builds.def lacks a build that the variants' table can ask for");

}  // namespace

std::string kernel_name(const KernelKey& key) {
  using namespace build_option;
  const KernelBuilds* b = find(key.program, key.layout);
  if (!b)
    throw Error("internal: shaders/builds.def has no " + std::string(key.program) + " build in " +
                tile_layout_name(key.layout) + " layout");
  std::string name(key.program);
  if (key.layout != TileLayout::shared) name += std::string("_") + tile_layout_name(key.layout);
  // Each option of the line adds its part; one it lacks, its build serves for every value (the
  // lanes and matrix kernels read every K/V format they take through K_FORMAT and V_FORMAT; the
  // matrix kernel takes fp16 Q alone; the tiling never gives a trace another layout than shared
  // tiles).
  auto part = [&](uint32_t option, bool set, const char* on, const char* off) {
    if (b->options & option) name += set ? on : off;
  };
  part(Q, key.q == DType::f16, "_f16", "_f32");
  part(KVQ, key.kv_quant, "_kvq", "");
  part(TRACE, key.trace, "_trace", "");
  part(SG, key.shuffle, "_sg", "_nosg");
  part(F16, key.f16math, "_f16math", "");
  part(QUANT, key.quant, "_quant", "");
  if (b->options & (MAT | MATHW)) {
    if (key.matrix == MatrixApi::khr) name += "_khr";
    else if (key.matrix == MatrixApi::nv) name += "_nv";
    else if (key.matrix == MatrixApi::nv2 && (b->options & MAT)) name += "_nv2";
    else if (key.matrix == MatrixApi::emulated && (b->options & MAT)) name += "_emu";
    else if (key.matrix == MatrixApi::emulated_nv2 && (b->options & MAT)) name += "_emunv2";
    else
      throw Error(std::string("internal: the ") + name + " build needs a matrix API, not " +
                  matrix_api_name(key.matrix));
  }
  return name;
}

KernelKey kernel_key(std::string_view program, const Spec& spec, DType q, bool trace) {
  return {.program = program,
          .layout = spec.layout,
          .q = q,
          .kv_quant = spec.kv_quant,
          .trace = trace,
          .shuffle = spec.block_shuffle,
          .f16math = spec.block_f16,
          .matrix = spec.matrix};
}

std::vector<PipelineChoice> attention_pipelines(Variant variant, const Spec& spec, DType q,
                                                const DeviceInfo& info, bool trace) {
  const VariantInfo& v = variant_info(variant);
  if (!v.fused) return naive_pipelines(spec, q, trace);
  if (v.splits_keys) return splitkv_pipelines(spec, q, info, trace);
  return {{kernel_key(v.name, spec, q, trace), spec}};  // online, flash1, flash2, flashd
}

const ShaderBlob& find_build(const std::vector<ShaderBlob>& blobs, const std::string& name) {
  for (const ShaderBlob& b : blobs)
    if (name == b.name) return b;
  throw Error("internal: no embedded shader named " + name);
}

std::span<const KernelBuilds> kernel_table() {
  return builds::kTable;
}

std::string_view kernel_source(std::string_view program, TileLayout layout) {
  const KernelBuilds* b = find(program, layout);
  return b ? b->source : std::string_view();
}

}  // namespace flashvk::detail
