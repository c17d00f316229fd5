// An application that already has a Vulkan device hands it to the engine (Context::adopt), runs
// attention both ways (engine-submitted and recorded into its own command buffer), and keeps
// using its handles after the engine is gone.
#include <cstring>
#include <functional>

#include "flashvk/pipelines.hpp"
#include "test_util.hpp"

namespace flashvk::test {
namespace {

// An application's frame on a queue: a command buffer it records (`fill`), submits and waits for.
void submit_frame(VkDevice device, VkQueue queue, uint32_t family,
                  const std::function<void(VkCommandBuffer)>& fill) {
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.queueFamilyIndex = family;
  VkCommandPool pool = VK_NULL_HANDLE;
  ASSERT_EQ(vkCreateCommandPool(device, &pi, nullptr, &pool), VK_SUCCESS);
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ai.commandPool = pool;
  ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ai.commandBufferCount = 1;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  EXPECT_EQ(vkAllocateCommandBuffers(device, &ai, &cmd), VK_SUCCESS);
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  vkBeginCommandBuffer(cmd, &bi);
  fill(cmd);
  vkEndCommandBuffer(cmd);
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &cmd;
  EXPECT_EQ(vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE), VK_SUCCESS);
  EXPECT_EQ(vkQueueWaitIdle(queue), VK_SUCCESS);
  vkDestroyCommandPool(device, pool, nullptr);  // frees the command buffer
}

struct AppVulkan {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice physical = VK_NULL_HANDLE;
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t family = 0;

  bool size_control = false;  // subgroupSizeControl and computeFullSubgroups enabled

  /// `want_size_control`: enable VK_EXT_subgroup_size_control's features where the device has them.
  explicit AppVulkan(uint32_t api_version = VK_API_VERSION_1_1, bool want_size_control = false) {
    VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
    app.apiVersion = api_version;
    VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    ii.pApplicationInfo = &app;
    EXPECT_EQ(vkCreateInstance(&ii, nullptr, &instance), VK_SUCCESS);
    uint32_t n = 1;
    vkEnumeratePhysicalDevices(instance, &n, &physical);
    uint32_t count = 0;
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, nullptr);
    std::vector<VkQueueFamilyProperties> families(count);
    vkGetPhysicalDeviceQueueFamilyProperties(physical, &count, families.data());
    while (!(families[family].queueFlags & VK_QUEUE_COMPUTE_BIT)) ++family;
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    qi.queueFamilyIndex = family;
    qi.queueCount = 1;
    qi.pQueuePriorities = &priority;
    VkPhysicalDevice16BitStorageFeatures f16{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    f16.storageBuffer16BitAccess = VK_TRUE;
    VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    di.pNext = &f16;
    di.queueCreateInfoCount = 1;
    di.pQueueCreateInfos = &qi;
    VkPhysicalDeviceSubgroupSizeControlFeaturesEXT sizes{
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT};
    const char* size_ext = VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME;
    if (want_size_control && list_devices()[0].subgroup_size_control) {
      size_control = true;
      sizes.subgroupSizeControl = sizes.computeFullSubgroups = VK_TRUE;
      f16.pNext = &sizes;
      di.enabledExtensionCount = 1;
      di.ppEnabledExtensionNames = &size_ext;
    }
    EXPECT_EQ(vkCreateDevice(physical, &di, nullptr, &device), VK_SUCCESS);
    vkGetDeviceQueue(device, family, 0, &queue);
  }
  ~AppVulkan() {
    vkDestroyDevice(device, nullptr);
    vkDestroyInstance(instance, nullptr);
  }
  ExternalDevice external() const {
    ExternalDevice e{instance, physical, device, queue, family, true};
    e.subgroup_size_control_enabled = size_control;
    return e;
  }

  void submit(const std::function<void(VkCommandBuffer)>& fill) {
    submit_frame(device, queue, family, fill);
  }
};

TEST(Embedding, AdoptedDeviceRunsAttentionAndSurvivesTheEngine) {
  AppVulkan app;
  HostTensor q = random_tensor({1, 2, 10, 16}, 1), k = random_tensor({1, 2, 50, 16}, 2),
             v = random_tensor({1, 2, 50, 16}, 3);
  AttentionParams params;
  params.mods.causal = true;
  reference::Result ref = reference::direct(q, k, v, params);
  {
    Context ctx = Context::adopt(app.external());
    EXPECT_FALSE(ctx.owns_device());
    HostAttentionResult r = attention(ctx, q, k, v, params, DType::f16);
    EXPECT_LE(max_error(r.out.data, ref.out), tolerance(q, k, v, params, std::ldexp(1.0, -11)));

    // Recorded into the application's command buffer, submitted by the application.
    Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k, DType::f32),
           tv = Tensor::upload(ctx, v, DType::f32);
    AttentionRecording rec(ctx, tq, tk, tv, params);
    app.submit([&](VkCommandBuffer cmd) { rec.record(cmd); });
    EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(q, k, v, params));
  }
  // The engine is gone; the application's device and queue still work.
  EXPECT_EQ(vkDeviceWaitIdle(app.device), VK_SUCCESS);
  bool ran = false;
  app.submit([&](VkCommandBuffer) { ran = true; });
  EXPECT_TRUE(ran);
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
  bi.size = 64;
  bi.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT;
  VkBuffer buffer = VK_NULL_HANDLE;
  EXPECT_EQ(vkCreateBuffer(app.device, &bi, nullptr, &buffer), VK_SUCCESS);
  vkDestroyBuffer(app.device, buffer, nullptr);
}

