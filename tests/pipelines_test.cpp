// describe_pipelines() and the compile-only context: the report lists exactly the pipelines a
// call's plan builds (compared with what attention() made on a fresh context), with the SPIR-V and
// constants they were created from; a compile-only context allocates and submits nothing; a
// device that cannot run work is refused in one line, never a crash.
#include <gtest/gtest.h>

#include <set>

#include "flashvk/pipelines.hpp"
#include "test_util.hpp"
#include "testing.hpp"
#include "vk.hpp"

namespace flashvk::test {
namespace {

Context compile_only() {
  ContextOptions options = test_options();
  options.compile_only = true;
  return Context::create(options);
}

using Built = std::set<std::pair<std::string, std::vector<uint32_t>>>;

// The pipelines a context holds: (build name, constants by ID).
Built built(Context& ctx) {
  Built out;
  for (const auto& [key, pipe] : ctx.impl().pipelines) {
    auto values = key.second.constants();
    out.emplace(key.first, std::vector<uint32_t>(values.begin(), values.end()));
  }
  return out;
}

struct Call {
  const char* name;
  Variant variant;
  Storage storage;
  uint32_t heads, kv_heads, nq, nk, d;
  bool causal = false, softcap = false, sinks = false;
  TileLayout layout = TileLayout::automatic;
  bool fp16_arithmetic = false;
  RopeLayout rope = RopeLayout::none;
};

class PipelineReport : public ::testing::TestWithParam<Call> {};

TEST_P(PipelineReport, ListsExactlyWhatTheCallBuilds) {
  const Call& c = GetParam();
  AttentionParams params;
  params.variant = c.variant;
  params.mods.causal = c.causal;
  if (c.softcap) params.mods.softcap = 20.0f;
  if (c.sinks) params.mods.sinks.assign(c.heads, 0.25f);
  params.hints.tile_layout = c.layout;
  params.hints.fp16_arithmetic = c.fp16_arithmetic;
  params.rope = c.rope;
  // What a plan builds: attention() on a context of its own, which starts with no pipeline.
  Built ran;
  {
    Context ctx = Context::create(test_options());
    HostTensor q = random_tensor({1, c.heads, c.nq, c.d}, 1),
               k = random_tensor({1, c.kv_heads, c.nk, c.d}, 2),
               v = random_tensor({1, c.kv_heads, c.nk, c.d}, 3);
    attention(ctx, q, k, v, params, c.storage);
    ran = built(ctx);
    EXPECT_TRUE(ctx.take_validation_messages().empty());
  }
  Context ctx = compile_only();
  PipelineCall call;
  call.heads = c.heads, call.kv_heads = c.kv_heads, call.nq = c.nq, call.nk = c.nk, call.d = c.d;
  call.params = params;
  call.storage = c.storage;
  std::vector<PipelineDescription> report = describe_pipelines(ctx, call);
  Built listed;
  for (const PipelineDescription& p : report) {
    std::vector<uint32_t> values;
    for (uint32_t i = 0; i < p.spec_constants.size(); ++i) {
      EXPECT_EQ(p.spec_constants[i].first, i);  // {id, value}, in ID order
      values.push_back(p.spec_constants[i].second);
    }
    listed.emplace(p.shader, values);
    EXPECT_EQ(p.spec_names.size(), p.spec_constants.size());
    ASSERT_GE(p.spirv.size(), 5u);
    EXPECT_EQ(p.spirv[0], 0x07230203u) << "SPIR-V's magic number";
    EXPECT_FALSE(p.source.empty()) << p.shader;
    // lavapipe has no VK_KHR_pipeline_executable_properties: no statistics, and the report
    // says so by leaving them empty.
    EXPECT_EQ(p.executables.empty(), !ctx.device().pipeline_statistics);
  }
  EXPECT_EQ(listed, ran) << c.name;
  // The tiled kernel names its tiling; the others (the merge, the naive passes) do not.
  for (const PipelineDescription& p : report)
    if (p.program == variant_name(c.variant) && variant_info(c.variant).fused) {
      EXPECT_GT(p.block_rows, 0u);
      EXPECT_GT(p.block_keys, 0u);
    }
  EXPECT_TRUE(ctx.take_validation_messages().empty());
}

const DType f32 = DType::f32, f16 = DType::f16, q8 = DType::q8_0;
INSTANTIATE_TEST_SUITE_P(
    Calls, PipelineReport,
    ::testing::Values(
        Call{"flash2_f32", Variant::flash2, f32, 4, 2, 40, 70, 32},
        Call{"naive_f32", Variant::naive, f32, 2, 2, 20, 33, 16, true},
        Call{"splitkv_decode_f16_sinks", Variant::splitkv, f16, 8, 2, 1, 300, 64, true, false,
             true},
        Call{"flashd_q8_softcap", Variant::flashd, {f16, q8, q8}, 2, 1, 30, 64, 32, true, true},
        Call{"flash1_blocks_fp16_arithmetic", Variant::flash1, f16, 2, 2, 50, 40, 32, false, false,
             false, TileLayout::blocks, true},
        Call{"online_shared_rope", Variant::online, f32, 2, 2, 24, 24, 16, true, false, false,
             TileLayout::shared, false, RopeLayout::half},
        Call{"splitkv_lanes_q8",
             Variant::splitkv,
             {f16, q8, q8},
             8,
             2,
             1,
             200,
             64,
             false,
             false,
             false,
             TileLayout::lanes}),
    [](const ::testing::TestParamInfo<Call>& p) { return std::string(p.param.name); });

TEST(CompileOnlyContext, RunsNothing) {
  Context ctx = compile_only();
  uint64_t bytes = engine_stats().device_bytes;
  expect_refused(
      [&] {
        Tensor::upload(ctx, random_tensor({4, 8}, 4), DType::f32);
      },
      "compile-only context");
  HostTensor q = random_tensor({1, 1, 4, 8}, 5);
  expect_refused([&] { attention(ctx, q, q, q); }, "compile-only context");
  EXPECT_EQ(engine_stats().device_bytes, bytes);
  // It compiles: a call's pipelines, twice from the same cache.
  PipelineCall call;
  call.nq = 16, call.nk = 16, call.d = 8;
  size_t pipelines = describe_pipelines(ctx, call).size();
  EXPECT_EQ(pipelines, 1u);
  EXPECT_EQ(describe_pipelines(ctx, call).size(), pipelines);
  EXPECT_EQ(ctx.impl().pipelines.size(), pipelines);
  EXPECT_TRUE(ctx.take_validation_messages().empty());
}

TEST(CompileOnlyContext, RefusesWhatTheEngineRefuses) {
  Context ctx = compile_only();
  PipelineCall call;
  call.heads = 3, call.kv_heads = 2;
  expect_refused([&] { describe_pipelines(ctx, call); }, "must be a multiple");
  call = {};
  call.d = 40;
  call.storage = Storage(DType::f16, DType::q8_0, DType::q8_0);
  expect_refused([&] { describe_pipelines(ctx, call); }, "32");
  call.d = 64;
  call.params.rope = RopeLayout::interleaved;  // K is rotated before it is quantised
  expect_refused([&] { describe_pipelines(ctx, call); }, "rope rotates K stored as Q is");
}

// A device whose queue objects cannot be made (RADV's null device: vkCreateFence fails there)
// is refused by Context::create in one line that points to a compile-only context, and the half-
// made context is destroyed without touching its queue.
TEST(CompileOnlyContext, ADeviceThatCannotRunWorkIsRefusedInOneLine) {
  uint64_t live = engine_stats().objects_live;
  testing::inject_failure("vkCreateFence", VK_ERROR_INVALID_EXTERNAL_HANDLE);
  try {
    Context::create();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("cannot run work"), std::string::npos) << what;
    EXPECT_NE(what.find("compile_only"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  testing::clear_failures();
  EXPECT_EQ(engine_stats().objects_live, live);
}

}  // namespace
}  // namespace flashvk::test
