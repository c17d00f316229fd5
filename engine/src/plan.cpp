#include "plan.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "flashvk/context.hpp"
#include "kernels.hpp"
#include "tiling.hpp"

namespace flashvk::detail {

// The small tables the kernels read from one buffer of 32-bit words (common.glsl's table_words):
// the modifiers' (the key mask from word 0, the additive mask: modifiers.cpp), then a paged
// cache's page table.
void Plan::set_tables() {
  std::vector<uint32_t> words;
  encode_modifiers(*this, words);
  if (const PageTable* pages = options.pages) {  // common.glsl seq_pages, paged_row
    push.page_table = static_cast<uint32_t>(words.size());
    words.insert(words.end(), pages->indptr.begin(), pages->indptr.end());
    words.insert(words.end(), pages->last_page_len.begin(), pages->last_page_len.end());
    words.insert(words.end(), pages->indices.begin(), pages->indices.end());
    words.push_back(0);  // a sequence without pages looks its keys up here (never weighed)
  }
  if (words.empty()) return;
  tables = scratch(words.size() * 4);
  tables.write(words.data(), words.size() * 4);
  bindings[kTables] = tables.handle();
}

Spec call_spec(const TilingRequest& request, uint32_t page_size) {
  Spec spec = choose_tiling(request);
  spec.page_size = page_size;
  spec_modifiers(request.params.mods, spec);
  if (!variant_info(request.params.variant).fused) spec.mods &= ~kModTiles;  // the fused' alone
  return spec;
}

Range binding(const Tensor& t) {
  if (!t.is_view()) return Range(t.buffer());
  if (t.bytes() == 0) return Range(t.context()->impl().dummy.handle());  // nothing to read
  return Range(t.buffer(), t.offset(), t.bytes());
}

namespace {

// Whether a texel view of `t` can be made: its buffer's usage and its offset's alignment.
bool texel_viewable(const Tensor& t) {
  uint64_t align = t.context()->device().min_texel_offset_alignment;
  return (t.usage() & VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT) &&
         (align <= 1 || t.offset() % align == 0);
}

}  // namespace

namespace {

// Whether two values of a tensor of `shape` laid out by `strides` share an element: its
// dimensions of more than one value, from the smallest stride up, must each step past all the
// values of those before.
bool overlaps(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size)
  for (size_t i = 0; i < shape.size(); ++i)
    if (shape[i] > 1) dims.emplace_back(strides[i], shape[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 1;  // values the dimensions so far reach, from the first
  for (auto [stride, size] : dims) {
    if (stride < span) return true;
    span = stride * (size - 1) + span;
  }
  return false;
}

}  // namespace

// Tensor t's strides in rows of its last dimension for batch, head and row ([.., N, d]; the
// dimensions it lacks step 0, and so do a batch and heads of one), as the kernels take them
// (push_fields.glsl).
RowStrides row_strides(const Tensor& t, const char* name) {
  const std::vector<int64_t>& shape = t.shape();
  const std::vector<int64_t>& st = t.strides();
  size_t n = shape.size();
  int64_t row = n ? shape.back() : 1;
  auto rows = [&](size_t back) -> uint32_t {
    if (n < back + 1 || row == 0) return 0;
    // A batch or head dimension of one value is only ever indexed at 0: its stride is not used.
    // Not so the rows: a recording over a prefix() of a cache attends over more keys than the
    // prefix's shape has once set_keys() says so.
    if (back > 1 && shape[n - 1 - back] <= 1) return 0;
    int64_t r = st[n - 1 - back] / row;
    if (r > 0xffffffffll)
      throw Error(std::string(name) + ": a stride of " + std::to_string(r) +
                  " rows does not fit the kernels' 32-bit row indices");
    return static_cast<uint32_t>(r);
  };
  return {rows(3), rows(2), rows(1)};
}

std::string RowStrides::text() const {
  // Appended, not "{" + ...: GCC 12's -O3 flags the latter with a false -Wrestrict (its bug
  // 105329), which an application's Release build would show.
  std::string s = "{";
  s += std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(r) + "}";
  return s;
}

// The constructors delegate to Plan(Context&), which creates the pools: once it has returned,
// a throw from their bodies runs ~Plan, which frees whatever was made so far.
Plan::Plan(Context& context, const Tensor& q, const Tensor& k, const Tensor& v,
           const AttentionParams& p, const PlanOptions& opts)
    : Plan(context) {
  params = p;
  options = opts;
  check_inputs(q, k, v);    // storage, shapes, strides, what RoPE and appends can take
  choose_kernels(k, v);     // the layout, tiles and builds (spec)
  set_push_constants();     // the key lengths and the push constants
  bind_inputs(q, k, v);     // Q, K and V (or their rotated copies) and the small tables
  bind_outputs(q, k, v);    // O, LSE, the trace, register tiles' texel views
  record_dispatches();      // the kernels, in order
}

bool Plan::rotates_k() const {  // a rotated copy of all of K, which the kernels read
  return params.rope != RopeLayout::none && !appends;
}

void Plan::check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (q.empty() || k.empty() || v.empty()) throw Error("attention: q, k and v must be set");
  if (q.context() != &ctx || k.context() != &ctx || v.context() != &ctx)
    throw Error("attention: q, k and v must live on the context they are used with");
  dtype = q.dtype();
  if (!std::ranges::count(dtypes(DTypeUse::query), dtype))
    throw Error("attention: Q is stored as " + dtype_list(DTypeUse::query) + " (got " +
                dtype_name(dtype) + "); the other formats are for K and V");
  kv = Storage{dtype, k.dtype(), v.dtype()};
  if (options.pages) {
    if (!k.is_dense() || !v.is_dense())
      throw Error(
          "paged attention: K and V are whole dense tensors of pages, not prefix() or "
          "strided views");
    dims = check_paged_shapes(q.shape(), k.shape(), v.shape(), *options.pages);
    check_paged();
    kv_strides = {dims.kv_heads, 1, 1};
  } else {
    dims = check_shapes(q.shape(), k.shape(), v.shape());
    if (k.row_capacity() != v.row_capacity())
      throw Error("attention: K and V are prefixes of caches of " +
                  std::to_string(k.row_capacity()) + " and " + std::to_string(v.row_capacity()) +
                  " keys a head; they must be alike");
    dims.kv_rows = static_cast<uint32_t>(k.row_capacity());
    // The rows K's and V's memory holds (the block formats keep their scales after them), and where
    // each key sits in it, alike for K and V.
    RowStrides ks = row_strides(k, "K"), vs = row_strides(v, "V");
    int64_t k_rows = dims.d ? k.span() / dims.d : 0, v_rows = dims.dv ? v.span() / dims.dv : 0;
    if (ks.b != vs.b || ks.h != vs.h || ks.r != vs.r || k_rows != v_rows)
      throw Error(
          "attention: K and V must be laid out alike: their strides of batch, head and key, "
          "counted in rows of d for K and of dv for V, are K " +
          ks.text() + " and V " + vs.text() + ", and their memory holds " + std::to_string(k_rows) +
          " and " + std::to_string(v_rows) + " such rows");
    kv_strides = ks;
    dims.kv_keys = static_cast<uint64_t>(k_rows);
  }
  appends = options.append.k != nullptr;
  if (appends) check_append(q, k, v);
  if (rotates_k() && !k.is_dense())
    throw Error(
        "attention: rope rotates a dense K; rotate K before it goes into the cache "
        "(or a strided view)");
  if (params.rope != RopeLayout::none && !q.is_dense())
    throw Error("attention: rope rotates a dense Q, not a strided view");
  most_keys = options.dynamic_keys || appends ? dims.kv_rows : dims.nk;
  uint64_t keys = dims.kv_keys;
  if (keys > 0xffffffffull || (kv.own_kv() && keys * std::max(dims.d, dims.dv) > 0xffffffffull))
    throw Error("K and V stored as " + std::string(dtype_name(kv.k)) + "/" + dtype_name(kv.v) +
                " are indexed by 32-bit value counts: " + std::to_string(keys) +
                " keys of d = " + std::to_string(std::max(dims.d, dims.dv)) +
                " are more than 2^32 values; split the batch");
  if (rotates_k() && kv.k != dtype)
    throw Error(std::string("attention: rope rotates K stored as Q is (") + dtype_name(dtype) +
                "); rotate K before storing it as " + dtype_name(kv.k) +
                " (the CLI: --rope needs --kv-dtype equal to --dtype)");
}

void Plan::choose_kernels(const Tensor& k, const Tensor& v) {
  // With RoPE the kernels read the rotated copy of K, which is the plan's own.
  bool kv_views = (rotates_k() || texel_viewable(k)) && texel_viewable(v);
  spec = call_spec({.info = impl.info,
                    .matrix_api = impl.matrix_api,
                    .fp16_arithmetic_enabled = impl.fp16_arithmetic_enabled,
                    .dims = dims,
                    .params = params,
                    .dtype = dtype,
                    .kv = kv,
                    .kv_views = kv_views,
                    .forced_keys = options.keys,
                    .trace = options.trace},
                   options.pages ? options.pages->page_size : 0);
  if (params.scale && !std::isfinite(*params.scale))
    throw Error("attention: scale must be a finite number");
}

void Plan::set_push_constants() {
  lengths = Buffer(impl, 16, true);
  if (appends)
    set_position(0);
  else
    set_keys(dims.nk);

  push = Push{.batch = dims.batch,
              .heads = dims.heads,
              .kv_heads = dims.kv_heads,
              .nq = dims.nq,
              .nk = dims.nk,
              .scale = params.scale.value_or(1.0f / std::sqrt(static_cast<float>(dims.d))),
              .flags = 0,
              .splits = 1,
              .keys_per_split = 0,
              .trace_bh = options.trace_bh,
              .trace_row = options.trace_row,
              .bh0 = 0,
              .window_left = -1,
              .window_right = -1,
              .softcap = 0.0f,
              .mask_ranges = 0,
              .mask_values = 0,
              .mask_bstride = 0,
              .mask_hstride = 0,
              .mask_tiles = 0,
              .kv_bstride = kv_strides.b,
              .kv_hstride = kv_strides.h,
              .kv_rstride = kv_strides.r,
              .q_bstride = 0,
              .q_hstride = 0,
              .q_rstride = 0,
              .o_bstride = 0,
              .o_hstride = 0,
              .o_rstride = 0,
              .kv_keys = static_cast<uint32_t>(dims.kv_keys),
              .page_table = 0};
  if (params.want_lse) push.flags |= kFlagLse;
  if (options.trace) push.flags |= kFlagTrace;
}

void Plan::bind_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  bindings.fill(impl.dummy.handle());
  bindings[kQ] = binding(q);
  bindings[kK] = binding(k);
  bindings[kV] = binding(v);
  if (appends) {
    plan_append(q, k, v);
  } else if (rotates_k()) {
    int64_t first = params.query_position.value_or(int64_t(dims.nk) - int64_t(dims.nq));
    plan_rope(*this, q, q_rot, first);
    plan_rope(*this, k, k_rot, 0);
    add_barrier();
    bindings[kQ] = binding(q_rot);
    bindings[kK] = binding(k_rot);
  }
  set_tables();
  if (appends)  // again, with the tile bitmap's span (lengths.tile_keys) that set_tables chose
    set_position(0);
  else
    set_keys(dims.nk);
}

