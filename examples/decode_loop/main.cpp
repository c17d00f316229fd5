// A decode loop as an application writes it with flashvk: a prompt of 32 tokens, then one new
// token a step (grouped-query attention, 8 query heads on 2 KV heads, fp16 storage).
//  - The K/V cache is allocated once, at its capacity. A model would write each token's K and V
//    rows into it as it goes; here the whole cache is written up front.
//  - Attention is recorded once into the application's own command buffer, over prefix() views
//    of the cache, and that command buffer is submitted every step: the step only writes its
//    query and tells the recording how many keys the cache now holds (set_keys).
// Every step is checked against flashvk's float64 reference; the program exits 1 if an output is
// off, 2 on an error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>

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

void check_vk(VkResult result, const char* call) {
  if (result != VK_SUCCESS) throw std::runtime_error(std::string(call) + " failed");
}

}  // namespace

int main() try {
  const int64_t heads = 8, kv_heads = 2, d = 64, prompt = 32, steps = 16;
  const int64_t capacity = prompt + steps;
  flashvk::Context ctx = flashvk::Context::create();  // or Context::adopt(the app's handles)
  std::printf("device: %s\n", ctx.device().name.c_str());
  std::mt19937 rng(7);
  flashvk::HostTensor k_cache = random_tensor({1, kv_heads, capacity, d}, rng);
  flashvk::HostTensor v_cache = random_tensor({1, kv_heads, capacity, d}, rng);
  flashvk::Tensor k = flashvk::Tensor::upload(ctx, k_cache, flashvk::DType::f16);
  flashvk::Tensor v = flashvk::Tensor::upload(ctx, v_cache, flashvk::DType::f16);
  flashvk::Tensor q(ctx, {1, heads, 1, d}, flashvk::DType::f16);

  flashvk::AttentionParams params;
  params.variant = flashvk::Variant::splitkv;  // Flash-Decoding: the keys split over workgroups
  flashvk::AttentionRecording attention(ctx, q, k.prefix(prompt), v.prefix(prompt), params);

  // The application's command buffer, recorded once.
  flashvk::ExternalDevice vk = ctx.handles();
  VkCommandPoolCreateInfo pool_info{};
  pool_info.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
  pool_info.queueFamilyIndex = vk.queue_family;
  VkCommandPool pool = VK_NULL_HANDLE;
  check_vk(vkCreateCommandPool(vk.device, &pool_info, nullptr, &pool), "vkCreateCommandPool");
  VkCommandBufferAllocateInfo alloc{};
  alloc.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
  alloc.commandPool = pool;
  alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  alloc.commandBufferCount = 1;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  check_vk(vkAllocateCommandBuffers(vk.device, &alloc, &cmd), "vkAllocateCommandBuffers");
  VkCommandBufferBeginInfo begin{};
  begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
  check_vk(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
  attention.record(cmd);
  check_vk(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");

  double worst = 0;
  for (int64_t n = prompt + 1; n <= capacity; ++n) {
    flashvk::HostTensor query = random_tensor({1, heads, 1, d}, rng);
    q.write(query);
    attention.set_keys(static_cast<uint32_t>(n));  // the cache now holds n tokens
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    check_vk(vkQueueSubmit(vk.queue, 1, &submit, VK_NULL_HANDLE), "vkQueueSubmit");
    check_vk(vkQueueWaitIdle(vk.queue), "vkQueueWaitIdle");  // a real app waits on its fence
    flashvk::HostTensor out = attention.out().download();
    flashvk::reference::Result ref =
        flashvk::reference::direct(query, prefix(k_cache, n), prefix(v_cache, n), params);
    double err = 0;
    for (size_t i = 0; i < out.data.size(); ++i)
      err = std::max(err, std::abs(double(out.data[i]) - ref.out[i]));
    worst = std::max(worst, err);
    std::printf("token %2lld: %lld keys, %s layout, max error %.2e\n", (long long)(n - prompt),
                (long long)n, flashvk::tile_layout_name(attention.tile_layout()), err);
  }
  vkDestroyCommandPool(vk.device, pool, nullptr);
  std::printf("%s: worst error %.2e over %lld steps, one recording\n",
              worst < 1e-4 ? "ok" : "FAILED", worst, (long long)steps);
  return worst < 1e-4 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 2;
}
