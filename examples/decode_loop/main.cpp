// A decode loop as an application writes it with flashvk: a prompt of 32 tokens, then one new
// token a step (grouped-query attention, 8 query heads on 2 KV heads, fp16, RoPE, causal).
//  - The KV cache is allocated once, at its capacity (KvCache).
//  - Two recordings append to it and attend over it: one for the prompt (32 rows at once) and
//    one for a decode step (one row). Each is recorded once into the application's own command
//    buffer, between the copies of the step's Q, K and V in from a Staging buffer and of the
//    output out to it. Before a submit the application writes Q, K and V into the staging (a
//    model's own shaders would write them on the device) and tells the recording where in the
//    cache they go (set_position). The recording writes K (rotated at its position) and V into
//    the cache, then attends. No step after the first creates a Vulkan object (engine_stats).
// Every step is checked against flashvk's float64 reference over all the tokens so far; the
// program exits 1 if an output is off or a step allocated, 2 on an error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>

#include "flashvk.hpp"
#include "flashvk/reference.hpp"

namespace {

flashvk::HostTensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  flashvk::HostTensor t(std::move(shape));
  for (float& x : t.data) x = flashvk::half_to_float(flashvk::float_to_half(normal(rng)));
  return t;
}

// Rows [begin, end) of every [.., N, d] matrix.
flashvk::HostTensor rows(const flashvk::HostTensor& x, int64_t begin, int64_t end) {
  auto s = x.shape;
  int64_t n = s[2], d = s[3];
  flashvk::HostTensor out({s[0], s[1], end - begin, d});
  for (int64_t m = 0; m < s[0] * s[1]; ++m)
    std::copy_n(x.data.begin() + (m * n + begin) * d, (end - begin) * d,
                out.data.begin() + m * (end - begin) * d);
  return out;
}

void check_vk(VkResult result, const char* call) {
  if (result != VK_SUCCESS) throw std::runtime_error(std::string(call) + " failed");
}

// The application's command buffer for one recording: recorded once, submitted every step. Q, K
// and V go in from the staging at offsets 0, at_k and at_v; the output comes back at at_o.
struct Frame {
  flashvk::ExternalDevice vk;
  flashvk::Staging staging;
  uint64_t at_k, at_v, at_o;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;

