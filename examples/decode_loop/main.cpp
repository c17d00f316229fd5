// A decode loop as an application writes it with flashvk today: a prompt of 32 tokens, then one
// new token a step, each step attending over the cache's first tokens (grouped-query attention,
// 8 query heads on 2 KV heads, fp16 storage). The K/V cache is uploaded once, at its capacity;
// each step attends over a prefix() view of it, without a copy. Every step is checked against
// flashvk's float64 reference; the program exits 1 if an output is off, 2 on an error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "flashvk.hpp"

namespace {

flashvk::HostTensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  flashvk::HostTensor t(std::move(shape));
  for (float& x : t.data) x = flashvk::half_to_float(flashvk::float_to_half(normal(rng)));
  return t;
}

// The first `n` tokens of a [B, H, capacity, d] cache.
flashvk::HostTensor prefix(const flashvk::HostTensor& cache, int64_t n) {
  auto s = cache.shape;
  flashvk::HostTensor out({s[0], s[1], n, s[3]});
  for (int64_t bh = 0; bh < s[0] * s[1]; ++bh)
    for (int64_t i = 0; i < n * s[3]; ++i)
      out.data[size_t(bh * n * s[3] + i)] = cache.data[size_t(bh * s[2] * s[3] + i)];
  return out;
}

}  // namespace

int main() try {
  const int64_t heads = 8, kv_heads = 2, d = 64, prompt = 32, steps = 16;
  flashvk::Context ctx = flashvk::Context::create();
  std::printf("device: %s\n", ctx.device().name.c_str());
  std::mt19937 rng(7);
  flashvk::HostTensor k_cache = random_tensor({1, kv_heads, prompt + steps, d}, rng);
  flashvk::HostTensor v_cache = random_tensor({1, kv_heads, prompt + steps, d}, rng);
  flashvk::Tensor k_dev = flashvk::Tensor::upload(ctx, k_cache, flashvk::DType::f16);
  flashvk::Tensor v_dev = flashvk::Tensor::upload(ctx, v_cache, flashvk::DType::f16);
  flashvk::AttentionParams params;
  params.variant = flashvk::Variant::splitkv;  // Flash-Decoding: the keys split over workgroups
  double worst = 0;
  for (int64_t n = prompt + 1; n <= prompt + steps; ++n) {
    flashvk::HostTensor q = random_tensor({1, heads, 1, d}, rng);
    flashvk::Tensor q_dev = flashvk::Tensor::upload(ctx, q, flashvk::DType::f16);
    flashvk::AttentionResult step =
        flashvk::attention(ctx, q_dev, k_dev.prefix(n), v_dev.prefix(n), params);
    flashvk::HostTensor out = step.out.download();
    flashvk::reference::Result ref =
        flashvk::reference::direct(q, prefix(k_cache, n), prefix(v_cache, n), params);
    double err = 0;
    for (size_t i = 0; i < out.data.size(); ++i)
      err = std::max(err, std::abs(double(out.data[i]) - ref.out[i]));
    worst = std::max(worst, err);
    std::printf("token %2lld: %lld keys, %s layout, max error %.2e\n", (long long)(n - prompt),
                (long long)n, flashvk::tile_layout_name(step.tile_layout), err);
  }
  std::printf("%s: worst error %.2e over %lld steps\n", worst < 1e-4 ? "ok" : "FAILED", worst,
              (long long)steps);
  return worst < 1e-4 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 2;
}
