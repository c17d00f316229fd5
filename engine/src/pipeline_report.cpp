// describe_pipelines(): the pipelines a call builds, from the planner's own choices (plan.cpp's
// call_spec, the kernel families' attention_pipelines), and the driver's account of each
// (VK_KHR_pipeline_executable_properties).
#include <algorithm>
#include <string_view>

#include "flashvk/pipelines.hpp"
#include "kernels.hpp"
#include "plan.hpp"
#include "shader_registry.hpp"
#include "tiling.hpp"
#include "vk.hpp"

namespace flashvk {

namespace {

using detail::check;

// The constants' names in the shaders, by ID.
const std::vector<std::string>& spec_names() {
  static const std::vector<std::string> names = {
#define SPEC_WORKGROUP(id, field, value) "local_size_x",
#define SPEC_CONSTANT(id, type, NAME, field, value) #NAME,
#include "../../shaders/spec_constants.glsl"
#undef SPEC_WORKGROUP
#undef SPEC_CONSTANT
  };
  return names;
}

PipelineStatistic statistic(const VkPipelineExecutableStatisticKHR& s) {
  PipelineStatistic out{s.name, s.description, false};
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
      out.value = s.value.b32 == VK_TRUE;
      break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
      out.value = s.value.i64;
      break;
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
      out.value = s.value.u64;
      // NVIDIA's driver (580) gives its "Local Memory Size" with bit 36 set beside the bytes in
      // the low 32 bits: 2^36 for kernels without local memory, 2^36 + 64 for one that spilled
      // 64 bytes (H200, register blocks of 255 registers). The bytes are the low half.
      if (std::string_view(s.name) == "Local Memory Size") out.value = s.value.u64 & 0xffffffffu;
      break;
    default:
      out.value = s.value.f64;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> representations(
    VkDevice device, const VkPipelineExecutableInfoKHR& which) {
  auto get = reinterpret_cast<PFN_vkGetPipelineExecutableInternalRepresentationsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableInternalRepresentationsKHR"));
  uint32_t count = 0;
  if (!get || get(device, &which, &count, nullptr) != VK_SUCCESS) return {};
  std::vector<VkPipelineExecutableInternalRepresentationKHR> reps(
      count, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR});
  if (get(device, &which, &count, reps.data()) != VK_SUCCESS) return {};
  // Then the text, in buffers of the sizes the first call gave.
  std::vector<std::string> texts(count);
  for (uint32_t i = 0; i < count; ++i) {
    texts[i].resize(reps[i].dataSize);
    reps[i].pData = texts[i].data();
  }
  if (get(device, &which, &count, reps.data()) != VK_SUCCESS) return {};
  std::vector<std::pair<std::string, std::string>> out;
  for (uint32_t i = 0; i < count; ++i) {
    std::string text = reps[i].isText ? texts[i].c_str() : std::string("(binary)");
    out.emplace_back(reps[i].name, std::move(text));
  }
  return out;
}

std::vector<PipelineExecutable> executables(detail::ContextImpl& impl, VkPipeline pipeline) {
  if (!impl.capture) return {};
  VkDevice device = impl.device;
  auto properties = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutablePropertiesKHR"));
  auto statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
      vkGetDeviceProcAddr(device, "vkGetPipelineExecutableStatisticsKHR"));
  if (!properties || !statistics) return {};
  VkPipelineInfoKHR info{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR};
  info.pipeline = pipeline;
  uint32_t count = 0;
  check(properties(device, &info, &count, nullptr), "vkGetPipelineExecutablePropertiesKHR");
  std::vector<VkPipelineExecutablePropertiesKHR> props(
      count, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR});
  check(properties(device, &info, &count, props.data()), "vkGetPipelineExecutablePropertiesKHR");
  std::vector<PipelineExecutable> out;
  for (uint32_t i = 0; i < count; ++i) {
    PipelineExecutable e{props[i].name, props[i].description, props[i].subgroupSize, {}, {}};
    VkPipelineExecutableInfoKHR which{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR};
    which.pipeline = pipeline;
    which.executableIndex = i;
    uint32_t n = 0;
    check(statistics(device, &which, &n, nullptr), "vkGetPipelineExecutableStatisticsKHR");
    std::vector<VkPipelineExecutableStatisticKHR> stats(
        n, {VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR});
    check(statistics(device, &which, &n, stats.data()), "vkGetPipelineExecutableStatisticsKHR");
    for (const auto& s : stats) e.statistics.push_back(statistic(s));
    e.representations = representations(device, which);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

double PipelineStatistic::number() const {
  return std::visit([](auto v) { return static_cast<double>(v); }, value);
}

const PipelineStatistic* PipelineExecutable::statistic(const std::string& wanted) const {
  for (const PipelineStatistic& s : statistics)
    if (s.name == wanted) return &s;
  return nullptr;
}

std::string PipelineExecutable::representation(const std::string& part) const {
  for (const auto& [title, text] : representations)
    if (title.find(part) != std::string::npos) return text;
  return {};
}

std::vector<PipelineDescription> describe_pipelines(Context& ctx, const PipelineCall& call) {
  detail::ContextImpl& impl = ctx.impl();
  const AttentionParams& params = call.params;
  int64_t kv_heads = call.kv_heads ? call.kv_heads : call.heads, dv = call.dv ? call.dv : call.d;
  Dims dims =
      check_shapes({call.batch, call.heads, call.nq, call.d},
                   {call.batch, kv_heads, call.nk, call.d}, {call.batch, kv_heads, call.nk, dv});
  dims.kv_rows = dims.nk;  // as a dense K and V of Nk keys (or a paged cache's pages of them)
  dims.kv_keys = uint64_t(dims.batch) * dims.kv_heads * dims.nk;
  const Storage& kv = call.storage;
  if (kv.q != DType::f32 && kv.q != DType::f16)
    throw Error(std::string("attention: Q is stored as f32 or f16 (got ") + dtype_name(kv.q) + ")");
  check_blocks({call.d}, kv.k);
  check_blocks({dv}, kv.v);
  check_modifiers(params.mods, dims);
  if (params.rope != RopeLayout::none && kv.k != kv.q)
    throw Error(std::string("attention: rope rotates K stored as Q is (") + dtype_name(kv.q) +
                "); rotate K before storing it as " + dtype_name(kv.k));
  detail::Spec spec = detail::call_spec({.info = impl.info,
                                         .matrix_api = impl.matrix_api,
                                         .fp16_arithmetic_enabled = impl.fp16_arithmetic_enabled,
                                         .dims = dims,
                                         .params = params,
                                         .dtype = kv.q,
                                         .kv = kv},
                                        call.page_size);

  std::vector<detail::PipelineChoice> choices;
  if (params.rope != RopeLayout::none) choices.push_back(detail::rows_pipeline(kv.q, kv.q));
  for (const detail::PipelineChoice& c :
       detail::attention_pipelines(params.variant, spec, kv.q, impl.info))
    choices.push_back(c);

  // With mask_mod, the tile pass the plan runs first where the kernel skips tiles (plan.cpp).
  const Modifiers& mods = params.mods;
  const bool user = mods.user_functions();
  if (!mods.mask_mod.empty() && (spec.mods & detail::kModTiles))
    choices.insert(choices.begin(), {{.program = "flex_tiles"}, detail::flex_tiles_spec(spec)});

  const bool fused = variant_info(params.variant).fused;
  std::vector<PipelineDescription> out;
  for (const detail::PipelineChoice& c : choices) {
    PipelineDescription p;
    std::string build = detail::kernel_name(c.key);
    const detail::ShaderBlob* blob = nullptr;
    if (user) {  // compiled with the user's functions (flashvk::flex), named so
      p.shader = build + "+flex";  // its SPIR-V once built
    } else {
      blob = &detail::find_build(detail::shader_blobs(), build);
      p.shader = blob->name;
      p.spirv = impl.driver_spirv(*blob);
    }
    p.program = c.key.program;
    p.source = detail::kernel_source(c.key.program, c.key.layout);
    p.layout = c.spec.layout;
    p.required_subgroup = c.spec.required_subgroup(impl.info.subgroup_size);
    if (fused && c.key.program == variant_name(params.variant)) {  // the tiled kernel
      p.block_rows = c.spec.block();
      p.block_keys = c.spec.bc;
    }
    auto values = impl.driver_constants(c.spec);
    for (uint32_t id = 0; id < values.size(); ++id) p.spec_constants.emplace_back(id, values[id]);
    p.spec_names = spec_names();
    if (call.only && !call.only(p)) continue;
    VkPipeline pipeline =
        user ? impl.user_pipeline(build, mods, c.spec) : impl.pipeline(*blob, c.spec);
    if (user) p.spirv = impl.user_spirv(build, mods);
    p.executables = executables(impl, pipeline);
    out.push_back(std::move(p));
  }
  return out;
}

bool is_rdna(const DeviceInfo& info) { return info.registers_per_simd >= 512; }

double rdna_subgroups_per_simd(uint64_t lds_bytes, uint32_t invocations, uint32_t subgroup,
                               double bound) {
  if (lds_bytes == 0 || subgroup == 0) return bound;
  uint64_t allocated = (lds_bytes + 1023) / 1024 * 1024;
  uint64_t workgroups = (128u * 1024u) / allocated;
  uint64_t subgroups = (invocations + subgroup - 1) / subgroup;
  return std::min(bound, double(workgroups * subgroups) * (subgroup / 32.0) / 4.0);
}

}  // namespace flashvk