// A host-visible buffer of the application's own on the context's device, mapped.
struct AppBuffer {
  VkDevice device = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  uint8_t* bytes = nullptr;
  uint64_t size = 0;

  AppBuffer(const ExternalDevice& h, uint64_t n, VkBufferUsageFlags usage)
      : device(h.device), size(n) {
    VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    bi.size = n;
    bi.usage = usage;
    EXPECT_EQ(vkCreateBuffer(device, &bi, nullptr, &buffer), VK_SUCCESS);
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(device, buffer, &req);
    VkPhysicalDeviceMemoryProperties props;
    vkGetPhysicalDeviceMemoryProperties(h.physical_device, &props);
    const VkMemoryPropertyFlags want =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t type = 0;
    while (type < props.memoryTypeCount && (!(req.memoryTypeBits & (1u << type)) ||
                                            (props.memoryTypes[type].propertyFlags & want) != want))
      ++type;
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = type;
    EXPECT_EQ(vkAllocateMemory(device, &ai, nullptr, &memory), VK_SUCCESS);
    EXPECT_EQ(vkBindBufferMemory(device, buffer, memory, 0), VK_SUCCESS);
    void* mapped = nullptr;
    EXPECT_EQ(vkMapMemory(device, memory, 0, VK_WHOLE_SIZE, 0, &mapped), VK_SUCCESS);
    bytes = static_cast<uint8_t*>(mapped);
  }
  ~AppBuffer() {
    vkDestroyBuffer(device, buffer, nullptr);
    vkFreeMemory(device, memory, nullptr);
  }
  AppBuffer(const AppBuffer&) = delete;
  AppBuffer& operator=(const AppBuffer&) = delete;
};

uint64_t round_up(uint64_t x, uint64_t to) {
  return (x + to - 1) / to * to;
}

// A tensor's place in an application's buffer.
struct Place {
  std::vector<int64_t> shape;
  DType dtype;
  uint64_t offset = 0, bytes = 0;
};

// Places each tensor at the next multiple of `align` at least a word past the previous one (the
// first not at 0); returns the bytes the buffer needs.
uint64_t lay_out(std::vector<Place>& places, uint64_t align) {
  uint64_t at = align;
  for (Place& p : places) {
    p.offset = at;
    p.bytes = buffer_bytes(p.dtype, numel(p.shape));
    at = round_up(p.offset + p.bytes + 4, align);
  }
  return at + align;
}

// Bytes of `app` outside every place that no longer hold `pattern`.
uint64_t written_outside(const uint8_t* bytes, uint64_t size, const std::vector<Place>& places,
                         uint8_t pattern) {
  uint64_t written = 0;
  for (uint64_t i = 0; i < size; ++i) {
    bool inside = false;
    for (const Place& p : places) inside |= i >= p.offset && i < p.offset + p.bytes;
    written += !inside && bytes[i] != pattern;
  }
  return written;
}

class ViewTest : public VulkanTest {};

// Q, K and V as views at offsets in one buffer of the application's, written with
// Tensor::write; O and LSE written by a recording, submitted by the application, into views of
// the same buffer. The outputs are read straight from the application's mapping and compared
// with the float64 reference on the stored values; every byte around the tensors keeps the
// pattern the buffer was filled with.
TEST_F(ViewTest, AttentionReadsAndWritesViewsAtOffsetsInTheAppsBuffer) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  ExternalDevice h = ctx.handles();
  HostTensor q = random_tensor({1, 4, 5, 64}, 61), k = random_tensor({1, 2, 40, 64}, 62),
             v = random_tensor({1, 2, 40, 32}, 63);
  AttentionParams params;
  params.mods.causal = true;
  std::vector<Storage> storages = {DType::f32, {DType::f32, DType::q8_0, DType::q4_0}};
  if (info.fp16_storage) storages.push_back(DType::f16);
  std::vector<TileLayout> layouts = {TileLayout::automatic, TileLayout::shared};
  if (info.subgroup_shuffle && info.texel_buffers) layouts.push_back(TileLayout::registers);
  const uint64_t align =
      std::max<uint64_t>({info.min_storage_offset_alignment, info.min_texel_offset_alignment, 4});
  const uint8_t kPattern = 0xab;
  for (const Storage& storage : storages) {
    HostTensor qs = stored_values(q, storage.q), ks = stored_values(k, storage.k),
               vs = stored_values(v, storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    std::vector<Place> places = {{q.shape, storage.q},
                                 {k.shape, storage.k},
                                 {v.shape, storage.v},
                                 {{1, 4, 5, 32}, DType::f32},
                                 {{1, 4, 5}, DType::f32}};
    AppBuffer app(h, lay_out(places, align), kTensorUsage);
    for (TileLayout layout : layouts) {
      params.hints.tile_layout = layout;
      std::memset(app.bytes, kPattern, app.size);
      std::vector<Tensor> t;
      for (const Place& p : places)
        t.push_back(Tensor::view(ctx, app.buffer, p.offset, p.shape, p.dtype));
      t[0].write(q);
      t[1].write(k);
      t[2].write(v);
      AttentionRecording rec(ctx, t[0], t[1], t[2], params, {&t[3], &t[4]});
      std::string what = storage_name(storage) + ", " + tile_layout_name(rec.tile_layout());
      if (layout != TileLayout::automatic) {
        EXPECT_EQ(rec.tile_layout(), layout) << what;
      }
      EXPECT_EQ(rec.out().buffer(), app.buffer);
      EXPECT_EQ(rec.out().offset(), places[3].offset);
      submit_frame(h.device, h.queue, h.queue_family,
                   [&](VkCommandBuffer cmd) { rec.record(cmd); });
      std::vector<float> out(numel(places[3].shape)), lse(numel(places[4].shape));
      std::memcpy(out.data(), app.bytes + places[3].offset, out.size() * 4);
      std::memcpy(lse.data(), app.bytes + places[4].offset, lse.size() * 4);
      EXPECT_LE(max_error(out, ref.out),
                tolerance(qs, ks, vs, params) + weight_rounding(rec.tile_layout(), vs))
          << what;
      EXPECT_LE(max_lse_error(lse, ref.lse), 1e-5) << what;
      EXPECT_EQ(rec.out().download().data, out) << what;
      EXPECT_EQ(t[1].download().data, ks.data) << what;
      EXPECT_EQ(written_outside(app.bytes, app.size, places, kPattern), 0u)
          << what << ": bytes outside the tensors were written";
    }
  }
}

