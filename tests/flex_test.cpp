// User-written attention (flashvk::flex): functions that equal built-in modifiers run as the
// built-ins do, and every bad input is refused in one line before anything runs. The functions'
// float64 comparisons in every variant and layout are modifiers_test.cpp's flex_ cases.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "flashvk/flex.hpp"
#include "flashvk/pipelines.hpp"
#include "spirv.hpp"
#include "test_util.hpp"
#include "vk.hpp"

namespace flashvk::test {
namespace {

// ggml's ALiBi as a score_mod, its slopes in the table: the built-in's twin.
constexpr const char* kAlibi =
    R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score - flex_table[h] * float(abs(q_idx + FLEX_NK - FLEX_NQ - kv_idx));
})";
// Llama 4's chunks with causal attention as a mask_mod.
constexpr const char* kChunks = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;
  return kv_idx <= q_pos && q_pos >= 0 && q_pos / 24 == kv_idx / 24;
})";

class FlexTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {};

TEST_P(FlexTest, FunctionsEqualToBuiltInsRunAsTheBuiltInsDo) {
  Context& ctx = context();
  flex::enable(ctx);
  const uint32_t b = 2, h = 4, hkv = 2, nq = 45, nk = 131, d = 16;
  HostTensor q = random_tensor({b, h, nq, d}, 71, 1.5f),
             k = random_tensor({b, hkv, nk, d}, 72, 1.5f), v = random_tensor({b, hkv, nk, d}, 73);
  AttentionParams builtin;
  builtin.variant = GetParam();
  builtin.mods.alibi_max_bias = 8.0f;
  builtin.mods.causal = true;
  builtin.mods.chunk_size = 24;
  AttentionParams user;
  user.variant = GetParam();
  user.mods.score_mod = kAlibi;
  user.mods.mask_mod = kChunks;
  std::vector<float> slopes = alibi_slopes(h, 8.0f);
  user.mods.flex_table = HostTensor({h});
  user.mods.flex_table.data = slopes;
  HostAttentionResult a = attention(ctx, q, k, v, builtin), c = attention(ctx, q, k, v, user);
  ASSERT_EQ(a.out.data.size(), c.out.data.size());
  double worst = 0, scale = 0;
  for (size_t x = 0; x < a.out.data.size(); ++x) {
    worst = std::max(worst, double(std::abs(a.out.data[x] - c.out.data[x])));
    scale = std::max(scale, double(std::abs(a.out.data[x])));
  }
  EXPECT_LE(worst, 1e-5 * std::max(1.0, scale));
  // And both against float64, the user's functions through their twins.
  reference::Result ref = reference::direct(q, k, v, builtin);
  EXPECT_LE(max_error(c.out.data, ref.out), tolerance(q, k, v, builtin));
  EXPECT_LE(max_lse_error(c.lse.data, ref.lse), 2e-5);
}

