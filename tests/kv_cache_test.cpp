// A KV cache that recordings append to: a prompt's chunk and then one token a step, each a
// command buffer recorded once and resubmitted, checked against the float64 reference over every
// token so far (RoPE included: the reference rotates K at positions 0.. and Q at the last ones),
// and the cache's rows against rope() of the same keys.
#include "test_util.hpp"

namespace flashvk::test {
namespace {

class KvCacheTest : public VulkanTest {};

struct CacheCase {
  const char* name;
  Variant variant;
  DType dtype;
  RopeLayout rope;
  TileLayout layout = TileLayout::automatic;
};

// H = 4 query heads on Hkv = 2, d = 32, dv = 16, a cache of 40 tokens: a prompt of 7 appended
// at once (causal), then 9 decode steps of one token, then a second chunk of 5; after each run
// the output and LSE against float64 over all the tokens so far.
TEST_F(KvCacheTest, PromptChunksAndDecodeStepsAppendAndAttendAsTheReferenceDoes) {
  Context& ctx = context();
  const DeviceInfo& info = ctx.device();
  std::vector<CacheCase> cases = {
      {"flash2 f32 rope interleaved", Variant::flash2, DType::f32, RopeLayout::interleaved},
      {"splitkv f32 rope half", Variant::splitkv, DType::f32, RopeLayout::half},
      {"flashd f32", Variant::flashd, DType::f32, RopeLayout::none, TileLayout::shared},
      {"naive f32 rope", Variant::naive, DType::f32, RopeLayout::interleaved},
      {"online f32 shared", Variant::online, DType::f32, RopeLayout::none, TileLayout::shared}};
  if (info.fp16_storage) {
    cases.push_back({"splitkv f16 rope", Variant::splitkv, DType::f16, RopeLayout::interleaved});
    cases.push_back({"flash1 f16", Variant::flash1, DType::f16, RopeLayout::none});
  }
  if (info.subgroup_shuffle)
    cases.push_back(
        {"splitkv lanes", Variant::splitkv, DType::f32, RopeLayout::none, TileLayout::lanes});
  const int64_t capacity = 40, heads = 4, kv_heads = 2, d = 32, dv = 16;
  uint32_t seed = 300;
  for (const CacheCase& c : cases) {
    SCOPED_TRACE(c.name);
    HostTensor keys = stored_values(random_tensor({1, kv_heads, capacity, d}, ++seed), c.dtype);
    HostTensor values = stored_values(random_tensor({1, kv_heads, capacity, dv}, ++seed), c.dtype);
    KvCache cache(ctx,
                  {1, uint32_t(kv_heads), uint32_t(capacity), uint32_t(d), uint32_t(dv), c.dtype});
    AttentionParams params;
    params.variant = c.variant;
    params.hints.tile_layout = c.layout;
    params.rope = c.rope;
    params.mods.causal = true;
    params.mods.window_left = 12;  // the first keys fall out of the window as the cache grows
    // One recording per chunk length: the prompts' (7, then 5) and the decode step's (1).
    struct Chunk {
      int64_t rows;
      Tensor q, k, v;
      std::unique_ptr<AttentionRecording> rec;
      std::unique_ptr<ReusedFrame> frame;
    };
    auto make_chunk = [&](int64_t rows) {
      auto chunk = std::make_unique<Chunk>();
      chunk->rows = rows;
      chunk->q = Tensor(ctx, {1, heads, rows, d}, c.dtype);
      chunk->k = Tensor(ctx, {1, kv_heads, rows, d}, c.dtype);
      chunk->v = Tensor(ctx, {1, kv_heads, rows, dv}, c.dtype);
      chunk->rec =
          std::make_unique<AttentionRecording>(ctx, chunk->q, cache, chunk->k, chunk->v, params);
      AttentionRecording* rec = chunk->rec.get();
      chunk->frame = std::make_unique<ReusedFrame>(
          ctx.handles(), [rec](VkCommandBuffer cmd) { rec->record(cmd); });
      return chunk;
    };
    auto prompt = make_chunk(7), step = make_chunk(1), second = make_chunk(5);
    std::vector<Chunk*> order = {prompt.get()};
    for (int i = 0; i < 9; ++i) order.push_back(step.get());
    order.push_back(second.get());
    int64_t length = 0;
    for (Chunk* chunk : order) {
      HostTensor q = stored_values(random_tensor({1, heads, chunk->rows, d}, ++seed), c.dtype);
      chunk->q.write(q);
      chunk->k.write(rows_of(keys, length, length + chunk->rows));
      chunk->v.write(rows_of(values, length, length + chunk->rows));
      chunk->rec->set_position(static_cast<uint32_t>(length));
      chunk->frame->submit();
      length += chunk->rows;
      HostTensor k = first_rows(keys, length), v = first_rows(values, length);
      reference::Result ref = reference::direct(q, k, v, params);
      double err = max_error(chunk->rec->out().download().data, ref.out);
      // fp16 storage of the rotated Q and K rounds them once more: fp16's roundoff, not fp32's.
      double u = c.dtype == DType::f16 && c.rope != RopeLayout::none ? std::ldexp(1.0, -11)
                                                                     : std::ldexp(1.0, -24);
      double bound =
          2 * tolerance(q, k, v, params, u) + weight_rounding(chunk->rec->tile_layout(), v);
      EXPECT_LE(err, bound) << length << " tokens";
      EXPECT_LE(max_lse_error(chunk->rec->lse().download().data, ref.lse), std::max(1e-4, bound))
          << length << " tokens";
      if (err > 1e-2) break;
    }
    ASSERT_EQ(length, 21);
    // The cache holds what was appended: K rotated at its positions, as rope() rotates it.
    HostTensor k_now = first_rows(cache.keys().download(), length);
    HostTensor v_now = first_rows(cache.values().download(), length);
    HostTensor k_want = first_rows(keys, length);
    if (c.rope != RopeLayout::none)
      k_want = rope(ctx, Tensor::upload(ctx, k_want, c.dtype), {c.rope, 10000.0, 0}).download();
    EXPECT_EQ(k_now.data, k_want.data);
    EXPECT_EQ(v_now.data, first_rows(values, length).data);
    if (c.rope != RopeLayout::none) {
      EXPECT_NE(k_now.data, first_rows(keys, length).data);
    }
  }
}

// A cache over the application's own buffers (KvCache from views), written in place: the
// appended rows land in the app's memory at the view's offset, rows outside stay untouched.
TEST_F(KvCacheTest, ACacheOverTheAppsBuffersIsWrittenInPlace) {
  Context& ctx = context();
  const int64_t capacity = 16, d = 8;
  uint64_t align = std::max<uint64_t>(ctx.device().min_storage_offset_alignment, 4);
  uint64_t k_bytes = uint64_t(capacity) * d * 4;
  uint64_t offset = align, v_offset = (offset + k_bytes + align - 1) / align * align;
  uint64_t total = v_offset + k_bytes + align;
  Tensor app(ctx, {int64_t(total / 4)}, DType::f32);  // stands in for the app's VkBuffer
  HostTensor sentinel({int64_t(total / 4)});
  std::fill(sentinel.data.begin(), sentinel.data.end(), -7.0f);
  app.write(sentinel);
  KvCache cache(Tensor::view(ctx, app.buffer(), offset, {1, 1, capacity, d}, DType::f32),
                Tensor::view(ctx, app.buffer(), v_offset, {1, 1, capacity, d}, DType::f32));
  EXPECT_EQ(cache.capacity(), 16u);
  Tensor q(ctx, {1, 2, 1, d}, DType::f32), k(ctx, {1, 1, 1, d}, DType::f32),
      v(ctx, {1, 1, 1, d}, DType::f32);
  AttentionRecording rec(ctx, q, cache, k, v);
  ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { rec.record(cmd); });
  HostTensor keys = random_tensor({1, 1, 3, d}, 1), values = random_tensor({1, 1, 3, d}, 2);
  for (int64_t n = 0; n < 3; ++n) {
    HostTensor query = random_tensor({1, 2, 1, d}, uint32_t(10 + n));
    q.write(query);
    k.write(rows_of(keys, n, n + 1));
    v.write(rows_of(values, n, n + 1));
    rec.set_position(static_cast<uint32_t>(n));
    frame.submit();
    HostTensor kk = first_rows(keys, n + 1), vv = first_rows(values, n + 1);
    reference::Result ref = reference::direct(query, kk, vv, {});
    EXPECT_LE(max_error(rec.out().download().data, ref.out), tolerance(query, kk, vv, {}));
  }
  HostTensor memory = app.download();
  for (int64_t i = 0; i < int64_t(total / 4); ++i) {
    int64_t k_row = (int64_t(i * 4) - int64_t(offset)) / (d * 4);
    int64_t v_row = (int64_t(i * 4) - int64_t(v_offset)) / (d * 4);
    bool in_k = i * 4 >= int64_t(offset) && k_row < 3,
         in_v = i * 4 >= int64_t(v_offset) && v_row < 3;
    if (in_k)
      EXPECT_EQ(memory.data[size_t(i)], keys.data[size_t(i - int64_t(offset / 4))]) << i;
    else if (in_v)
      EXPECT_EQ(memory.data[size_t(i)], values.data[size_t(i - int64_t(v_offset / 4))]) << i;
    else
      EXPECT_EQ(memory.data[size_t(i)], -7.0f) << "word " << i << " is outside the rows written";
  }
}

TEST_F(KvCacheTest, WhatAnAppendCannotDoIsRefusedByName) {
  Context& ctx = context();
  KvCache cache(ctx, {1, 2, 8, 16, 16, DType::f32});
  Tensor q(ctx, {1, 4, 2, 16}, DType::f32), k(ctx, {1, 2, 2, 16}, DType::f32),
      v(ctx, {1, 2, 2, 16}, DType::f32);
  AttentionRecording rec(ctx, q, cache, k, v);
  rec.set_position(6);  // rows 6 and 7: the last two
  expect_refused([&] { rec.set_position(7); }, "overruns the KV cache's capacity of 8");
  expect_refused([&] { rec.set_keys(4); }, "set_position");
  Tensor k3(ctx, {1, 2, 3, 16}, DType::f32);
  expect_refused([&] { AttentionRecording(ctx, q, cache, k3, v); }, "needs [1, 2, 2, 16]");
  Tensor k16(ctx, {1, 2, 2, 16}, DType::f16);
  if (ctx.device().fp16_storage)
    expect_refused([&] { AttentionRecording(ctx, q, cache, k16, v); }, "the cache stores f32");
  AttentionParams masked;
  masked.mods.key_mask.assign(8, 1);
  expect_refused([&] { AttentionRecording(ctx, q, cache, k, v, masked); }, "key mask");
  AttentionParams placed;
  placed.query_position = 3;
  expect_refused([&] { AttentionRecording(ctx, q, cache, k, v, placed); }, "query_position");
  Tensor whole(ctx, {1, 2, 8, 16}, DType::f32);
  AttentionRecording plain(ctx, q, whole.prefix(4), whole.prefix(4));
  expect_refused([&] { plain.set_position(0); }, "appends to a KV cache");
  expect_refused([&] { KvCache(ctx, {1, 2, 0, 16, 16, DType::f32}); }, "capacity");
  expect_refused([&] { KvCache(ctx, {1, 2, 32, 32, 32, DType::bf16}); }, "f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl");
  KvCache quantised(ctx, {1, 2, 8, 32, 32, DType::q8_0});
  Tensor q32(ctx, {1, 4, 2, 32}, DType::f32), k32(ctx, {1, 2, 2, 32}, DType::f32);
  Tensor k32_q8(ctx, {1, 2, 2, 32}, DType::q8_0);
  expect_refused([&] { AttentionRecording(ctx, q32, quantised, k32_q8, k32); },
                 "as f32 or f16 (they are quantised as they are appended)");
  expect_refused(
      [&] {
        KvCache(whole.prefix(4), Tensor(ctx, {1, 2, 8, 16}, DType::f32));
      },
      "dense");
  expect_refused(
      [&] {
        KvCache(Tensor(ctx, {1, 2, 8, 16}, DType::f32), Tensor(ctx, {1, 3, 8, 16}, DType::f32));
      },
      "differ");
  // A refusal leaves nothing behind, even one that comes after the recording made its pools and
  // buffers (each is tried once first: the pipelines the context keeps are made then).
  KvCache small(ctx, {1, 2, 4, 16, 16, DType::f32});
  Tensor q8(ctx, {1, 4, 8, 16}, DType::f32), k8(ctx, {1, 2, 8, 16}, DType::f32),
      v8(ctx, {1, 2, 8, 16}, DType::f32);
  AttentionParams bad_base;
  bad_base.rope = RopeLayout::interleaved;
  bad_base.rope_base = 0.5;
  auto refusals = [&] {
    expect_refused([&] { AttentionRecording(ctx, q8, small, k8, v8); }, "KV cache of 4 tokens");
    expect_refused([&] { AttentionRecording(ctx, q, cache, k, v, bad_base); }, "rope base");
  };
  refusals();
  EngineStats before = engine_stats();
  refusals();
  EXPECT_EQ(engine_stats().objects_live, before.objects_live);
  EXPECT_EQ(engine_stats().device_bytes, before.device_bytes);
}

// The decode loop as an app runs it: after the first step, setting the position and submitting
// the recorded command buffer creates no Vulkan object and allocates no device memory (counted
// by every create and destroy site of the engine: engine_stats()), for every variant.
TEST_F(KvCacheTest, DecodeStepsCreateNoVulkanObjects) {
  Context& ctx = context();
  for (Variant variant : all_variants()) {
    SCOPED_TRACE(variant_name(variant));
    KvCache cache(ctx, {1, 2, 64, 32, 32, DType::f32});
    Tensor q(ctx, {1, 4, 1, 32}, DType::f32), k(ctx, {1, 2, 1, 32}, DType::f32),
        v(ctx, {1, 2, 1, 32}, DType::f32);
    q.write(random_tensor({1, 4, 1, 32}, 1));
    k.write(random_tensor({1, 2, 1, 32}, 2));
    v.write(random_tensor({1, 2, 1, 32}, 3));
    AttentionParams params;
    params.variant = variant;
    params.rope = RopeLayout::interleaved;
    AttentionRecording step(ctx, q, cache, k, v, params);
    ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) { step.record(cmd); });
    step.set_position(0);
    frame.submit();  // the first step: drivers may set things up
    EngineStats before = engine_stats();
    for (uint32_t position = 1; position < 64; ++position) {
      step.set_position(position);
      frame.submit();
    }
    EngineStats after = engine_stats();
    EXPECT_EQ(after.objects_created, before.objects_created);
    EXPECT_EQ(after.objects_live, before.objects_live);
    EXPECT_EQ(after.device_bytes, before.device_bytes);
    EXPECT_GT(before.objects_live, 0u);
  }
}

