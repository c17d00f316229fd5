// Determinism and threads: the same inputs give bit-identical outputs run after run, from one
// thread or several, on one shared context or one context per thread.
#include <functional>
#include <thread>

#include "test_util.hpp"
#include "testing.hpp"

namespace flashvk::test {
namespace {

struct Inputs {
  HostTensor q, k, v;
};

Inputs make_inputs() {
  return {random_tensor({2, 4, 33, 32}, 71), random_tensor({2, 2, 300, 32}, 72),
          random_tensor({2, 2, 300, 16}, 73)};
}

AttentionParams params_for(Variant variant) {
  AttentionParams p;
  p.variant = variant;
  p.mods.causal = true;
  return p;
}

TEST_F(VulkanTest, RepeatedRunsAreBitIdentical) {
  Inputs in = make_inputs();
  for (Variant variant : all_variants()) {
    HostAttentionResult first = attention(context(), in.q, in.k, in.v, params_for(variant));
    for (int run = 0; run < 3; ++run) {
      HostAttentionResult again = attention(context(), in.q, in.k, in.v, params_for(variant));
      EXPECT_EQ(again.out.data, first.out.data) << variant_name(variant) << " run " << run;
      EXPECT_EQ(again.lse.data, first.lse.data) << variant_name(variant) << " run " << run;
    }
  }
}

// Runs every variant from `threads` threads at once; each thread uses `ctx_for(thread)`.
template <typename ContextFor>
void expect_threads_match(int threads, ContextFor ctx_for) {
  Inputs in = make_inputs();
  std::vector<std::vector<float>> expected;
  for (Variant variant : all_variants())
    expected.push_back(attention(context(), in.q, in.k, in.v, params_for(variant)).out.data);
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(threads));
  std::vector<std::string> errors(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        Context& ctx = ctx_for(t);
        for (Variant variant : all_variants())
          got[size_t(t)].push_back(attention(ctx, in.q, in.k, in.v, params_for(variant)).out.data);
      } catch (const std::exception& e) {
        errors[size_t(t)] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < threads; ++t) {
    ASSERT_EQ(errors[size_t(t)], "") << "thread " << t;
    for (size_t v = 0; v < expected.size(); ++v)
      EXPECT_EQ(got[size_t(t)][v], expected[v])
          << "thread " << t << " " << variant_name(all_variants()[v]);
  }
}

TEST_F(VulkanTest, ThreadsWithTheirOwnContextsMatchOneThread) {
  std::vector<std::unique_ptr<Context>> contexts;
  for (int t = 0; t < 3; ++t) contexts.push_back(std::make_unique<Context>(Context::create()));
  expect_threads_match(3, [&](int t) -> Context& { return *contexts[size_t(t)]; });
}

TEST_F(VulkanTest, ThreadsSharingOneContextMatchOneThread) {
  expect_threads_match(3, [](int) -> Context& { return context(); });
}

}  // namespace
}  // namespace flashvk::test