// What a view cannot do is refused by name: no buffer, a buffer kernels cannot bind, an offset
// off the device's alignment, copies the buffer's usage does not allow, outputs of the wrong
// shape or type. K and V in a buffer without texel usage are refused register tiles when asked
// for them, and never given them by `automatic` (which a CPU driver otherwise picks).
TEST_F(ViewTest, WhatAViewCannotDoIsRefusedByName) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  ExternalDevice h = ctx.handles();
  const VkBufferUsageFlags no_texels =
      VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
  AppBuffer app(h, 1 << 16, no_texels);
  HostTensor q = random_tensor({1, 2, 3, 16}, 71), k = random_tensor({1, 2, 20, 16}, 72);
  expect_refused([&] { Tensor::view(ctx, VK_NULL_HANDLE, 0, {4}, DType::f32); }, "null VkBuffer");
  expect_refused(
      [&] { Tensor::view(ctx, app.buffer, 0, {4}, DType::f32, VK_BUFFER_USAGE_TRANSFER_SRC_BIT); },
      "VK_BUFFER_USAGE_STORAGE_BUFFER_BIT");
  if (info.min_storage_offset_alignment > 1)
    expect_refused(
        [&] {
          Tensor::view(ctx, app.buffer, info.min_storage_offset_alignment / 2, {4}, DType::f32);
        },
        "minStorageBufferOffsetAlignment");
  expect_refused([&] { Tensor::view(ctx, app.buffer, 0, {2, 40}, DType::q8_0); }, "blocks of 32");
  Tensor tq = Tensor::view(ctx, app.buffer, 0, q.shape, DType::f32, no_texels);
  Tensor tk = Tensor::view(ctx, app.buffer, 4096, k.shape, DType::f32, no_texels);
  tq.write(q);
  tk.write(k);
  expect_refused([&] { tk.download(); }, "VK_BUFFER_USAGE_TRANSFER_SRC_BIT");
  expect_refused([&] { tk.write(q); }, "into one of shape");
  HostTensor short_data = k;
  short_data.data.pop_back();
  expect_refused([&] { tk.write(short_data); }, "holding 639 values");
  AttentionParams params;
  Tensor wrong(ctx, {1, 2, 3, 15}, DType::f32), half_out(ctx, {1, 2, 3, 16}, DType::f32);
  expect_refused(
      [&] {
        AttentionRecording(ctx, tq, tk, tk, params, {&wrong, nullptr});
      },
      "attention writes f32 [1, 2, 3, 16]");
  Tensor lse(ctx, {1, 2, 3}, DType::f32);
  params.want_lse = false;
  expect_refused(
      [&] {
        AttentionRecording(ctx, tq, tk, tk, params, {&half_out, &lse});
      },
      "want_lse false");
  params.want_lse = true;
  if (!(info.subgroup_shuffle && info.texel_buffers)) return;
  params.hints.tile_layout = TileLayout::registers;
  expect_refused([&] { AttentionRecording(ctx, tq, tk, tk, params); },
                 "VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT");
  // The same call on a buffer with texel usage runs register tiles: the usage was the reason.
  AppBuffer texels(h, 1 << 16, kTensorUsage);
  Tensor tk_texels = Tensor::view(ctx, texels.buffer, 0, k.shape, DType::f32);
  tk_texels.write(k);
  EXPECT_EQ(AttentionRecording(ctx, tq, tk_texels, tk_texels, params).tile_layout(),
            TileLayout::registers);
  params.hints.tile_layout = TileLayout::automatic;
  AttentionRecording rec(ctx, tq, tk, tk, params, {&half_out, nullptr});
  EXPECT_NE(rec.tile_layout(), TileLayout::registers);
  EXPECT_EQ(rec.out().buffer(), half_out.buffer());
  submit_frame(h.device, h.queue, h.queue_family, [&](VkCommandBuffer cmd) { rec.record(cmd); });
  reference::Result ref = reference::direct(q, k, k, params);
  EXPECT_LE(max_error(half_out.download().data, ref.out), tolerance(q, k, k, params));
}