void Plan::bind_outputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (options.outputs.lse && !params.want_lse)
    throw Error("attention: an LSE output was given with want_lse false");
  out_ = output(options.outputs.out, dims.out_shape, "O");
  bindings[kO] = binding(out_);
  RowStrides qs = row_strides(q_rot.empty() ? q : q_rot, "Q"), os = row_strides(out_, "O");
  push.q_bstride = qs.b, push.q_hstride = qs.h, push.q_rstride = qs.r;
  push.o_bstride = os.b, push.o_hstride = os.h, push.o_rstride = os.r;
  if (params.want_lse) {
    lse_ = output(options.outputs.lse, dims.lse_shape, "LSE");
    bindings[kLse] = binding(lse_);
  }
  if (options.trace) {
    uint32_t records =
        variant_info(params.variant).fused ? (dims.nk + spec.bc - 1) / spec.bc : dims.nk;
    trace = Buffer(impl, uint64_t(std::max(records, 1u)) * (6 + dims.dv) * 4);
    trace.fill(0x7fc00000u);  // NaN marks what a kernel did not record
    bindings[kTrace] = trace.handle();
  }
  check_binding(q_rot.empty() ? q : q_rot, "Q");
  check_binding(out_, "O");
  if (spec.layout == TileLayout::registers) {
    make_texel_views();
    // The kernels read K and V through the views only; the storage slots get the placeholder,
    // so K and V may exceed maxStorageBufferRange.
    bindings[kK] = bindings[kV] = impl.dummy.handle();
  } else {
    check_binding(k_rot.empty() ? k : k_rot, "K");
    check_binding(v, "V");
  }
}