// flex::DeviceTwins: the float64 reference over functions it has no C++ twin of, from their
// values on the device (flex_eval.comp), equals the reference of the built-ins they equal, to
// fp32's rounding of the scores; a point its first run did not ask is refused.
TEST_F(VulkanTest, FlexDeviceTwinsStandInForCppTwins) {
  Context& ctx = context();
  flex::enable(ctx);
  const uint32_t b = 2, h = 4, hkv = 2, nq = 21, nk = 70, d = 16;
  HostTensor q = random_tensor({b, h, nq, d}, 81, 1.5f),
             k = random_tensor({b, hkv, nk, d}, 82, 1.5f), v = random_tensor({b, hkv, nk, d}, 83);
  AttentionParams builtin;
  builtin.mods.alibi_max_bias = 8.0f;
  builtin.mods.causal = true;
  builtin.mods.chunk_size = 24;
  AttentionParams user;
  user.mods.score_mod = kAlibi;
  user.mods.mask_mod = kChunks;
  user.mods.flex_table = HostTensor({h});
  user.mods.flex_table.data = alibi_slopes(h, 8.0f);
  flex::DeviceTwins twins(ctx, user.mods, nq, nk);
  user.mods = twins.noting();
  reference::direct(q, k, v, user);  // notes the points
  user.mods = twins.answering();
  reference::Result got = reference::direct(q, k, v, user),
                    want = reference::direct(q, k, v, builtin);
  auto apart = [](const std::vector<double>& x, const std::vector<double>& y) {
    double worst = x.size() == y.size() ? 0.0 : INFINITY;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      worst = std::max(worst, std::abs(x[i] - y[i]));
    return worst;
  };
  EXPECT_LE(apart(got.out, want.out), 2e-6);
  EXPECT_LE(apart(got.lse, want.lse), 2e-6);
  expect_refused([&] { user.mods.score_twin(0.123, 0, 0, 0, 0); }, "the first run did not");
  expect_refused([&] { user.mods.mask_twin(9, 0, 0, 0); }, "the first run did not");
  // The functions are asked where the kernels ask them: score_mod only at keys the limits and
  // mask_mod keep, so a bias by distance that only exists for causal keys is no miss.
  AttentionParams by_distance;
  by_distance.mods.causal = true;
  by_distance.mods.score_mod =
      R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score - flex_table[q_idx + FLEX_NK - FLEX_NQ - kv_idx];
})";
  by_distance.mods.flex_table = HostTensor({nk});
  for (uint32_t x = 0; x < nk; ++x) by_distance.mods.flex_table.data[x] = 0.05f * float(x);
  AttentionParams twin = by_distance;
  twin.mods.score_twin = [&](double s, int, int, int i, int j) {
    return s - double(0.05f * float(i + int(nk - nq) - j));
  };
  flex::DeviceTwins distance(ctx, by_distance.mods, nq, nk);
  by_distance.mods = distance.noting();
  reference::direct(q, k, v, by_distance);
  by_distance.mods = distance.answering();
  EXPECT_LE(
      apart(reference::direct(q, k, v, by_distance).out, reference::direct(q, k, v, twin).out),
      2e-6);
  // A function that reads past its table is refused as a call would be.
  Modifiers past;
  past.mask_mod =
      "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return flex_table[kv_idx] > 0.0; }";
  past.flex_table = HostTensor({10});
  flex::DeviceTwins bad(ctx, past, nq, nk);
  AttentionParams p;
  p.mods = bad.noting();
  reference::direct(q, k, v, p);
  expect_refused([&] { bad.answering(); }, "mask_mod read flex_table past its 10 values");
  EXPECT_TRUE(ctx.take_validation_messages().empty());
}

// The tiles mask_mod hides from every row of a workgroup are never read (flex_tiles.comp's
// bitmap): keys 128..255 hidden from all, 64..127 from all heads but one per batch, and K and V
// there NaN, which any read would carry into O. In every layout the device runs.
class FlexTilesTest : public FlexTest {};

TEST_P(FlexTilesTest, TilesMaskModHidesAreNeverRead) {
  Variant variant = GetParam();
  flex::enable(context());
  const uint32_t batch = 2, heads = 4, nq = 70, nk = 300, d = 32;
  HostTensor q = random_tensor({batch, heads, nq, d}, 21), k = random_tensor({batch, 2, nk, d}, 22),
             v = random_tensor({batch, 2, nk, d}, 23);
  AttentionParams params;
  params.variant = variant;
  if (variant_info(variant).splits_keys) params.hints.splits = 3;
  params.mods.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  bool seen_64 = h == (b == 0 ? 2 : 1);
  return !((kv_idx >= 128 && kv_idx < 256) || (kv_idx >= 64 && kv_idx < 128 && !seen_64));
})";
  params.mods.mask_twin = [](int b, int h, int, int j) {
    bool seen_64 = h == (b == 0 ? 2 : 1);
    return !((j >= 128 && j < 256) || (j >= 64 && j < 128 && !seen_64));
  };
  expect_keys_never_read(q, k, v, params, 128, 256);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, FlexTest, ::testing::ValuesIn(all_variants()),
                         variant_param_name);