// Caches, recordings (appending and not) and contexts made and dropped over and over leave no
// Vulkan object and no device memory behind, checked after each one rather than in sum; and the
// counters see them while they live. 200 caches and 20 contexts: a leak shows at the first, and
// on a GPU each context is an instance and a device (a thousand took 99 s on an H200).
TEST_F(KvCacheTest, CachesRecordingsAndContextsLeaveNothingBehind) {
  Context& ctx = context();
  auto make_and_drop = [&](int i, EngineStats* live) {
    KvCache cache(ctx, {1, 2, 16, 8, 8, DType::f32});
    Tensor q(ctx, {1, 2, 1, 8}, DType::f32), k(ctx, {1, 2, 1, 8}, DType::f32),
        v(ctx, {1, 2, 1, 8}, DType::f32);
    AttentionParams params;
    params.variant = i % 2 ? Variant::splitkv : Variant::flash2;
    AttentionRecording step(ctx, q, cache, k, v, params);
    AttentionRecording over(ctx, q, cache.keys(4), cache.values(4), params);
    if (live) *live = engine_stats();
  };
  make_and_drop(0, nullptr), make_and_drop(1, nullptr);  // the context keeps their pipelines
  EngineStats start = engine_stats(), live;
  make_and_drop(0, &live);
  EXPECT_GT(live.objects_live, start.objects_live);
  EXPECT_GE(live.device_bytes, start.device_bytes + 2 * 2 * 16 * 8 * 4);  // the cache at least
  const int caches = 200, contexts = 20;
  for (int i = 0; i < caches; ++i) {
    make_and_drop(i, nullptr);
    EngineStats now = engine_stats();
    ASSERT_EQ(now.objects_live, start.objects_live) << "after cache " << i;
    ASSERT_EQ(now.device_bytes, start.device_bytes) << "after cache " << i;
  }
  EngineStats end = engine_stats();
  EXPECT_GT(end.objects_created, start.objects_created + caches * 10);
  for (int i = 0; i < contexts; ++i) {
    {
      Context other = Context::create(test_options());
      EXPECT_GT(engine_stats().objects_live, end.objects_live);
      EXPECT_TRUE(other.take_validation_messages().empty());
    }
    ASSERT_EQ(engine_stats().objects_live, end.objects_live) << "after context " << i;
    ASSERT_EQ(engine_stats().device_bytes, end.device_bytes) << "after context " << i;
  }
}