// Attention over the first 37 keys of a KV cache of capacity 50 (Tensor::prefix: the heads stay
// 50 keys apart), in every variant family's layouts and in three storages (block formats keep
// their scales after all the cache's quants), against float64 on those keys' stored values.
TEST_F(ViewTest, KAndVArePrefixesOfALongerCache) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  HostTensor q = random_tensor({2, 4, 3, 64}, 81), k = random_tensor({2, 2, 50, 64}, 82),
             v = random_tensor({2, 2, 50, 32}, 83);
  const int64_t n = 37;
  std::vector<Storage> storages = {DType::f32, {DType::f32, DType::q8_0, DType::q4_0}};
  if (info.fp16_storage) storages.push_back(DType::f16);
  AttentionParams params;
  params.mods.causal = true;
  for (const Storage& storage : storages) {
    Tensor tq = Tensor::upload(ctx, q, storage.q), tk = Tensor::upload(ctx, k, storage.k),
           tv = Tensor::upload(ctx, v, storage.v);
    Tensor pk = tk.prefix(n), pv = tv.prefix(n);
    EXPECT_EQ(pk.row_capacity(), 50);
    HostTensor ks = first_rows(stored_values(k, storage.k), n),
               vs = first_rows(stored_values(v, storage.v), n);
    EXPECT_EQ(pk.download().data, ks.data) << storage_name(storage);
    reference::Result ref = reference::direct(stored_values(q, storage.q), ks, vs, params);
    for (Variant variant : {Variant::naive, Variant::flash2, Variant::splitkv}) {
      params.variant = variant;
      std::vector<TileLayout> layouts = {TileLayout::automatic};
      if (variant != Variant::naive) {
        layouts.push_back(TileLayout::shared);
        if (info.subgroup_shuffle && info.texel_buffers) layouts.push_back(TileLayout::registers);
        if (variant == Variant::splitkv && info.subgroup_shuffle && !storage.own_kv())
          layouts.push_back(TileLayout::lanes);
      }
      for (TileLayout layout : layouts) {
        params.hints.tile_layout = layout;
        AttentionResult r = attention(ctx, tq, pk, pv, params);
        std::string what = storage_name(storage) + ", " + variant_name(variant) + ", " +
                           tile_layout_name(r.tile_layout);
        EXPECT_LE(max_error(r.out.download().data, ref.out),
                  tolerance(stored_values(q, storage.q), ks, vs, params))
            << what;
      }
    }
  }
  params = {};
  Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k, DType::f32);
  expect_refused([&] { tk.prefix(51); }, "at most 50");
  expect_refused([&] { tk.prefix(n).write(first_rows(k, n)); }, "write the whole tensor");
  {  // Q may be a prefix too: the first 2 queries of each head, rows 3 apart
    HostTensor q2 = first_rows(q, 2);
    reference::Result ref = reference::direct(q2, k, k, params);
    AttentionResult r = attention(ctx, tq.prefix(2), tk, tk, params);
    EXPECT_LE(max_error(r.out.download().data, ref.out), tolerance(q2, k, k, params));
  }
  EXPECT_EQ(tk.prefix(n).prefix(n - 1).row_capacity(), 50);  // still the cache's heads
  Tensor t40 = Tensor::upload(ctx, random_tensor({2, 2, 40, 64}, 84), DType::f32);
  expect_refused([&] { attention(ctx, tq, tk.prefix(n), t40.prefix(n), params); }, "must be alike");
  params.rope = RopeLayout::half;
  expect_refused([&] { attention(ctx, tq, tk.prefix(n), tk.prefix(n), params); },
                 "rotate K before");
  expect_refused([&] { rope(ctx, tk.prefix(n), {}); }, "must be dense");
  AttentionRecording rotated(ctx, tq, tk, tk, params);
  expect_refused([&] { rotated.set_keys(n); }, "record it again");
}

// [B, H, N, d] as the token-major [B, N, H, d] that model code keeps (and back).
HostTensor swap_heads_and_rows(const HostTensor& x) {
  const int64_t b = x.shape[0], h = x.shape[1], n = x.shape[2], d = x.shape[3];
  HostTensor y({b, n, h, d});
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < h; ++j)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t e = 0; e < d; ++e)
          y.data[((i * n + r) * h + j) * d + e] = x.data[((i * h + j) * n + r) * d + e];
  return y;
}

// The element strides of a [B, H, N, d] view of a token-major [B, N, H, d] tensor.
std::vector<int64_t> token_major(const std::vector<int64_t>& shape) {
  const int64_t h = shape[1], n = shape[2], d = shape[3];
  return {n * h * d, d, h * d, 1};
}

