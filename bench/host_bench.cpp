// Host-side costs around the kernels, with Google Benchmark: what an application pays besides
// GPU time. Run: build/bench/flashvk_host_bench (docs/performance.md has figures).
#include <benchmark/benchmark.h>

#include <random>

#include "flashvk.hpp"

namespace {

using namespace flashvk;

Context& shared_context() {
  static Context ctx = Context::create();
  return ctx;
}

HostTensor random_tensor(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  for (float& x : t.data) x = dist(rng);
  return t;
}

// A context from nothing: instance, device, layouts, pools. No pipeline is built yet.
void BM_ContextCreate(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Context::create());
}
BENCHMARK(BM_ContextCreate)->Unit(benchmark::kMillisecond);

// The first call on a fresh context: pipeline creation (the driver compiles the kernel) plus
// the call. Mesa's own shader cache is warm after the first iteration, as for a real app.
void BM_FirstCallBuildsThePipeline(benchmark::State& state) {
  HostTensor q = random_tensor({1, 1, 8, 64}, 1);
  for (auto _ : state) {
    Context ctx = Context::create();
    benchmark::DoNotOptimize(attention(ctx, q, q, q, {}));
  }
}
BENCHMARK(BM_FirstCallBuildsThePipeline)->Unit(benchmark::kMillisecond);

// Host to device copy of a float32 tensor of state.range(0) MiB.
void BM_Upload(benchmark::State& state) {
  HostTensor x = random_tensor({state.range(0) * 1024 * 256}, 2);
  for (auto _ : state) benchmark::DoNotOptimize(Tensor::upload(shared_context(), x, DType::f32));
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0) * (1 << 20));
}
BENCHMARK(BM_Upload)->Arg(1)->Arg(16)->Unit(benchmark::kMillisecond);

// A call so small that the kernel is nothing: plan, descriptor set, record, submit, wait.
void BM_DispatchOverhead(benchmark::State& state) {
  Context& ctx = shared_context();
  HostTensor h = random_tensor({1, 1, 1, 16}, 3);
  Tensor t = Tensor::upload(ctx, h, DType::f32);
  attention(ctx, t, t, t, {});  // pipeline built outside the timing
  for (auto _ : state) benchmark::DoNotOptimize(attention(ctx, t, t, t, {}));
}
BENCHMARK(BM_DispatchOverhead)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