// naive reads every key of a row's range: the fused variants alone skip tiles.
INSTANTIATE_TEST_SUITE_P(Fused, FlexTilesTest, ::testing::ValuesIn(fused_variants()),
                         variant_param_name);

TEST_F(VulkanTest, FlexRefusesBadFunctionsInOneLine) {
  Context& ctx = context();
  flex::enable(ctx);
  HostTensor q = random_tensor({1, 2, 8, 16}, 1), k = random_tensor({1, 2, 20, 16}, 2);
  auto run = [&](Modifiers mods) {
    AttentionParams p;
    p.mods = std::move(mods);
    attention(ctx, q, k, k, p);
  };
  Modifiers syntax;
  syntax.score_mod =
      "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
      "  return score + undefined_bias;\n}\n";
  syntax.score_mod_name = "/some/folder/bias.glsl";
  expect_refused([&] { run(syntax); }, "bias.glsl:2:");
  expect_refused([&] { run(syntax); }, "undefined_bias");
  Modifiers missing;
  missing.mask_mod = "bool keep(int b, int h, int q_idx, int kv_idx) { return true; }\n";
  missing.mask_mod_name = "keep.glsl";
  expect_refused([&] { run(missing); },
                 "keep.glsl must define bool mask_mod(int b, int h, int q_idx, int kv_idx)");
  Modifiers signature;
  signature.score_mod = "float score_mod(float score, int q_idx, int kv_idx) { return score; }\n";
  expect_refused([&] { run(signature); },
                 "score_mod.glsl must define float score_mod(float score, int b, int h, int "
                 "q_idx, int kv_idx)");
  // A read past the table: the call is refused once it has run (the output is not returned).
  Modifiers past;
  past.score_mod =
      "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
      "  return score + flex_table[kv_idx + 2];\n}\n";
  past.flex_table = HostTensor({20});  // K has 20 keys: keys 18 and 19 read past it
  expect_refused([&] { run(past); }, "score_mod read flex_table past its 20 values");
  past.flex_table = HostTensor({22});
  EXPECT_NO_THROW(run(past));
  // A recording hears of it from the next set_keys (a decode loop's next step), or from
  // check_user_functions() once a run has finished; once, until a run misses again.
  {
    AttentionParams rp;
    rp.mods = past;
    rp.mods.flex_table = HostTensor({20});
    Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k, DType::f32);
    AttentionRecording rec(ctx, tq, tk, tk, rp);
    EXPECT_NO_THROW(rec.check_user_functions());  // nothing has run
    ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
    frame.submit();  // 20 keys: keys 18 and 19 read past
    expect_refused([&] { rec.set_keys(18); }, "score_mod read flex_table past its 20");
    EXPECT_NO_THROW(rec.check_user_functions());  // said once
    rec.set_keys(18);
    frame.submit();  // keys 0..17 read values 2..19: inside
    EXPECT_NO_THROW(rec.check_user_functions());
    rec.set_keys(20);
    frame.submit();
    expect_refused([&] { rec.check_user_functions(); }, "score_mod read flex_table past its 20");
  }
  Modifiers no_table;
  no_table.mask_mod =
      "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
      "  return flex_table[ kv_idx ] >= 0.0;\n}\n";
  expect_refused([&] { run(no_table); }, "mask_mod read flex_table past its 0 values");
  Modifiers table_alone;
  table_alone.flex_table = HostTensor({4});
  expect_refused([&] { run(table_alone); }, "flex_table is given without a score_mod");
  // The reference cannot run GLSL: it asks for the twins.
  Modifiers no_twin;
  no_twin.mask_mod = kChunks;
  AttentionParams p;
  p.mods = no_twin;
  expect_refused([&] { reference::direct(q, k, k, p); }, "C++ twins");
  // flex::check compiles one kernel: the same error without a context.
  expect_refused([&] { flex::check(syntax); }, "bias.glsl:2:");
  EXPECT_NO_THROW(flex::check(no_twin));
}