// Q, K, V and O token-major ([B, N, H, d], as a model's projections leave them) in one buffer of
// the application's, viewed with strides as [B, H, N, d]: every variant and layout reads Q, K
// and V and writes O where the strides say, matching the float64 reference, with every byte
// outside the tensors untouched; a prefix of the strided K and V attends over their first keys.
TEST_F(ViewTest, StridedViewsOfTokenMajorTensors) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  ExternalDevice h = ctx.handles();
  HostTensor q = random_tensor({2, 4, 5, 64}, 91), k = random_tensor({2, 2, 37, 64}, 92),
             v = random_tensor({2, 2, 37, 32}, 93);
  const std::vector<int64_t> o_shape = {2, 4, 5, 32};
  AttentionParams params;
  params.mods.causal = true;
  std::vector<Storage> storages = {DType::f32, {DType::f32, DType::q8_0, DType::q4_0}};
  if (info.fp16_storage) storages.push_back(DType::f16);
  const uint64_t align =
      std::max<uint64_t>({info.min_storage_offset_alignment, info.min_texel_offset_alignment, 4});
  const uint8_t kPattern = 0xab;
  for (const Storage& storage : storages) {
    HostTensor qs = stored_values(q, storage.q), ks = stored_values(k, storage.k),
               vs = stored_values(v, storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    const int64_t n = 20;  // the prefix's keys
    reference::Result ref_prefix =
        reference::direct(qs, first_rows(ks, n), first_rows(vs, n), params);
    std::vector<Place> places = {{q.shape, storage.q},
                                 {k.shape, storage.k},
                                 {v.shape, storage.v},
                                 {o_shape, DType::f32},
                                 {{2, 4, 5}, DType::f32}};
    AppBuffer app(h, lay_out(places, align), kTensorUsage);
    std::memset(app.bytes, kPattern, app.size);
    const HostTensor* inputs[3] = {&q, &k, &v};
    for (int i = 0; i < 3; ++i) {  // Q, K and V token-major, in their storage
      std::vector<uint8_t> bytes = encode(swap_heads_and_rows(*inputs[i]).data, places[i].dtype);
      std::memcpy(app.bytes + places[i].offset, bytes.data(), bytes.size());
    }
    std::vector<Tensor> t;
    for (size_t i = 0; i < places.size(); ++i) {
      const Place& p = places[i];
      t.push_back(Tensor::view(ctx, app.buffer, p.offset, p.shape, p.dtype, kTensorUsage,
                               i < 4 ? token_major(p.shape) : std::vector<int64_t>{}));
    }
    EXPECT_FALSE(t[1].is_dense());
    EXPECT_EQ(t[1].bytes(), places[1].bytes);
    EXPECT_EQ(t[1].download().data, ks.data) << storage_name(storage) << ": gathered K";
    std::vector<Variant> variants = {Variant::flash2, Variant::splitkv};
    if (storage.k == DType::f32)
      variants = {Variant::naive,  Variant::online, Variant::flash1,
                  Variant::flash2, Variant::flashd, Variant::splitkv};
    for (Variant variant : variants) {
      params.variant = variant;
      std::vector<TileLayout> layouts = {TileLayout::automatic};
      if (variant != Variant::naive) {
        layouts.push_back(TileLayout::shared);
        layouts.push_back(TileLayout::blocks);
        if (info.subgroup_shuffle && info.texel_buffers) layouts.push_back(TileLayout::registers);
        if (variant == Variant::splitkv && info.subgroup_shuffle)
          layouts.push_back(TileLayout::lanes);
        if (info.cooperative_matrix && variant != Variant::online && storage.q == DType::f16 &&
            !storage.own_kv())
          layouts.push_back(TileLayout::cooperative_matrix);
      }
      for (TileLayout layout : layouts) {
        params.hints.tile_layout = layout;
        std::memset(app.bytes + places[3].offset, kPattern, places[3].bytes + places[4].bytes);
        AttentionRecording rec(ctx, t[0], t[1], t[2], params, {&t[3], &t[4]});
        std::string what = storage_name(storage) + ", " + variant_name(variant) + ", " +
                           tile_layout_name(rec.tile_layout());
        if (layout != TileLayout::automatic) {
          EXPECT_EQ(rec.tile_layout(), layout) << what;
        }
        submit_frame(h.device, h.queue, h.queue_family,
                     [&](VkCommandBuffer cmd) { rec.record(cmd); });
        HostTensor o_tokens({2, 5, 4, 32}), lse({2, 4, 5});
        std::memcpy(o_tokens.data.data(), app.bytes + places[3].offset, places[3].bytes);
        std::memcpy(lse.data.data(), app.bytes + places[4].offset, places[4].bytes);
        HostTensor o = swap_heads_and_rows(o_tokens);
        double tol = tolerance(qs, ks, vs, params) + weight_rounding(rec.tile_layout(), vs);
        EXPECT_LE(max_error(o.data, ref.out), tol) << what;
        EXPECT_LE(max_lse_error(lse.data, ref.lse), 1e-5) << what;
        EXPECT_EQ(rec.out().download().data, o.data) << what << ": O gathered by download()";
        // A prefix of the strided K and V: their first n keys, rows still Hkv apart.
        AttentionResult r = attention(ctx, t[0], t[1].prefix(n), t[2].prefix(n), params);
        EXPECT_LE(max_error(r.out.download().data, ref_prefix.out), tol) << what << ", prefix";
      }
    }
    EXPECT_EQ(written_outside(app.bytes, app.size, places, kPattern), 0u)
        << storage_name(storage) << ": bytes outside the tensors were written";
  }
}

