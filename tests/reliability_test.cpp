// Determinism and threads: the same inputs give bit-identical outputs run after run, from one
// thread or several, on one shared context or one context per thread.
#include <thread>

#include "test_util.hpp"

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
  p.causal = true;
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