// The pipeline report with user functions: exactly the pipelines a plan builds with them
// (mask_mod's tile pass first, for the fused kernels), each with the SPIR-V flex::compile makes.
TEST(FlexPipelines, TheReportListsWhatThePlanBuildsWithTheFunctions) {
  for (Variant variant : {Variant::flash2, Variant::naive}) {
    AttentionParams params;
    params.variant = variant;
    params.mods.mask_mod = kChunks;
    params.mods.score_mod = kAlibi;
    params.mods.flex_table = HostTensor({4});
    // What a plan builds: attention() on a context of its own, by build name and constants.
    std::set<std::pair<std::string, std::vector<uint32_t>>> ran, listed;
    {
      Context ctx = Context::create(test_options());
      flex::enable(ctx);
      HostTensor q = random_tensor({1, 4, 40, 16}, 1), k = random_tensor({1, 2, 90, 16}, 2);
      attention(ctx, q, k, k, params);
      for (const auto& [key, pipe] : ctx.impl().pipelines) {
        auto values = key.second.constants();
        ran.emplace(key.first.substr(0, key.first.find("+user")),
                    std::vector<uint32_t>(values.begin(), values.end()));
      }
      EXPECT_TRUE(ctx.take_validation_messages().empty());
    }
    ContextOptions options = test_options();
    options.compile_only = true;
    Context ctx = Context::create(options);
    flex::enable(ctx);
    PipelineCall call;
    call.heads = 4, call.kv_heads = 2, call.nq = 40, call.nk = 90, call.d = 16;
    call.params = params;
    std::vector<PipelineDescription> report = describe_pipelines(ctx, call);
    ASSERT_FALSE(report.empty());
    EXPECT_EQ(report[0].program == "flex_tiles", variant == Variant::flash2);
    for (const PipelineDescription& p : report) {
      ASSERT_GT(p.shader.size(), 5u);
      EXPECT_EQ(p.shader.substr(p.shader.size() - 5), "+flex") << p.shader;
      std::string build = p.shader.substr(0, p.shader.size() - 5);
      // What the driver got (but for the tests' unroll hints on llvmpipe): the functions' build,
      // made coherent at its barriers where it is on the Vulkan memory model (matrix units).
      std::vector<uint32_t> want = flex::compile(build, params.mods);
      detail::coherence_at_barriers(want);
      EXPECT_EQ(p.spirv, want) << build;
      std::vector<uint32_t> values;
      for (auto [id, value] : p.spec_constants) values.push_back(value);
      listed.emplace(build, values);
    }
    EXPECT_EQ(listed, ran) << variant_name(variant);
    EXPECT_TRUE(ctx.take_validation_messages().empty());
  }
}

// With a pipeline cache, each kernel's SPIR-V is kept beside it and loaded by a later context;
// a file that is not SPIR-V is compiled over.
TEST(FlexCache, KeepsTheSpirvBesideThePipelineCache) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flashvk_flex_cache_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto spirv_files = [&] {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".spv") files.push_back(e.path());
    return files;
  };
  HostTensor q = random_tensor({1, 2, 9, 16}, 5), k = random_tensor({1, 2, 40, 16}, 6);
  AttentionParams p;
  p.variant = Variant::flash2;
  p.hints.tile_layout = TileLayout::shared;
  p.mods.mask_mod = kChunks;
  auto run = [&] {
    ContextOptions options;
    options.pipeline_cache_path = (dir / "pipelines.bin").string();
    Context ctx = Context::create(options);
    flex::enable(ctx);
    return attention(ctx, q, k, k, p).out.data;
  };
  std::vector<float> first = run();
  std::vector<fs::path> files = spirv_files();
  EXPECT_EQ(files.size(), 2u);  // the tile bitmap's pass and the kernel
  std::vector<fs::file_time_type> written;
  for (const fs::path& f : files) written.push_back(fs::last_write_time(f));
  EXPECT_EQ(run(), first);
  for (size_t i = 0; i < files.size(); ++i)  // loaded, not compiled and written again
    EXPECT_EQ(fs::last_write_time(files[i]), written[i]) << files[i];
  for (const fs::path& f : files) std::ofstream(f) << "not SPIR-V";
  EXPECT_EQ(run(), first);
  for (const fs::path& f : spirv_files()) {
    std::ifstream in(f, std::ios::binary);
    uint32_t magic = 0;
    in.read(reinterpret_cast<char*>(&magic), 4);
    EXPECT_EQ(magic, 0x07230203u) << f;
  }
  fs::remove_all(dir);
}