// A whole decode step in one command buffer of the app's, recorded once: Q, K and V copied in
// from the engine's staging, appended and attended, O copied out to the staging. Each step the
// host writes the staging, sets the position, submits and reads O back from the staging, which
// matches float64; no Vulkan object is made after the first step.
TEST_F(KvCacheTest, UploadsAndDownloadsRecordedIntoTheStep) {
  Context& ctx = context();
  DType dtype = ctx.device().fp16_storage ? DType::f16 : DType::f32;
  const int64_t heads = 4, kv_heads = 2, d = 32, capacity = 12;
  KvCache cache(ctx, {1, uint32_t(kv_heads), uint32_t(capacity), uint32_t(d), uint32_t(d), dtype});
  Tensor q(ctx, {1, heads, 1, d}, dtype), k(ctx, {1, kv_heads, 1, d}, dtype),
      v(ctx, {1, kv_heads, 1, d}, dtype);
  AttentionParams params;
  params.variant = Variant::splitkv;
  params.mods.causal = true;
  AttentionRecording step(ctx, q, cache, k, v, params);
  const uint64_t at_k = q.bytes(), at_v = at_k + k.bytes(), at_o = at_v + v.bytes();
  Staging staging(ctx, at_o + step.out().bytes());
  ReusedFrame frame(ctx.handles(), [&](VkCommandBuffer cmd) {
    staging.record_upload(cmd, q, 0);
    staging.record_upload(cmd, k, at_k);
    staging.record_upload(cmd, v, at_v);
    step.record(cmd);
    staging.record_download(cmd, step.out(), at_o);
  });
  HostTensor keys = stored_values(random_tensor({1, kv_heads, capacity, d}, 50), dtype);
  HostTensor values = stored_values(random_tensor({1, kv_heads, capacity, d}, 51), dtype);
  EngineStats first{};
  for (int64_t n = 0; n < capacity; ++n) {
    HostTensor query = stored_values(random_tensor({1, heads, 1, d}, uint32_t(60 + n)), dtype);
    EXPECT_EQ(staging.write(query, dtype, 0), q.bytes());
    staging.write(rows_of(keys, n, n + 1), dtype, at_k);
    staging.write(rows_of(values, n, n + 1), dtype, at_v);
    step.set_position(static_cast<uint32_t>(n));
    frame.submit();
    if (n == 0) first = engine_stats();
    HostTensor out = staging.read({1, heads, 1, d}, DType::f32, at_o);
    HostTensor kk = first_rows(keys, n + 1), vv = first_rows(values, n + 1);
    reference::Result ref = reference::direct(query, kk, vv, params);
    EXPECT_LE(max_error(out.data, ref.out), tolerance(query, kk, vv, params)) << n + 1 << " tokens";
  }
  EXPECT_EQ(engine_stats().objects_created, first.objects_created);
  expect_refused(
      [&] {
        staging.write(random_tensor({1, 1000}, 1), DType::f32, 0);
      },
      "pass the end of the staging");
  expect_refused([&] { staging.read({1, 1000}, DType::f32, 8); }, "pass the end of the staging");
  ReusedFrame refusals(ctx.handles(), [&](VkCommandBuffer cmd) {
    expect_refused([&] { staging.record_upload(cmd, cache.keys(4), 0); }, "prefix()");
    expect_refused([&] { staging.record_download(cmd, cache.keys(), 0); }, "pass the end");
  });
}