void Plan::record_dispatches() {
  // mask_mod's tile bitmap holds for one Nk: where the keys change from run to run (a
  // recording's set_keys, set_position), every run starts with the tile pass.
  const bool keys_change = options.dynamic_keys || appends;
  if (flex_tiles && keys_change) plan_flex_tiles(*this, true);
  const VariantInfo& info = variant_info(params.variant);
  if (!info.fused)
    plan_naive(*this);
  else if (info.splits_keys)
    plan_splitkv(*this);
  else
    plan_fused(*this);
  // Otherwise once, now: after the kernels are built, so that a function one of them refuses
  // stops the call before anything runs.
  if (flex_tiles && !keys_change) plan_flex_tiles(*this, false);
}

Tensor Plan::output(const Tensor* given, const std::vector<int64_t>& shape, const char* name) {
  if (!given) {
    Tensor t(ctx, shape, DType::f32);
    device_bytes += t.bytes();
    return t;
  }
  const Tensor& t = *given;
  if (t.empty() || t.context() != &ctx)
    throw Error(std::string("attention: the ") + name + " output must be a tensor on this context");
  if (t.dtype() != DType::f32 || t.shape() != shape)
    throw Error(std::string("attention: the ") + name + " output is " + dtype_name(t.dtype()) +
                " " + shape_string(t.shape()) + "; attention writes f32 " + shape_string(shape));
  bool is_o = name == std::string("O");
  if (!is_o && !t.is_dense())
    throw Error("attention: the LSE output must be dense, not a prefix() or strided view");
  if (is_o && overlaps(t.shape(), t.strides()))
    throw Error("attention: the O output's strides " + shape_string(t.strides()) +
                " put two of its values in one place; give each its own");
  return Tensor::view(ctx, t.buffer(), t.offset(), shape, DType::f32, t.usage(), t.strides());
}