  Frame(flashvk::Context& ctx, flashvk::AttentionRecording& attention, const flashvk::Tensor& q,
        const flashvk::Tensor& k, const flashvk::Tensor& v)
      : vk(ctx.handles()),
        staging(ctx, q.bytes() + k.bytes() + v.bytes() + attention.out().bytes()),
        at_k(q.bytes()),
        at_v(q.bytes() + k.bytes()),
        at_o(q.bytes() + k.bytes() + v.bytes()) {
    VkCommandPoolCreateInfo pool_info{};
    pool_info.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO;
    pool_info.queueFamilyIndex = vk.queue_family;
    check_vk(vkCreateCommandPool(vk.device, &pool_info, nullptr, &pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo alloc{};
    alloc.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO;
    alloc.commandPool = pool;
    alloc.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    alloc.commandBufferCount = 1;
    check_vk(vkAllocateCommandBuffers(vk.device, &alloc, &cmd), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fence_info{};
    fence_info.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO;
    check_vk(vkCreateFence(vk.device, &fence_info, nullptr, &fence), "vkCreateFence");
    VkCommandBufferBeginInfo begin{};
    begin.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO;
    check_vk(vkBeginCommandBuffer(cmd, &begin), "vkBeginCommandBuffer");
    staging.record_upload(cmd, q, 0);  // a real frame records its other work around these
    staging.record_upload(cmd, k, at_k);
    staging.record_upload(cmd, v, at_v);
    attention.record(cmd);
    staging.record_download(cmd, attention.out(), at_o);
    check_vk(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
  }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  ~Frame() {
    vkDestroyFence(vk.device, fence, nullptr);
    vkDestroyCommandPool(vk.device, pool, nullptr);
  }
  void submit_and_wait() {
    VkSubmitInfo submit{};
    submit.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO;
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    check_vk(vkQueueSubmit(vk.queue, 1, &submit, fence), "vkQueueSubmit");
    check_vk(vkWaitForFences(vk.device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    check_vk(vkResetFences(vk.device, 1, &fence), "vkResetFences");
  }
};

}  // namespace

int main() try {
  const int64_t heads = 8, kv_heads = 2, d = 64, prompt = 32, steps = 16;
  const int64_t capacity = prompt + steps;
  flashvk::Context ctx = flashvk::Context::create();  // or Context::adopt(the app's handles)
  std::printf("device: %s\n", ctx.device().name.c_str());
  const flashvk::DType dtype =
      ctx.device().fp16_storage ? flashvk::DType::f16 : flashvk::DType::f32;

  // The cache, and the tensors a step's Q, K and V are written to: for the prompt and a step.
  flashvk::KvCache cache(ctx, {1, kv_heads, capacity, d, d, dtype});
  flashvk::Tensor prompt_q(ctx, {1, heads, prompt, d}, dtype);
  flashvk::Tensor prompt_k(ctx, {1, kv_heads, prompt, d}, dtype);
  flashvk::Tensor prompt_v(ctx, {1, kv_heads, prompt, d}, dtype);
  flashvk::Tensor step_q(ctx, {1, heads, 1, d}, dtype);
  flashvk::Tensor step_k(ctx, {1, kv_heads, 1, d}, dtype);
  flashvk::Tensor step_v(ctx, {1, kv_heads, 1, d}, dtype);

  flashvk::AttentionParams params;
  params.variant = flashvk::Variant::splitkv;  // Flash-Decoding: the keys split over workgroups
  params.mods.causal = true;
  params.rope = flashvk::RopeLayout::half;  // K rotated once, as it enters the cache
  flashvk::AttentionRecording prefill(ctx, prompt_q, cache, prompt_k, prompt_v, params);
  flashvk::AttentionRecording decode(ctx, step_q, cache, step_k, step_v, params);
  Frame prefill_frame(ctx, prefill, prompt_q, prompt_k, prompt_v);
  Frame decode_frame(ctx, decode, step_q, step_k, step_v);

  // What the model would compute; kept on the host only to check the outputs.
  std::mt19937 rng(7);
  flashvk::HostTensor all_k = random_tensor({1, kv_heads, capacity, d}, rng);
  flashvk::HostTensor all_v = random_tensor({1, kv_heads, capacity, d}, rng);

  double worst = 0;
  flashvk::EngineStats after_first_step{};
  for (int64_t length = 0; length < capacity;) {
    bool first = length == 0;
    int64_t n = first ? prompt : 1;  // rows appended by this submit
    Frame& frame = first ? prefill_frame : decode_frame;
    flashvk::HostTensor query = random_tensor({1, heads, n, d}, rng);
    frame.staging.write(query, dtype, 0);
    frame.staging.write(rows(all_k, length, length + n), dtype, frame.at_k);
    frame.staging.write(rows(all_v, length, length + n), dtype, frame.at_v);
    flashvk::AttentionRecording& attention = first ? prefill : decode;
    attention.set_position(static_cast<uint32_t>(length));  // the tokens already cached
    frame.submit_and_wait();
    if (length == prompt) after_first_step = flashvk::engine_stats();
    length += n;

    flashvk::HostTensor out = frame.staging.read({1, heads, n, d}, flashvk::DType::f32, frame.at_o);
    flashvk::reference::Result ref =
        flashvk::reference::direct(query, rows(all_k, 0, length), rows(all_v, 0, length), params);
    double err = 0;
    for (size_t i = 0; i < out.data.size(); ++i)
      err = std::max(err, std::abs(double(out.data[i]) - ref.out[i]));
    worst = std::max(worst, err);
    std::printf("%s: %2lld tokens cached, %s layout, max error %.2e\n",
                first ? "prompt " : "decode ", (long long)length,
                flashvk::tile_layout_name(attention.tile_layout()), err);
  }
  // fp16 holds the rotated Q and K to 2^-11 of their size.
  double bound = dtype == flashvk::DType::f16 ? 1e-2 : 1e-4;
  uint64_t made = flashvk::engine_stats().objects_created - after_first_step.objects_created;
  bool ok = worst < bound && made == 0;
  std::printf(
      "%s: worst error %.2e over a prompt and %lld steps, two recordings, %llu Vulkan "
      "objects made after the first step\n",
      ok ? "ok" : "FAILED", worst, (long long)steps, (unsigned long long)made);
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "decode_loop: %s\n", e.what());
  return 2;
}