// A cache in a block format (q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl) quantises the rows appended to it on the device, after RoPE: what it holds
// is what the host's encoder (ggml's reference quantisation) makes of the rotated rows, to within
// one quant step where the GPU's float rounding lands on the other side of a half; and attention
// over it matches float64 over the values it holds.
TEST_F(KvCacheTest, AQuantisedCacheQuantisesRowsAsTheyAreAppended) {
  Context& ctx = context();
  struct Case {
    DType cache, rows;
    RopeLayout rope;
    Variant variant;
  };
  std::vector<Case> cases = {{DType::q8_0, DType::f32, RopeLayout::half, Variant::flash2},
                             {DType::q4_0, DType::f32, RopeLayout::interleaved, Variant::splitkv},
                             {DType::q8_0, DType::f32, RopeLayout::none, Variant::splitkv},
                             {DType::q4_1, DType::f32, RopeLayout::half, Variant::flash2},
                             {DType::q5_0, DType::f32, RopeLayout::none, Variant::splitkv},
                             {DType::q5_1, DType::f32, RopeLayout::interleaved, Variant::flash2},
                             {DType::iq4_nl, DType::f32, RopeLayout::half, Variant::splitkv}};
  if (ctx.device().fp16_storage)
    cases.push_back({DType::q4_0, DType::f16, RopeLayout::half, Variant::flashd});
  const int64_t heads = 4, kv_heads = 2, d = 64, dv = 32, capacity = 20;
  uint32_t seed = 700;
  for (const Case& c : cases) {
    std::string name = std::string(dtype_name(c.cache)) + " from " + dtype_name(c.rows) + ", " +
                       rope_name(c.rope) + ", " + variant_name(c.variant);
    SCOPED_TRACE(name);
    HostTensor keys = stored_values(random_tensor({1, kv_heads, capacity, d}, ++seed), c.rows);
    HostTensor values = stored_values(random_tensor({1, kv_heads, capacity, dv}, ++seed), c.rows);
    KvCache cache(ctx,
                  {1, uint32_t(kv_heads), uint32_t(capacity), uint32_t(d), uint32_t(dv), c.cache});
    AttentionParams params;
    params.variant = c.variant;
    params.rope = c.rope;
    params.mods.causal = true;
    int64_t length = 0;
    for (int64_t n : {5, 1, 1, 1, 3}) {
      Tensor q(ctx, {1, heads, n, d}, c.rows), k(ctx, {1, kv_heads, n, d}, c.rows),
          v(ctx, {1, kv_heads, n, dv}, c.rows);
      HostTensor query = stored_values(random_tensor({1, heads, n, d}, ++seed), c.rows);
      q.write(query);
      k.write(rows_of(keys, length, length + n));
      v.write(rows_of(values, length, length + n));
      AttentionRecording step(ctx, q, cache, k, v, params);
      step.set_position(static_cast<uint32_t>(length));
      ReusedFrame(ctx.handles(), [&](VkCommandBuffer cmd) { step.record(cmd); }).submit();
      length += n;
      // What the cache holds against the host's quantisation of the same rotated rows.
      HostTensor held_k = first_rows(cache.keys().download(), length);
      HostTensor held_v = first_rows(cache.values().download(), length);
      HostTensor rotated = first_rows(keys, length);
      if (c.rope != RopeLayout::none)
        rotated =
            rope(ctx, Tensor::upload(ctx, rotated, DType::f32), {c.rope, 10000.0, 0}).download();
      for (auto [held, want] :
           {std::pair{&held_k, stored_values(rotated, c.cache)},
            std::pair{&held_v, stored_values(first_rows(values, length), c.cache)}}) {
        int64_t differ = 0;
        for (size_t i = 0; i < want.data.size(); ++i) {
          if (held->data[i] == want.data[i]) continue;
          ++differ;
          // One quant step of the block, from its largest magnitude or its range.
          float amax = 0, lo = want.data[i / 32 * 32], hi = lo;
          for (size_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
            amax = std::max(amax, std::abs(want.data[j])), lo = std::min(lo, want.data[j]),
            hi = std::max(hi, want.data[j]);
          float quant = c.cache == DType::q8_0   ? amax / 127
                       : c.cache == DType::q4_0 ? amax / 8
                       : c.cache == DType::q5_0 ? amax / 16
                       : c.cache == DType::q4_1 ? (hi - lo) / 15
                       : c.cache == DType::q5_1 ? (hi - lo) / 31
                                                : amax * 24 / 127;  // iq4_nl's widest gap
          EXPECT_LE(std::abs(held->data[i] - want.data[i]), 1.01f * quant + 1e-3f * amax)
              << "value " << i;
        }
        EXPECT_LE(differ, int64_t(want.data.size() / 50)) << length << " tokens";
      }
      // Attention over what the cache holds: Q rotated at its positions, K and V as held.
      HostTensor q_rot = query;
      if (c.rope != RopeLayout::none)
        q_rot =
            rope(ctx, Tensor::upload(ctx, query, c.rows), {c.rope, 10000.0, length - n}).download();
      AttentionParams plain = params;
      plain.rope = RopeLayout::none;
      reference::Result ref = reference::direct(q_rot, held_k, held_v, plain);
      EXPECT_LE(max_error(step.out().download().data, ref.out),
                2 * tolerance(q_rot, held_k, held_v, plain) +
                    weight_rounding(step.tile_layout(), held_v) +
                    decode_rounding(step.tile_layout(), q_rot, held_k, held_v, plain).out)
          << length << " tokens";
    }
  }
}

}  // namespace
}  // namespace flashvk::test