Plan::Plan(Context& context, const Tensor& x, const RopeParams& rope) : Plan(context) {
  if (x.empty() || x.context() != &ctx) throw Error("rope: x must be a tensor on this context");
  if (x.shape().size() < 2) throw Error("rope: x must have rank 2 or more ([.., N, d])");
  if (!x.is_dense()) throw Error("rope: x must be dense, not a prefix() or strided view");
  if (rope.layout == RopeLayout::none) throw Error("rope: layout must be interleaved or half");
  params.rope = rope.layout;
  params.rope_base = rope.base;
  dtype = x.dtype();
  if (dtype != DType::f32 && dtype != DType::f16)
    throw Error(std::string("rope rotates f32 or f16 tensors; x is ") + dtype_name(dtype) +
                " (rotate before quantising)");
  plan_rope(*this, x, out_, rope.position_offset);
}

Plan::Plan(Context& context) : ctx(context), impl(context.impl()), dispatches_(impl) {}

Range Plan::flex_range() const {
  return flex_table.handle() ? Range(flex_table.handle(), 0, flex_table.bytes()) : Range();
}

void Plan::check_user_functions() {
  const Modifiers& m = params.mods;
  if (!m.user_functions()) return;
  // The word after the table, and only it; cleared once said, so that a recording that goes on
  // says it again only for a run that misses again.
  const uint64_t at = flex_table.bytes() - 4;
  float missed = 0.0f;
  flex_table.read(&missed, 4, at);
  if (missed == 0.0f) return;
  const float cleared = 0.0f;
  flex_table.write(&cleared, 4, at);
  std::string who = !m.score_mod.empty() && !m.mask_mod.empty() ? "score_mod or mask_mod"
                    : !m.score_mod.empty()                      ? "score_mod"
                                                                : "mask_mod";
  throw Error(who + " read flex_table past its " + std::to_string(m.flex_table.data.size()) +
              " values (or before its first); give a table that covers every index the "
              "functions read");
}