// What strides cannot be is refused by name; a head stride of 0 in K and V is a broadcast.
TEST_F(ViewTest, StridesThatDoNotFitAreRefusedByName) {
  Context& ctx = context();
  ExternalDevice h = ctx.handles();
  AppBuffer app(h, 1 << 20, kTensorUsage);
  const std::vector<int64_t> shape = {1, 4, 8, 16};
  auto view = [&](std::vector<int64_t> strides, std::vector<int64_t> s = {1, 4, 8, 16}) {
    return Tensor::view(ctx, app.buffer, 0, s, DType::f32, kTensorUsage, strides);
  };
  expect_refused([&] { view({1, 2, 3}); }, "one stride per dimension");
  expect_refused([&] { view({512, 128, 16, 2}); }, "the last stride must be 1");
  expect_refused([&] { view({512, 8, 64, 1}); }, "multiple of the last dimension (16)");
  Tensor q = view(token_major(shape)), k = view(token_major(shape)), v = view({});
  EXPECT_TRUE(v.is_dense());
  EXPECT_FALSE(q.is_dense());
  EXPECT_EQ(q.span(), 512);
  expect_refused([&] { attention(ctx, q, k, v, {}); }, "K and V must be laid out alike");
  HostTensor qh = random_tensor(shape, 95), kh = random_tensor(shape, 96);
  Tensor qd = Tensor::upload(ctx, qh, DType::f32), kd = Tensor::upload(ctx, kh, DType::f32);
  Tensor o_overlap = view({0, 0, 16, 1});  // every head's output in one place
  expect_refused(
      [&] {
        AttentionRecording(ctx, qd, kd, kd, {}, {&o_overlap, nullptr});
      },
      "put two of its values in one place");
  AttentionParams with_lse;
  with_lse.want_lse = true;
  Tensor o(ctx, shape, DType::f32);
  Tensor lse_strided = view({64, 16, 1}, {1, 4, 8});  // [B, H, Nq], heads 16 apart
  expect_refused(
      [&] {
        AttentionRecording(ctx, qd, kd, kd, with_lse, {&o, &lse_strided});
      },
      "LSE output must be dense");
  expect_refused([&] { q.write(qh); }, "strided view");
  AttentionParams rotated;
  rotated.rope = RopeLayout::half;
  expect_refused([&] { attention(ctx, q, kd, kd, rotated); }, "rope rotates a dense Q");
  // A dimension of one value may have any stride: V dense but for its batch stride is laid out
  // as K, and Q, K and V sliced from a fused QKV projection [Nq, H + 2 Hkv, d] (B = 1).
  {
    const int64_t heads = 4, kv_heads = 2, nq = 8, d = 16, width = (heads + 2 * kv_heads) * d;
    HostTensor qkv = random_tensor({nq, heads + 2 * kv_heads, d}, 97);
    std::memcpy(app.bytes, qkv.data.data(), qkv.data.size() * 4);
    auto slice = [&](int64_t first_head, int64_t count) {  // heads [first, first + count)
      HostTensor x({1, count, nq, d});
      for (int64_t j = 0; j < count; ++j)
        for (int64_t i = 0; i < nq; ++i)
          std::copy_n(qkv.data.begin() + i * width + (first_head + j) * d, d,
                      x.data.begin() + (j * nq + i) * d);
      return x;
    };
    auto view_heads = [&](int64_t first_head, int64_t count, int64_t batch_stride) {
      return Tensor::view(ctx, app.buffer, uint64_t(first_head * d * 4), {1, count, nq, d},
                          DType::f32, kTensorUsage, {batch_stride, d, width, 1});
    };
    HostTensor hq = slice(0, heads), hk = slice(heads, kv_heads),
               hv = slice(heads + kv_heads, kv_heads);
    Tensor fq = view_heads(0, heads, 0), fk = view_heads(heads, kv_heads, 0),
           fv = view_heads(heads + kv_heads, kv_heads, 1 << 20);  // never stepped
    EXPECT_EQ(fq.download().data, hq.data);
    Tensor rank3 =
        Tensor::view(ctx, app.buffer, 0, {heads, nq, d}, DType::f32, kTensorUsage, {d, width, 1});
    EXPECT_EQ(rank3.download().data, slice(0, heads).data);  // the same values, rank 3
    AttentionParams causal;
    causal.mods.causal = true;
    reference::Result want = reference::direct(hq, hk, hv, causal);
    AttentionResult got = attention(ctx, fq, fk, fv, causal);
    EXPECT_LE(max_error(got.out.download().data, want.out), tolerance(hq, hk, hv, causal));
    Tensor kv_dense = Tensor::upload(ctx, hk, DType::f32);
    Tensor kv_odd = Tensor::view(ctx, kv_dense.buffer(), 0, {1, kv_heads, nq, d}, DType::f32,
                                 kTensorUsage, {12345 * d, nq * d, d, 1});
    EXPECT_TRUE(kv_odd.is_dense());
    AttentionResult same = attention(ctx, fq, kv_dense, kv_odd, causal);  // laid out alike
    reference::Result want_same = reference::direct(hq, hk, hk, causal);
    EXPECT_LE(max_error(same.out.download().data, want_same.out), tolerance(hq, hk, hk, causal));
  }
  // Head stride 0: every KV head reads head 0's rows.
  Tensor k0 = Tensor::view(ctx, kd.buffer(), 0, shape, DType::f32, kTensorUsage, {0, 0, 16, 1});
  HostTensor k_same(shape);
  for (int64_t j = 0; j < 4; ++j)
    std::copy_n(kh.data.begin(), 8 * 16, k_same.data.begin() + j * 8 * 16);
  EXPECT_EQ(k0.download().data, k_same.data);
  reference::Result ref = reference::direct(qh, k_same, k_same, {});
  AttentionResult r = attention(ctx, qd, k0, k0, {});
  EXPECT_LE(max_error(r.out.download().data, ref.out), tolerance(qh, k_same, k_same, {}));
}

// Tensors of rank 1 and 2 (Q [Nq, d], LSE [Nq]) as uploads and as a recording's outputs.
TEST_F(ViewTest, LowRankTensorsUploadAndTakeOutputs) {
  Context& ctx = context();
  HostTensor x({5}, {1, -2, 3, -4, 5});
  EXPECT_EQ(Tensor::upload(ctx, x, DType::f32).download().data, x.data);
  HostTensor q = random_tensor({3, 16}, 95), k = random_tensor({20, 16}, 96);
  Tensor tq = Tensor::upload(ctx, q, DType::f32), tk = Tensor::upload(ctx, k, DType::f32);
  Tensor out(ctx, {3, 16}, DType::f32), lse(ctx, {3}, DType::f32);
  AttentionParams params;
  AttentionRecording rec(ctx, tq, tk, tk, params, {&out, &lse});
  ExternalDevice h = ctx.handles();
  submit_frame(h.device, h.queue, h.queue_family, [&](VkCommandBuffer cmd) { rec.record(cmd); });
  reference::Result ref = reference::direct(q, k, k, params);
  EXPECT_LE(max_error(out.download().data, ref.out), tolerance(q, k, k, params));
  EXPECT_LE(max_lse_error(lse.download().data, ref.lse), 1e-5);
}