namespace flashvk::test {
namespace {

// A device with smaller limits than lavapipe's, to prove that work past a limit is refused with
// the limit named, and that naive's S is split across dispatches when one binding cannot hold it.
class SmallDeviceTest : public ::testing::Test {
 protected:
  static Context make(LimitOverrides limits) {
    ContextOptions options = test_options();
    options.limits = limits;
    return Context::create(options);
  }
  static void expect_error(const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "expected an error naming " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
};

// K of 128 KiB on a device whose storage bindings see 64 KiB: the kernels that bind K as a
// storage buffer refuse it, naming the limit; register tiles read K and V as texels and compute it.
TEST_F(SmallDeviceTest, StorageBufferRangeIsNamedOrLiftedByTexels) {
  Context ctx = make({64 * 1024, 0, 0});
  HostTensor q = random_tensor({1, 1, 16, 32}, 80), k = random_tensor({1, 1, 1024, 32}, 81),
             v = random_tensor({1, 1, 1024, 32}, 82);
  AttentionParams params;
  params.variant = Variant::flash2;
  params.hints.tile_layout = TileLayout::shared;
  expect_error([&] { attention(ctx, q, k, v, params); }, "maxStorageBufferRange");
  params.variant = Variant::naive;
  params.hints.tile_layout = TileLayout::automatic;
  expect_error([&] { attention(ctx, q, k, v, params); }, "maxStorageBufferRange");
  const DeviceInfo& info = ctx.device();
  if (info.subgroup_shuffle && info.texel_buffers && 64 % info.subgroup_size == 0) {
    for (Variant variant : {Variant::flash2, Variant::splitkv}) {
      params.variant = variant;
      params.hints.tile_layout = TileLayout::registers;
      HostAttentionResult gpu = attention(ctx, q, k, v, params);
      reference::Result ref = reference::direct(q, k, v, params);
      EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params))
          << variant_name(variant);
    }
  }
  for (const auto& m : ctx.take_validation_messages()) ADD_FAILURE() << m;
}

TEST_F(SmallDeviceTest, NaiveSplitsItsScoresAcrossDispatches) {
  Context ctx = make({16 * 1024, 0, 0});  // S for one head is 32 x 40 x 4 = 5 KiB: 3 heads a go
  HostTensor q = random_tensor({1, 8, 32, 8}, 82), k = random_tensor({1, 8, 40, 8}, 83),
             v = random_tensor({1, 8, 40, 8}, 84);
  AttentionParams params;
  params.variant = Variant::naive;
  params.mods.causal = true;
  HostAttentionResult gpu = attention(ctx, q, k, v, params);
  reference::Result ref = reference::direct(q, k, v, params);
  EXPECT_LE(max_error(gpu.out.data, ref.out), tolerance(q, k, v, params));
  // Inputs, O and LSE, plus at most one binding's worth of S (the whole S would be 40 KiB).
  uint64_t fixed =
      (q.data.size() + k.data.size() + v.data.size() + gpu.out.data.size() + gpu.lse.data.size()) *
      4;
  EXPECT_LE(gpu.device_bytes, fixed + 16 * 1024);
  for (const auto& m : ctx.take_validation_messages()) ADD_FAILURE() << m;
}

TEST_F(SmallDeviceTest, WorkgroupCountAndAllocationSizeAreNamed) {
  // 600 rows take 3 workgroups of 256 with register tiles (64 invocations x 4 rows), 10 of 64
  // with shared tiles: more than the 2 this device allows.
  Context few_groups = make({0, 0, 2});
  HostTensor q = random_tensor({600, 8}, 85), k = random_tensor({20, 8}, 86);
  expect_error([&] { attention(few_groups, q, k, k); }, "maxComputeWorkGroupCount");
  Context small_alloc = make({0, 32 * 1024, 0});
  HostTensor big = random_tensor({1, 1, 512, 32}, 87);  // 64 KiB
  expect_error([&] { Tensor::upload(small_alloc, big, DType::f32); }, "maxMemoryAllocationSize");
}

// Allocation failure and device loss surface as VulkanError naming the call; the context stays
// usable (allocation) or at least destructible (device loss), with nothing left behind.
TEST_F(VulkanTest, OutOfDeviceMemoryNamesTheCallAndTheContextRecovers) {
  HostTensor q = random_tensor({1, 2, 10, 16}, 88), k = random_tensor({1, 2, 30, 16}, 89);
  testing::inject_failure("vkAllocateMemory", VK_ERROR_OUT_OF_DEVICE_MEMORY, 3);
  try {
    attention(context(), q, k, k);
    ADD_FAILURE() << "expected VK_ERROR_OUT_OF_DEVICE_MEMORY";
  } catch (const VulkanError& e) {
    EXPECT_EQ(e.result(), VK_ERROR_OUT_OF_DEVICE_MEMORY);
    EXPECT_NE(std::string(e.what()).find("vkAllocateMemory"), std::string::npos) << e.what();
  }
  testing::clear_failures();
  HostAttentionResult again = attention(context(), q, k, k);
  EXPECT_LE(max_error(again.out.data, reference::direct(q, k, k, {}).out), tolerance(q, k, k, {}));
}

TEST(DeviceLoss, NamesTheCallAndTheContextIsDestructible) {
  HostTensor q = random_tensor({1, 2, 10, 16}, 90);
  {
    Context ctx = Context::create(test_options());
    testing::inject_failure("vkQueueSubmit", VK_ERROR_DEVICE_LOST);
    try {
      attention(ctx, q, q, q);
      ADD_FAILURE() << "expected VK_ERROR_DEVICE_LOST";
    } catch (const VulkanError& e) {
      EXPECT_EQ(e.result(), VK_ERROR_DEVICE_LOST);
      EXPECT_NE(std::string(e.what()).find("vkQueueSubmit failed: VK_ERROR_DEVICE_LOST"),
                std::string::npos)
          << e.what();
    }
    testing::clear_failures();
    EXPECT_TRUE(ctx.take_validation_messages().empty());
  }  // destroyed here, with everything it created
}

// The one-dispatch decode (lanes) merges a row block's chunks in the workgroup that counts
// itself last. A run the device lost part-way (testing's "vkCmdDispatch": half the chunks run,
// so the counters stop at half and no merge happens) must leave nothing wrong for the next: the
// counters start every run at zero. The lost run attends with other queries, so a merge that
// took its chunks' partial results would be wrong. Then many runs back to back, recorded in one
// command buffer and submitted again and again.
TEST_F(VulkanTest, TheDecodeMergeIsExactAfterARunLostPartWay) {
  Context& ctx = context();
  if (!ctx.device().subgroup_shuffle) GTEST_SKIP() << "no subgroup kernels: no lanes";
  const uint32_t heads = 8, kv_heads = 2, nk = 260, d = 32;
  HostTensor q = random_tensor({2, heads, 1, d}, 91), other = random_tensor({2, heads, 1, d}, 92),
             k = random_tensor({2, kv_heads, nk, d}, 93), v = random_tensor({2, kv_heads, nk, d}, 94);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.hints.tile_layout = TileLayout::lanes;
  params.hints.splits = 6;
  params.want_lse = true;
  reference::Result ref = reference::direct(q, k, v, params);
  auto [tq, tk, tv] = upload_qkv(ctx, other, k, v, Storage(DType::f32));
  AttentionRecording rec(ctx, tq, tk, tv, params);
  ASSERT_EQ(rec.tile_layout(), TileLayout::lanes);
  {
    testing::inject_failure("vkCmdDispatch", VK_ERROR_DEVICE_LOST);
    ReusedFrame lost(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
    testing::clear_failures();
    lost.submit();
  }
  tq.write(q);
  ReusedFrame once(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
  once.submit();
  EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(q, k, v, params));
  EXPECT_LE(max_lse_error(rec.lse().download().data, ref.lse), 1e-5);
  ReusedFrame many(ctx.handles(), [&](VkCommandBuffer cmd) {
    for (int step = 0; step < 16; ++step) rec.record(cmd);
  });
  for (int submission = 0; submission < 4; ++submission) {
    many.submit();
    EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(q, k, v, params))
        << "submission " << submission;
  }
}

}  // namespace
}  // namespace flashvk::test