VkDescriptorSet Plan::make_set(const Bindings& buffers) {
  return dispatches_.make_set(buffers, lengths.handle(), texel_views, flex_range());
}

void Plan::add(VkPipeline pipeline, VkDescriptorSet set, std::array<uint32_t, 3> groups,
               const void* push_data, uint32_t push_bytes) {
  if (!push_data) {
    push_data = &push;
    push_bytes = sizeof(Push);
  }
  dispatches_.add(pipeline, set, groups, push_data, push_bytes);
}

void Plan::add_barrier() {
  dispatches_.add_barrier();
}

void Plan::add_fill(const Buffer& buffer, uint32_t word) {
  dispatches_.add_fill(buffer.handle(), word);
}

uint64_t Plan::loop_iterations(uint64_t keys) const {
  uint64_t tiles = (keys + spec.bc - 1) / spec.bc;
  bool whole_tiles = layout_row(spec.layout).whole_tiles;
  uint64_t chunks = whole_tiles ? 0 : spec.bc;  // shared tiles: a key a chunk
  uint64_t passes = variant_info(params.variant).passes;
  uint64_t iterations = passes * tiles * (1 + chunks) + 64;  // tile and chunk loops, set-up
  // With the tile bitmap, next_seen_tile's loop: once a tile walked, once a word of 32 skipped
  // (lanes test each tile's bit instead).
  if (push.mask_tiles && !layout_row(spec.layout).tests_each_tile)
    iterations += passes * (tiles + tiles / 32 + 2);
  return iterations;
}

void Plan::check_loop_budget(uint64_t keys) const {
  if (!impl.loop_limited || loop_iterations(keys) <= kLoopBudget) return;
  throw Error(std::string(variant_name(params.variant)) + " over " + std::to_string(keys) +
              " keys with tiles of " + std::to_string(spec.bc) + " needs about " +
              std::to_string(loop_iterations(keys)) + " loop iterations per invocation, but " +
              ctx.device().name +
              " (llvmpipe) stops every shader loop after 65535; use splitkv, "
              "which splits the keys to fit, or fewer keys");
}

// K and V as RGBA texels, and the additive mask's values as RGBA32F texels (a view of the dummy
// buffer without one): llvmpipe gathers texels per lane without the loop a storage buffer costs.
// K and V in storage formats of their own (Storage::own_kv) as 32-bit words (word_texel_format),
// decoded by the kernels.
void Plan::make_texel_views() {
  VkFormat format =
      dtype == DType::f16 ? VK_FORMAT_R16G16B16A16_SFLOAT : VK_FORMAT_R32G32B32A32_SFLOAT;
  VkFormat k_format = format, v_format = format;
  if (kv.own_kv()) k_format = word_texel_format(kv.k), v_format = word_texel_format(kv.v);
  auto keys = static_cast<int64_t>(dims.kv_keys);
  struct View {
    VkBuffer buffer;
    VkFormat format;
    uint64_t offset, bytes;
  };
  View views[kTexelBindings] = {
      {bindings[kK].buffer, k_format, bindings[kK].offset, buffer_bytes(kv.k, keys * dims.d)},
      {bindings[kV].buffer, v_format, bindings[kV].offset, buffer_bytes(kv.v, keys * dims.dv)},
      {impl.dummy.handle(), VK_FORMAT_R32G32B32A32_SFLOAT, 0, 16}};
  if (spec.mods & kModMask)  // four keys a texel, from the values' first word (256-byte aligned)
    views[2] = {tables.handle(), VK_FORMAT_R32G32B32A32_SFLOAT, uint64_t(push.mask_values) * 4,
                tables.bytes() - uint64_t(push.mask_values) * 4};
  for (uint32_t i = 0; i < kTexelBindings; ++i) {
    VkBufferViewCreateInfo info{VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO};
    info.buffer = views[i].buffer;
    info.format = views[i].format;
    info.offset = views[i].offset;
    info.range = views[i].bytes;
    check(vkCreateBufferView(impl.device, &info, nullptr, &texel_views[i]), "vkCreateBufferView");
    objects_created();
  }
}