// A decode loop recorded once: K and V are a cache of capacity 64 (prefix views of 1 key at
// first), each step writes a new query, sets the cache's length and submits the same command
// buffer; the output is checked against float64 over the first n keys every time. splitkv's
// automatic layout runs 100 steps with lengths that grow, shrink and jump; the other variants
// and layouts a few each. A length past the capacity, and one other than Nk with a key mask,
// are refused.
TEST_F(ViewTest, ARecordingResubmittedWithChangingLengths) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  const int64_t capacity = 64;
  HostTensor k = random_tensor({1, 2, capacity, 64}, 91),
             v = random_tensor({1, 2, capacity, 32}, 92);
  Tensor tk = Tensor::upload(ctx, k, DType::f32), tv = Tensor::upload(ctx, v, DType::f32);
  Tensor tq(ctx, {1, 4, 1, 64}, DType::f32);
  struct Case {
    Variant variant;
    TileLayout layout;
    int steps;
  };
  std::vector<Case> cases = {{Variant::splitkv, TileLayout::automatic, 100},
                             {Variant::splitkv, TileLayout::shared, 6},
                             {Variant::flash2, TileLayout::automatic, 6},
                             {Variant::flashd, TileLayout::shared, 6},
                             {Variant::naive, TileLayout::automatic, 6}};
  if (info.subgroup_shuffle && info.texel_buffers)
    cases.push_back({Variant::splitkv, TileLayout::registers, 6});
  if (info.subgroup_shuffle) cases.push_back({Variant::splitkv, TileLayout::lanes, 6});
  uint32_t seed = 100;
  for (const Case& c : cases) {
    AttentionParams params;
    params.variant = c.variant;
    params.hints.tile_layout = c.layout;
    params.mods.window_left = 40;  // a sliding window: the first keys drop out as the cache grows
    AttentionRecording rec(ctx, tq, tk.prefix(1), tv.prefix(1), params);
    ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
    for (int step = 0; step < c.steps; ++step) {
      int64_t n = step < 64 ? step + 1 : (step * 37) % capacity + 1;
      if (c.steps < 64) n = std::vector<int64_t>{1, 2, 33, 64, 17, 40}[step];
      HostTensor q = random_tensor({1, 4, 1, 64}, ++seed);
      tq.write(q);
      rec.set_keys(static_cast<uint32_t>(n));
      frame.submit();
      reference::Result ref = reference::direct(q, first_rows(k, n), first_rows(v, n), params);
      double err = max_error(rec.out().download().data, ref.out);
      EXPECT_LE(err, tolerance(q, first_rows(k, n), first_rows(v, n), params))
          << variant_name(c.variant) << " " << tile_layout_name(rec.tile_layout()) << ", step "
          << step << ", " << n << " keys";
      EXPECT_LE(max_lse_error(rec.lse().download().data, ref.lse), 1e-5) << n << " keys";
      if (err > 1e-3) break;  // one message, not a hundred
    }
  }
  AttentionRecording rec(ctx, tq, tk.prefix(8), tv.prefix(8));
  EXPECT_THROW(rec.set_keys(capacity + 1), Error);
  AttentionParams masked;
  masked.mods.key_mask.assign(8, 1);
  AttentionRecording with_mask(ctx, tq, tk.prefix(8), tv.prefix(8), masked);
  with_mask.set_keys(8);
  try {
    with_mask.set_keys(9);
    ADD_FAILURE() << "a masked recording took another length";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("record it again"), std::string::npos) << e.what();
  }
}

TEST(Embedding, AdoptRefusesMissingHandles) {
  EXPECT_THROW(Context::adopt(ExternalDevice{}), Error);
}

// An application whose instance asked for Vulkan 1.0 is told so at adopt(), by name, instead of
// failing at its first buffer ("exceeds maxMemoryAllocationSize (0 bytes)").
TEST(Embedding, AdoptRefusesAVulkan10InstanceByName) {
  AppVulkan app(VK_API_VERSION_1_0);
  try {
    Context ctx = Context::adopt(app.external());
    ADD_FAILURE() << "adopt() took an instance created for Vulkan 1.0";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("apiVersion VK_API_VERSION_1_1"), std::string::npos)
        << e.what();
  }
}