TEST(FlexWithoutCompiler, IsRefusedNamingFlashvkFlex) {
  Context ctx = Context::create();
  AttentionParams p;
  p.mods.mask_mod = kChunks;
  HostTensor q = random_tensor({1, 1, 4, 16}, 1);
  expect_refused([&] { attention(ctx, q, q, q, p); }, "flashvk::flex::enable(ctx)");
}

// Cases a review found (each failed before its fix): naive with an additive mask and mask_mod;
// a recording whose keys shrink under a mask_mod that depends on FLEX_NK; a score_mod that makes
// -inf from the score's value beside a mask_mod; one text for both functions; unsigned indices;
// a bracket left open in a comment.
TEST_F(VulkanTest, FlexNaiveTakesAnAdditiveMaskBesideMaskMod) {
  Context& ctx = context();
  flex::enable(ctx);
  const uint32_t nq = 40, nk = 90, d = 16;
  HostTensor q = random_tensor({1, 2, nq, d}, 1), k = random_tensor({1, 2, nk, d}, 2),
             v = random_tensor({1, 2, nk, d}, 3);
  AttentionParams p;
  p.variant = Variant::naive;
  p.mods.mask = HostTensor({nq, nk});
  for (uint32_t i = 0; i < nq; ++i)
    for (uint32_t j = 0; j < nk; ++j)
      p.mods.mask.data[i * nk + j] =
          (j % 5 == 0) ? -std::numeric_limits<float>::infinity() : 0.1f * float(j % 3);
  p.mods.mask_mod =
      "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return kv_idx % 7 != 1; }";
  p.mods.mask_twin = [](int, int, int, int j) { return j % 7 != 1; };
  reference::Result ref = reference::direct(q, k, v, p);
  HostAttentionResult r = attention(ctx, q, k, v, p);
  EXPECT_LE(max_error(r.out.data, ref.out), tolerance(q, k, v, p));
}

