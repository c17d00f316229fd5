// `flashvk bench --decode-loop`: a decode loop as an application runs it. One KV cache, one
// recording that appends the step's K/V row and attends over the cache, recorded once into a
// command buffer of our own that is submitted every step after set_position(). Measures the
// host's time per step (set_position + vkQueueSubmit), the GPU's (timestamps around the
// recording), and the Vulkan objects and device memory the engine creates after the first step.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "args.hpp"
#include "bench.hpp"
#include "commit.hpp"
#include "flashvk/error.hpp"

namespace flashvk::cli {
namespace {

void check_vk(VkResult result, const char* call) {
  if (result != VK_SUCCESS) throw VulkanError(result, call);
}

// The application's side: a command pool and buffer, a fence and a timestamp query pool.
struct AppFrame {
  VkDevice device;
  VkQueue queue;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  VkQueryPool queries = VK_NULL_HANDLE;
  double tick_ns;

  AppFrame(const Context& ctx, AttentionRecording& rec) {
    ExternalDevice h = ctx.handles();
    device = h.device;
    queue = h.queue;
    tick_ns = ctx.device().timestamp_period_ns;
    VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    pi.queueFamilyIndex = h.queue_family;
    check_vk(vkCreateCommandPool(device, &pi, nullptr, &pool), "vkCreateCommandPool");
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check_vk(vkAllocateCommandBuffers(device, &ai, &cmd), "vkAllocateCommandBuffers");
    VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    check_vk(vkCreateFence(device, &fi, nullptr, &fence), "vkCreateFence");
    bool timed = ctx.device().timestamps;
    if (timed) {
      VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
      qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
      qi.queryCount = 2;
      check_vk(vkCreateQueryPool(device, &qi, nullptr, &queries), "vkCreateQueryPool");
    }
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    check_vk(vkBeginCommandBuffer(cmd, &bi), "vkBeginCommandBuffer");
    if (timed) {
      vkCmdResetQueryPool(cmd, queries, 0, 2);
      vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, queries, 0);
    }
    rec.record(cmd);
    if (timed) vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, queries, 1);
    check_vk(vkEndCommandBuffer(cmd), "vkEndCommandBuffer");
  }
  AppFrame(const AppFrame&) = delete;
  AppFrame& operator=(const AppFrame&) = delete;
  ~AppFrame() {
    if (queries) vkDestroyQueryPool(device, queries, nullptr);
    vkDestroyFence(device, fence, nullptr);
    vkDestroyCommandPool(device, pool, nullptr);
  }
  void submit() {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cmd;
    check_vk(vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
  }
  // Waits for the step; its GPU milliseconds (0 without timestamps).
  double wait() {
    check_vk(vkWaitForFences(device, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
    check_vk(vkResetFences(device, 1, &fence), "vkResetFences");
    if (!queries) return 0;
    uint64_t t[2] = {};
    check_vk(vkGetQueryPoolResults(device, queries, 0, 2, sizeof(t), t, sizeof(uint64_t),
                                   VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
             "vkGetQueryPoolResults");
    return double(t[1] - t[0]) * tick_ns * 1e-6;
  }
};

double quantile(std::vector<double> x, double q) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  return x[std::min(x.size() - 1, static_cast<size_t>(q * double(x.size() - 1) + 0.5))];
}

Tensor random_tensor(Context& ctx, std::vector<int64_t> shape, DType dtype, uint32_t seed) {
  HostTensor t(shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : t.data) x = dist(rng);
  return Tensor::upload(ctx, t, dtype);
}

}  // namespace

int run_decode_loop(const Args& args) {
  for (const char* option : {"suite", "nq", "batch", "repeat", "min-time", "flashd-rounds",
                             "block-rows", "group-rows", "block-keys", "splits", "gpu-warm"})
    if (args.has(option))
      throw UsageError{std::string("--decode-loop runs one query a step over a growing cache; "
                                   "drop --") +
                       option};
  for (const char* flag : {"causal", "check", "peak", "warm-cache"})
    if (args.flag(flag)) throw UsageError{std::string("--decode-loop does not take --") + flag};
  const int64_t big = 1 << 24;
  auto heads = args.integer("heads", 32, 1, 4096);
  auto kv_heads = args.integer("kv-heads", 8, 1, 4096);
  auto tokens = args.integer("nk", 4096, 1, big);
  auto d = args.integer("d", 128, 1, 256);
  auto dv = args.integer("dv", d, 1, 256);
  check_shapes({1, heads, 1, d}, {1, kv_heads, tokens, d}, {1, kv_heads, tokens, dv});
  Storage storage = storage_options(args, "--decode-loop");
  bool quantised =
      dtype_quantised(storage.k) && std::ranges::count(dtypes(DTypeUse::append), storage.k);
  if (storage.k != storage.v || (storage.k != storage.q && !quantised))
    throw UsageError{
        "--decode-loop appends to a cache in Q's dtype, or to a cache of a block format (rows "
        "quantised as they go in): --kv-dtype " +
        std::string(dtype_name(storage.k)) + " with --dtype " + dtype_name(storage.q) +
        " is neither"};
  AttentionParams params;
  params.variant = Variant::splitkv;
  if (args.has("variant")) params.variant = parse_variant(args.text("variant"));
  params.hints.tile_layout = parse_layout(args.text("layout", "auto"));
  try {
    params.rope = parse_rope(args.text("rope", "none"));
  } catch (const Error& e) {
    throw UsageError{std::string("--rope: ") + e.what()};
  }
  modifier_options(args, params.mods);
  if (params.mods.has_mask())
    throw UsageError{"--decode-loop attends over a length that grows each step; drop --mask"};

  Context ctx = open_device(args);
  DType dtype = storage.q;  // of Q and the appended rows
  KvCache cache(ctx,
                {1, uint32_t(kv_heads), uint32_t(tokens), uint32_t(d), uint32_t(dv), storage.k});
  Tensor q = random_tensor(ctx, {1, heads, 1, d}, dtype, 1);
  Tensor k = random_tensor(ctx, {1, kv_heads, 1, d}, dtype, 2);
  Tensor v = random_tensor(ctx, {1, kv_heads, 1, dv}, dtype, 3);
  AttentionRecording rec(ctx, q, cache, k, v, params);
  AppFrame frame(ctx, rec);
  std::printf("device: %s (driver %s), commit %s\n", ctx.device().name.c_str(),
              ctx.device().driver.c_str(), FLASHVK_COMMIT);
  std::printf(
      "decode loop: %lld steps of one token, H=%lld Hkv=%lld d=%lld dv=%lld, %s, %s (%s layout)%s"
      "%s%s, recorded once\n",
      (long long)tokens, (long long)heads, (long long)kv_heads, (long long)d, (long long)dv,
      storage_text(storage).c_str(), variant_name(params.variant),
      tile_layout_name(rec.tile_layout()), params.rope != RopeLayout::none ? ", RoPE " : "",
      params.rope != RopeLayout::none ? rope_name(params.rope) : "",
      params_text(params).empty() ? "" : (", " + params_text(params)).c_str());

  using clock = std::chrono::steady_clock;
  std::vector<double> host_us, gpu_ms;
  host_us.reserve(size_t(tokens));
  gpu_ms.reserve(size_t(tokens));
  EngineStats after_first{};
  auto start = clock::now(), last_report = start;
  for (int64_t n = 0; n < tokens; ++n) {
    auto t0 = clock::now();
    rec.set_position(static_cast<uint32_t>(n));
    frame.submit();
    auto t1 = clock::now();
    gpu_ms.push_back(frame.wait());
    host_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (n == 0) after_first = engine_stats();
    if (isatty(2) && clock::now() - last_report > std::chrono::seconds(2)) {  // progress
      last_report = clock::now();
      std::fprintf(stderr, "  step %lld of %lld, %.0f s\n", (long long)n + 1, (long long)tokens,
                   std::chrono::duration<double>(last_report - start).count());
    }
  }
  EngineStats end = engine_stats();
  uint64_t objects = end.objects_created - after_first.objects_created;
  int64_t memory = int64_t(end.device_bytes) - int64_t(after_first.device_bytes);

  // The same attention at the full length, as `flashvk bench` times it: a blocking call over the
  // whole cache, its own timestamps, median of 5.
  std::vector<double> one_shot;
  AttentionParams plain = params;
  plain.rope = RopeLayout::none;  // the cache already holds rotated keys
  for (int i = 0; i < 5; ++i)
    one_shot.push_back(attention(ctx, q, cache.keys(), cache.values(), plain).gpu_ms);
  size_t tail = std::min<size_t>(16, gpu_ms.size());
  std::vector<double> last(gpu_ms.end() - long(tail), gpu_ms.end());
  double last_ms = quantile(last, 0.5), bench_ms = quantile(one_shot, 0.5);

  std::printf(
      "\nhost per step (set_position + vkQueueSubmit): median %.1f us, p99 %.1f us, max %.1f us\n",
      quantile(host_us, 0.5), quantile(host_us, 0.99), quantile(host_us, 1.0));
  if (ctx.device().timestamps) {
    std::printf(
        "GPU per step: first %.3f ms, median %.3f ms, at %lld keys %.3f ms (median of the last "
        "%zu)\n",
        gpu_ms.front(), quantile(gpu_ms, 0.5), (long long)tokens, last_ms, tail);
    std::printf(
        "one attention() over %lld keys: %.3f ms (median of 5): the loop's last steps at %.2fx\n",
        (long long)tokens, bench_ms, bench_ms > 0 ? last_ms / bench_ms : 0.0);
  } else {
    std::printf("GPU per step: the device has no timestamps\n");
  }
  std::printf("after the first step: %llu Vulkan objects created, device memory %+lld bytes\n",
              (unsigned long long)objects, (long long)memory);
  if (args.has("json")) {
    nlohmann::json j = {{"device", ctx.device().name},
                        {"driver", ctx.device().driver},
                        {"commit", FLASHVK_COMMIT},
                        {"decode_loop",
                         {{"steps", tokens},
                          {"heads", heads},
                          {"kv_heads", kv_heads},
                          {"d", d},
                          {"dv", dv},
                          {"dtype", dtype_name(dtype)},
                          {"kv_dtype", dtype_name(storage.k)},
                          {"variant", variant_name(params.variant)},
                          {"layout", tile_layout_name(rec.tile_layout())},
                          {"rope", rope_name(params.rope)},
                          {"host_us_median", quantile(host_us, 0.5)},
                          {"host_us_p99", quantile(host_us, 0.99)},
                          {"gpu_ms_first", gpu_ms.front()},
                          {"gpu_ms_median", quantile(gpu_ms, 0.5)},
                          {"gpu_ms_last", last_ms},
                          {"gpu_ms_one_attention", bench_ms},
                          {"objects_created_after_first_step", objects},
                          {"device_bytes_after_first_step", memory},
                          {"gpu_ms", gpu_ms},
                          {"host_us", host_us}}}};
    write_text(args.text("json"), j.dump(1) + "\n");
  }
  return objects == 0 && memory == 0 ? 0 : 1;
}

}  // namespace flashvk::cli