// adopt() takes the application's word for the features it enabled, but refuses a word the
// device cannot back, naming the feature (rather than failing in a kernel later).
TEST(Embedding, AdoptRefusesFeaturesTheDeviceLacksByName) {
  AppVulkan app;
  ExternalDevice handles = app.external();
  DeviceInfo info = Context::adopt(handles).device();
  if (info.matrix_api != MatrixApi::khr) {
    handles.matrix_api = MatrixApi::khr;
    expect_refused([&] { Context::adopt(handles); }, "matrix_api khr, but");
  }
  if (!info.nv_cooperative_matrix) {
    handles = app.external();
    handles.matrix_api = MatrixApi::nv;
    expect_refused([&] { Context::adopt(handles); }, "lacks VK_NV_cooperative_matrix");
  }
  handles = app.external();
  handles.fp16_storage_enabled = false;
  handles.matrix_api = MatrixApi::emulated;
  expect_refused([&] { Context::adopt(handles); }, "matrix_api emulated needs fp16_storage_enabled");
  if (!info.fp16_storage) {
    handles = app.external();
    expect_refused([&] { Context::adopt(handles); }, "storageBuffer16BitAccess");
  }
  handles = app.external();
  handles.queue_family = 1000;
  expect_refused([&] { Context::adopt(handles); }, "queue family 1000");
  handles = app.external();
  handles.fp16_storage_enabled = false;
  Context ctx = Context::adopt(handles);
  HostTensor x = random_tensor({1, 1, 4, 8}, 1);
  expect_refused([&] { Tensor::upload(ctx, x, DType::f16); }, "16");
}

// Issue 46: the kernels that use subgroup operations (register tiles here, on a CPU driver)
// require their subgroup size, so on an application's device they run only where it enabled
// subgroupSizeControl and computeFullSubgroups; without, shared memory does their work (the same
// answer), a call asking for them is refused by name, and no pipeline requires a size.
TEST(Embedding, SubgroupKernelsRunWhereTheAppEnabledSubgroupSizeControl) {
  HostTensor q = random_tensor({1, 2, 40, 16}, 4), k = random_tensor({1, 2, 70, 16}, 5);
  AttentionParams params;
  params.variant = Variant::flash2;
  reference::Result ref = reference::direct(q, k, k, params);
  PipelineCall call{1, 2, 2, 40, 70, 16, 16, params, Storage(DType::f32)};
  {
    AppVulkan app;
    ExternalDevice handles = app.external();
    EXPECT_FALSE(handles.subgroup_size_control_enabled);
    Context ctx = Context::adopt(handles);
    EXPECT_FALSE(ctx.device().subgroup_shuffle);
    EXPECT_LE(max_error(attention(ctx, q, k, k, params).out.data, ref.out),
              tolerance(q, k, k, params));
    for (const PipelineDescription& p : describe_pipelines(ctx, call))
      EXPECT_EQ(p.required_subgroup, 0u) << p.shader;
    AttentionParams registers = params;
    registers.hints.tile_layout = TileLayout::registers;
    expect_refused([&] { attention(ctx, q, k, k, registers); }, "subgroup shuffle");
    if (!ctx.device().subgroup_size_control) {
      handles.subgroup_size_control_enabled = true;
      expect_refused([&] { Context::adopt(handles); }, "subgroup_size_control_enabled is set");
    }
  }
  AppVulkan app(VK_API_VERSION_1_1, true);
  if (!app.size_control) GTEST_SKIP() << "the device has no subgroup size control";
  Context ctx = Context::adopt(app.external());
  DeviceInfo raw = list_devices()[0];
  EXPECT_EQ(ctx.device().subgroup_shuffle, raw.subgroup_shuffle);
  if (!ctx.device().subgroup_shuffle || !ctx.device().texel_buffers) return;
  AttentionParams registers = params;
  registers.hints.tile_layout = TileLayout::registers;
  EXPECT_LE(max_error(attention(ctx, q, k, k, registers).out.data, ref.out),
            tolerance(q, k, k, params));
  call.params = registers;
  std::vector<PipelineDescription> pipes = describe_pipelines(ctx, call);
  ASSERT_FALSE(pipes.empty());
  EXPECT_EQ(pipes.back().layout, TileLayout::registers);
  EXPECT_EQ(pipes.back().required_subgroup, ctx.device().subgroup_size);
}

// ContextOptions::subgroup_size: the device's own size is taken, one outside its range refused
// naming the range.
TEST(Devices, ASubgroupSizeOutsideTheDevicesRangeIsRefused) {
  DeviceInfo info = list_devices()[default_device(list_devices())];
  ContextOptions options = test_options();
  options.subgroup_size = info.subgroup_size;
  if (info.subgroup_size_control) {
    EXPECT_EQ(Context::create(options).device().subgroup_size, info.subgroup_size);
    options.subgroup_size = info.max_subgroup_size * 2;
    std::string range = "allows subgroups of " + std::to_string(info.min_subgroup_size) +
                        " to " + std::to_string(info.max_subgroup_size) + " lanes";
    expect_refused([&] { Context::create(options); }, range.c_str());
    options.subgroup_size = 3;
    expect_refused([&] { Context::create(options); }, "(powers of two)");
    if (info.max_subgroup_size > info.min_subgroup_size) {  // in the range, not a power of two
      options.subgroup_size = info.min_subgroup_size + info.max_subgroup_size / 2 + 1;
      expect_refused([&] { Context::create(options); }, "(powers of two)");
    }
  } else {
    expect_refused([&] { Context::create(options); }, "cannot require a subgroup size");
  }
}

TEST(Devices, ListsAtLeastOneDeviceWithTheGuaranteedLimits) {
  std::vector<DeviceInfo> devices = list_devices();
  ASSERT_FALSE(devices.empty());
  for (const DeviceInfo& d : devices) {
    EXPECT_GE(d.max_shared_memory, 16384u);
    EXPECT_GE(d.max_workgroup_invocations, 128u);
    EXPECT_FALSE(d.name.empty());
  }
  EXPECT_THROW(Context::create({int(devices.size()), false}), Error);
}

}  // namespace
}  // namespace flashvk::test