Plan::~Plan() {
  uint64_t destroyed = 0;
  for (VkBufferView view : texel_views) {
    if (!view) continue;
    vkDestroyBufferView(impl.device, view, nullptr);
    ++destroyed;
  }
  objects_destroyed(destroyed);
}

std::vector<VkPipeline> Plan::pipelines() const {
  std::vector<VkPipeline> made;
  for (const PipelineChoice& p :
       attention_pipelines(params.variant, spec, dtype, impl.info, options.trace))
    made.push_back(pipeline(p));
  return made;
}

VkPipeline Plan::pipeline(const PipelineChoice& choice) const {
  const KernelKey& key = choice.key;
  if (key.trace && !options.trace_builds)
    throw Error("internal: a trace plan without the trace builds (flashvk_trace)");
  if (params.mods.user_functions())
    return impl.user_pipeline(kernel_name(key), params.mods, choice.spec);
  return impl.pipeline(
      find_build(key.trace ? *options.trace_builds : shader_blobs(), kernel_name(key)),
      choice.spec);
}

uint32_t Plan::block_rows() const {
  return variant_info(params.variant).fused ? spec.block() : 0;
}

uint32_t Plan::group_rows() const {
  return spec.layout == TileLayout::cooperative_matrix ? spec.cm_m * spec.cm_row_matrices : 0;
}

uint32_t Plan::block_keys() const {
  return variant_info(params.variant).fused ? spec.bc : 0;
}

std::vector<float> Plan::read_floats(const Buffer& buffer) {
  std::vector<float> data(buffer.bytes() / 4);
  buffer.read(data.data(), buffer.bytes());
  return data;
}

std::vector<float> Plan::trace_records() const {
  return read_floats(trace);
}

void Plan::check_binding(const Tensor& t, const char* name) const {
  uint64_t range = ctx.device().max_storage_buffer_range;
  if (t.bytes() <= range) return;
  throw Error(std::string(name) + " of shape " + shape_string(t.shape()) + " (" +
              std::to_string(t.bytes()) + " bytes) exceeds the device's maxStorageBufferRange of " +
              std::to_string(range) + " bytes" +
              (name == std::string("K") || name == std::string("V")
                   ? "; register tiles (docs/engine.md) lift this limit for K and V"
                   : ""));
}

Buffer Plan::scratch(uint64_t bytes) {
  uint64_t range = ctx.device().max_storage_buffer_range;
  if (bytes > range)
    throw Error("attention needs a scratch buffer of " + std::to_string(bytes) +
                " bytes, more than the device's maxStorageBufferRange (" + std::to_string(range) +
                " bytes)");
  device_bytes += bytes;
  return Buffer(impl, bytes);
}

void Plan::set_keys(uint32_t n) {
  if (appends)
    throw Error(
        "attention: a recording that appends to a KV cache is told its position "
        "(set_position), and attends over the keys up to the appended ones");
  if (n > most_keys)
    throw Error("attention over " + std::to_string(n) + " keys, but " +
                (options.dynamic_keys ? "K and V hold at most " + std::to_string(most_keys) +
                                            " a head (their row_capacity())"
                                      : "this plan is for " + std::to_string(most_keys)));
  if (n != dims.nk && (spec.key_mask || (spec.mods & kModMask) || params.rope != RopeLayout::none))
    throw Error(
        "attention with a key mask, an additive mask or RoPE attends over the Nk it was "
        "recorded for (" +
        std::to_string(dims.nk) + "); record it again for " + std::to_string(n) + " keys");
  uint32_t words[4] = {n, 0, tile_keys, 0};
  lengths.write(words, sizeof(words));
}

void Plan::set_position(uint32_t position) {
  if (!appends)
    throw Error(
        "attention: set_position is for a recording that appends to a KV cache; this one "
        "attends over K and V as given (set_keys)");
  uint64_t rows = dims.nq;  // as many appended as there are queries
  if (position + rows > dims.kv_rows)
    throw Error("attention: appending " + std::to_string(rows) + " rows at position " +
                std::to_string(position) + " overruns the KV cache's capacity of " +
                std::to_string(dims.kv_rows) + " tokens");
  uint32_t words[4] = {position + dims.nq, position, tile_keys, 0};
  lengths.write(words, sizeof(words));
}