// A recording whose keys change (a decode loop's set_keys) runs the tile pass first on every
// submit, from the keys of that run (a length it has just made the words for keeps them): the
// tiles mask_mod hides at each length are never read (NaN there), and a bitmap left from the
// run before (longer keys) would hide keys this one sees.
TEST_F(VulkanTest, FlexRecordingRebuildsTheBitmapEachRun) {
  Context& ctx = context();
  flex::enable(ctx);
  const uint32_t nq = 1, nk = 300, d = 16, hidden = 128;  // keys [0, 128): hidden at every length
  HostTensor q = random_tensor({1, 2, nq, d}, 1), k = random_tensor({1, 2, nk, d}, 2),
             v = random_tensor({1, 2, nk, d}, 3);
  HostTensor k_nan = k, v_nan = v;
  for (uint32_t h = 0; h < 2; ++h)
    for (uint32_t j = 0; j < hidden; ++j)
      for (uint32_t c = 0; c < d; ++c) {
        size_t at = (size_t(h) * nk + j) * d + c;
        k.data[at] = v.data[at] = 0.0f;
        k_nan.data[at] = v_nan.data[at] = std::numeric_limits<float>::quiet_NaN();
      }
  AttentionParams p;
  p.mods.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;
  return kv_idx <= q_pos && kv_idx >= q_pos - 20;
})";
  Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k_nan, DType::f32),
         tv = Tensor::upload(ctx, v_nan, DType::f32);
  for (Variant variant : fused_variants()) {
    p.variant = variant;
    // Made over the first 64 keys (a cache's prefix views, as a decode loop starts), so that
    // the bitmap must span every key set_keys may reach, not the 64 it was made with.
    AttentionRecording rec(ctx, tq, tk.prefix(64), tv.prefix(64), p);
    ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
    for (uint32_t n : {300u, 180u, 180u, 250u, 150u, 300u}) {  // 180 again: the words kept
      AttentionParams twin = p;
      twin.mods.mask_twin = [n](int, int, int i, int j) {
        int qp = i + int(n) - int(nq);
        return j <= qp && j >= qp - 20;
      };
      HostTensor ks({1, 2, n, d}), vs({1, 2, n, d});
      for (uint32_t h = 0; h < 2; ++h) {
        std::copy_n(k.data.begin() + h * nk * d, n * d, ks.data.begin() + h * n * d);
        std::copy_n(v.data.begin() + h * nk * d, n * d, vs.data.begin() + h * n * d);
      }
      reference::Result ref = reference::direct(q, ks, vs, twin);
      rec.set_keys(n);
      frame.submit();
      EXPECT_LE(max_error(rec.out().download().data, ref.out), 1e-4)
          << variant_name(variant) << " at " << n << " keys";
    }
  }
  EXPECT_TRUE(ctx.take_validation_messages().empty());
}

TEST_F(VulkanTest, FlexTilePassDoesNotJudgeByScoreMod) {
  Context& ctx = context();
  flex::enable(ctx);
  const uint32_t nq = 8, nk = 64, d = 16;
  HostTensor q = random_tensor({1, 1, nq, d}, 1), k = random_tensor({1, 1, nk, d}, 2),
             v = random_tensor({1, 1, nk, d}, 3);
  AttentionParams p;
  p.variant = Variant::flash2;
  p.mods.score_mod =
      "float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score > 0.0 ? "
      "score : -1.0 / 0.0; }";
  p.mods.score_twin = [](double s, int, int, int, int) {
    return s > 0 ? s : -std::numeric_limits<double>::infinity();
  };
  p.mods.mask_mod = "bool mask_mod(int b, int h, int q_idx, int kv_idx) { return true; }";
  p.mods.mask_twin = [](int, int, int, int) { return true; };
  reference::Result ref = reference::direct(q, k, v, p);
  HostAttentionResult r = attention(ctx, q, k, v, p);
  EXPECT_LE(max_error(r.out.data, ref.out), 1e-4);
  p.mods.mask_mod.clear();
  p.mods.mask_twin = nullptr;
  HostAttentionResult r2 = attention(ctx, q, k, v, p);
  EXPECT_LE(max_error(r2.out.data, ref.out), 1e-4) << "control without mask_mod";
}

TEST_F(VulkanTest, FlexOneTextForBothFunctionsCompiles) {
  Modifiers m;
  m.score_mod = m.mask_mod =
      R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) { return score; }
bool mask_mod(int b, int h, int q_idx, int kv_idx) { return true; })";
  EXPECT_NO_THROW(flex::check(m));
}

TEST_F(VulkanTest, FlexTableTakesUnsignedIndices) {
  Modifiers m;
  m.score_mod =
      R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) { uint j = uint(kv_idx); return score + flex_table[j]; })";
  m.flex_table = HostTensor({4});
  EXPECT_NO_THROW(flex::check(m));
}

TEST_F(VulkanTest, FlexLeavesBracketsInCommentsAlone) {
  Modifiers m;
  m.score_mod =
      "// reads flex_table[i\nfloat score_mod(float score, int b, int h, int q_idx, int kv_idx) "
      "{\n  float a[2] = float[2](0.0, 1.0);\n  return score + a[1];\n}\n";
  EXPECT_NO_THROW(flex::check(m));
}

}  // namespace
}  // namespace flashvk::test