void Plan::check_paged() const {
  auto refuse = [](const std::string& what) { throw Error("paged attention: " + what); };
  if (!variant_info(params.variant).fused)
    refuse("naive materialises a score matrix of one Nk; use a fused variant");
  if (params.rope != RopeLayout::none) refuse("rope: rotate K before it goes into its page");
  if (params.mods.has_mask())
    refuse("an additive mask is [Nq, Nk] of one Nk; the sequences' lengths differ");
  if (!params.mods.key_mask.empty())
    refuse("a key mask is [B, Nk] of one Nk; each sequence's length says which keys it has");
  if (options.append.k || options.dynamic_keys || options.trace)
    refuse("paged_attention() is a one-shot call");
}

void Plan::check_append(const Tensor& q, const Tensor& k, const Tensor& v) {
  const Tensor* rows[2] = {options.append.k, options.append.v};
  const Tensor* cache[2] = {&k, &v};
  const char* names[2] = {"K", "V"};
  for (int i = 0; i < 2; ++i) {
    std::string name = std::string("attention: the new ") + names[i] + " rows";
    if (!rows[i] || rows[i]->empty() || rows[i]->context() != &ctx)
      throw Error(name + " must be a tensor on this context");
    const Tensor& t = *rows[i];
    if (!t.is_dense()) throw Error(name + " must be dense, not a prefix() or strided view");
    if (!cache[i]->is_dense())
      throw Error(std::string("attention: the KV cache's ") + names[i] +
                  " must be the whole cache (its capacity), not a prefix() view");
    auto want = cache[i]->shape();
    want[want.size() - 2] = q.shape()[q.shape().size() - 2];
    if (t.shape() != want)
      throw Error(name + " are " + shape_string(t.shape()) + "; appending as many rows as Q has " +
                  "queries to this cache needs " + shape_string(want));
    DType stored = cache[i]->dtype();
    if (!std::ranges::count(dtypes(DTypeUse::append), stored))
      throw Error(std::string("attention: appending to a ") + dtype_name(stored) +
                  " KV cache is not supported; a cache that is appended to stores " +
                  dtype_list(DTypeUse::append));
    bool quantised = dtype_quantised(stored);
    if (quantised ? t.dtype() != DType::f32 && t.dtype() != DType::f16 : t.dtype() != stored)
      throw Error(name + " are " + dtype_name(t.dtype()) + " but the cache stores " +
                  dtype_name(stored) + "; give them " +
                  (quantised ? "as f32 or f16 (they are quantised as they are appended)"
                             : "in the cache's dtype"));
  }
  if (!params.mods.key_mask.empty() || params.mods.has_mask())
    throw Error(
        "attention: a key mask or an additive mask covers a fixed number of keys; a recording "
        "that appends to a KV cache attends over more each step (use causal, a window, or "
        "AttentionRecording over prefix() views)");
  if (dims.nq > dims.kv_rows)
    throw Error("attention: appending " + std::to_string(dims.nq) + " rows (Q's queries) to a " +
                "KV cache of " + std::to_string(dims.kv_rows) + " tokens");
  if (params.query_position)
    throw Error(
        "attention: the queries of a recording that appends to a KV cache sit at the positions "
        "of the appended rows; leave query_position unset");
}

void Plan::plan_append(const Tensor& q, const Tensor& k, const Tensor& v) {
  VkBuffer angles = VK_NULL_HANDLE;
  uint32_t rotate = 0;
  if (params.rope != RopeLayout::none) {
    angles = plan_angles(*this, dims.kv_rows, dims.d, 0);  // one row per cache position
    rotate = kRowsRotate;
    q_rot = Tensor(ctx, q.shape(), q.dtype());
    device_bytes += q_rot.bytes();
    plan_rows(*this, q, q_rot, rotate | kAnglesAtPosition, angles);
    bindings[kQ] = binding(q_rot);
  }
  plan_rows(*this, *options.append.k, k, rotate | kRowsAtPosition | kAnglesAtPosition, angles);
  plan_rows(*this, *options.append.v, v, kRowsAtPosition, VK_NULL_HANDLE);
  add_barrier();
  options.append = {};  // the caller's tensors: bound above, not kept
}

}  // namespace flashvk::detail
