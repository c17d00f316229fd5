#include "flashvk/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "plan.hpp"
#include "variants.hpp"

namespace flashvk {

namespace {

constexpr int64_t kMaxHeadDim = 256;

using detail::kVariants;  // variants.hpp: every fact about a variant the engine needs

// Reads [N, d], [H, N, d] or [B, H, N, d] as (B, H, N, d).
std::array<int64_t, 4> as_4d(const std::vector<int64_t>& shape, const char* name) {
  if (shape.size() < 2 || shape.size() > 4)
    throw Error(std::string(name) + " must have rank 2 ([N, d]), 3 ([H, N, d]) or 4 " +
                "([B, H, N, d]); got rank " + std::to_string(shape.size()) + " " +
                shape_string(shape));
  std::array<int64_t, 4> dims = {1, 1, 1, 1};
  std::copy(shape.begin(), shape.end(), dims.begin() + (4 - static_cast<long>(shape.size())));
  for (int64_t d : dims)
    if (d < 1)
      throw Error(std::string(name) + " has an empty dimension: shape " + shape_string(shape));
  return dims;
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(message);
}

}  // namespace

const VariantInfo& variant_info(Variant variant) {
  for (const auto& v : kVariants)
    if (v.variant == variant) return v;
  throw Error("unknown variant " + std::to_string(static_cast<int>(variant)));
}

const std::vector<Variant>& all_variants() {
  static const std::vector<Variant> all = [] {
    std::vector<Variant> v;
    for (const auto& info : kVariants) v.push_back(info.variant);
    return v;
  }();
  return all;
}

const char* variant_name(Variant variant) {
  for (const auto& v : kVariants)
    if (v.variant == variant) return v.name;
  return "unknown";
}

const TileLayoutInfo& tile_layout_info(TileLayout layout) {
  auto i = static_cast<size_t>(layout);
  if (i >= std::size(detail::kLayouts)) throw Error("unknown tile layout " + std::to_string(i));
  return detail::kLayouts[i].info;
}

const char* tile_layout_name(TileLayout layout) {
  auto i = static_cast<size_t>(layout);
  return i < std::size(detail::kLayouts) ? detail::kLayouts[i].info.name : "unknown";
}

std::vector<TileLayout> all_tile_layouts() {
  std::vector<TileLayout> out;
  for (const detail::LayoutRow& row : detail::kLayouts) out.push_back(row.info.layout);
  return out;
}

TileLayout parse_tile_layout(const std::string& text) {
  std::string options;
  for (const detail::LayoutRow& row : detail::kLayouts) {
    if (text == row.info.name || text == row.info.option) return row.info.layout;
    options += std::string(options.empty() ? "" : ", ") + row.info.option;
  }
  throw Error("unknown tile layout '" + text + "'; expected one of " + options);
}

Variant parse_variant(const std::string& name) {
  for (const auto& v : kVariants)
    if (name == v.name) return v.variant;
  std::string names;
  for (const auto& v : kVariants) names += std::string(names.empty() ? "" : ", ") + v.name;
  throw Error("unknown variant '" + name + "'; expected one of " + names);
}

const char* rope_name(RopeLayout layout) {
  switch (layout) {
    case RopeLayout::interleaved:
      return "interleaved";
    case RopeLayout::half:
      return "half";
    default:
      return "none";
  }
}

RopeLayout parse_rope(const std::string& name) {
  if (name == "none") return RopeLayout::none;
  if (name == "interleaved") return RopeLayout::interleaved;
  if (name == "half") return RopeLayout::half;
  throw Error("unknown rope layout '" + name + "'; expected none, interleaved or half");
}

Dims check_shapes(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                  const std::vector<int64_t>& v) {
  auto qd = as_4d(q, "Q");
  auto kd = as_4d(k, "K");
  auto vd = as_4d(v, "V");
  require(q.size() == k.size() && q.size() == v.size(),
          "Q, K and V must have the same rank; got Q " + shape_string(q) + ", K " +
              shape_string(k) + ", V " + shape_string(v));
  require(qd[0] == kd[0] && kd[0] == vd[0], "batch sizes differ: Q " + shape_string(q) + ", K " +
                                                shape_string(k) + ", V " + shape_string(v));
  require(kd[1] == vd[1], "K and V must have the same number of heads: K " + shape_string(k) +
                              ", V " + shape_string(v));
  require(qd[1] % kd[1] == 0, "Q's heads (" + std::to_string(qd[1]) +
                                  ") must be a multiple of K/V's heads (" + std::to_string(kd[1]) +
                                  ") for grouped-query attention");
  require(kd[2] == vd[2], "K and V must have the same number of keys: K " + shape_string(k) +
                              ", V " + shape_string(v));
  require(qd[3] == kd[3],
          "Q and K must have the same head dim: Q " + shape_string(q) + ", K " + shape_string(k));
  require(qd[3] <= kMaxHeadDim,
          "head dim d = " + std::to_string(qd[3]) + " exceeds " + std::to_string(kMaxHeadDim));
  require(vd[3] <= kMaxHeadDim,
          "V's head dim dv = " + std::to_string(vd[3]) + " exceeds " + std::to_string(kMaxHeadDim));
  const int64_t limit = int64_t(1) << 31;
  require(qd[0] * qd[1] * qd[2] < limit && kd[0] * kd[1] * kd[2] < limit,
          "too many rows: B * H * N must stay below 2^31");
  Dims dims;
  dims.batch = static_cast<uint32_t>(qd[0]);
  dims.heads = static_cast<uint32_t>(qd[1]);
  dims.kv_heads = static_cast<uint32_t>(kd[1]);
  dims.nq = static_cast<uint32_t>(qd[2]);
  dims.nk = static_cast<uint32_t>(kd[2]);
  dims.kv_rows = dims.nk;
  dims.kv_keys = uint64_t(dims.batch) * dims.kv_heads * dims.kv_rows;
  dims.d = static_cast<uint32_t>(qd[3]);
  dims.dv = static_cast<uint32_t>(vd[3]);
  dims.out_shape = q;
  dims.out_shape.back() = vd[3];
  dims.lse_shape.assign(q.begin(), q.end() - 1);
  return dims;
}

uint32_t PageTable::length(uint32_t b) const {
  require(b < batch(), "page table: no sequence " + std::to_string(b) + " in a batch of " +
                           std::to_string(batch()));
  uint64_t pages = indptr[b + 1] - indptr[b];
  uint64_t n = pages == 0 ? 0 : (pages - 1) * page_size + last_page_len.at(b);
  require(n < (uint64_t(1) << 31), "page table: sequence " + std::to_string(b) + " holds " +
                                       std::to_string(n) + " tokens; at most 2^31 - 1");
  return static_cast<uint32_t>(n);
}

uint32_t PageTable::add_sequence() {
  if (indptr.empty()) indptr.push_back(0);
  indptr.push_back(indptr.back());
  last_page_len.push_back(0);
  return batch() - 1;
}

PageTable::Slot PageTable::grow(uint32_t b, std::vector<uint32_t>& free_pages) {
  require(page_size > 0, "page table: page_size must be at least 1");
  uint32_t length_now = length(b);
  if (length_now % page_size == 0) {  // no pages yet, or the last one is full
    require(!free_pages.empty(),
            "page table: sequence " + std::to_string(b) + " needs a page and none is free");
    indices.insert(indices.begin() + indptr[b + 1], free_pages.back());
    free_pages.pop_back();
    for (size_t s = b + 1; s < indptr.size(); ++s) ++indptr[s];
    last_page_len[b] = 0;
  }
  ++last_page_len[b];
  return {indices[indptr[b + 1] - 1], last_page_len[b] - 1};
}

void PageTable::release(uint32_t b, std::vector<uint32_t>& free_pages) {
  require(b < batch(), "page table: no sequence " + std::to_string(b) + " in a batch of " +
                           std::to_string(batch()));
  uint32_t first = indptr[b], pages = indptr[b + 1] - first;
  free_pages.insert(free_pages.end(), indices.begin() + first, indices.begin() + first + pages);
  indices.erase(indices.begin() + first, indices.begin() + first + pages);
  for (size_t s = b + 1; s < indptr.size(); ++s) indptr[s] -= pages;
  last_page_len[b] = 0;
}

void PageTable::check(uint64_t pages) const {
  require(page_size > 0, "page table: page_size must be at least 1");
  require(!indptr.empty() && indptr[0] == 0, "page table: indptr must start with 0");
  require(last_page_len.size() == batch(),
          "page table: last_page_len has " + std::to_string(last_page_len.size()) +
              " entries for " + std::to_string(batch()) + " sequences (indptr's size - 1)");
  for (uint32_t b = 0; b < batch(); ++b) {
    require(indptr[b + 1] >= indptr[b],
            "page table: indptr decreases at sequence " + std::to_string(b));
    bool has_pages = indptr[b + 1] > indptr[b];
    uint32_t last = last_page_len[b];
    require(has_pages ? last >= 1 && last <= page_size : last == 0,
            "page table: sequence " + std::to_string(b) + " has last_page_len " +
                std::to_string(last) + "; it takes 1 .. page_size (" + std::to_string(page_size) +
                ") with pages, 0 without");
  }
  require(indices.size() < (size_t(1) << 31), "page table: more than 2^31 indices");
  for (uint32_t b = 0; b < batch(); ++b) length(b);  // each below 2^31 tokens
  require(indices.size() == indptr.back(),
          "page table: indices has " + std::to_string(indices.size()) +
              " entries; indptr's last (" + std::to_string(indptr.back()) + ") says how many");
  for (size_t i = 0; i < indices.size(); ++i)
    require(indices[i] < pages, "page table: indices[" + std::to_string(i) +
                                    "] = " + std::to_string(indices[i]) + " is not one of the " +
                                    std::to_string(pages) + " pages of K and V");
}

namespace detail {
// Q [B, H, Nq, d] against K and V pages [pages, Hkv, page_size, d or dv] and the page table.
Dims check_paged_shapes(const std::vector<int64_t>& q, const std::vector<int64_t>& k,
                        const std::vector<int64_t>& v, const PageTable& pages) {
  require(q.size() == 4, "paged attention: Q is [B, H, Nq, d]; got " + shape_string(q));
  require(k.size() == 4 && v.size() == 4,
          "paged attention: K and V are pages [pages, Hkv, page_size, d]; got K " +
              shape_string(k) + ", V " + shape_string(v));
  // Q against one sequence's K and V ([1, Hkv, page_size, d]): heads, head dims; the errors name
  // the shapes as given.
  Dims dims;
  try {
    dims = check_shapes({1, q[1], q[2], q[3]}, {1, k[1], k[2], k[3]}, {1, v[1], v[2], v[3]});
  } catch (const Error& e) {
    throw Error(std::string("paged attention: ") + e.what() + " (Q " + shape_string(q) +
                ", K pages " + shape_string(k) + ", V pages " + shape_string(v) + ")");
  }
  require(k[0] == v[0], "paged attention: K and V must have the same number of pages: K " +
                            shape_string(k) + ", V " + shape_string(v));
  const int64_t limit = int64_t(1) << 31;
  require(q[0] * q[1] * q[2] < limit && k[0] * k[1] * k[2] < limit,
          "paged attention: too many rows: B * H * Nq and pages * Hkv * page_size must stay "
          "below 2^31");
  require(k[2] == pages.page_size, "paged attention: K's pages hold " + std::to_string(k[2]) +
                                       " tokens; the page table's page_size is " +
                                       std::to_string(pages.page_size));
  require(q[0] == pages.batch(), "paged attention: Q's batch (" + std::to_string(q[0]) +
                                     ") must be the page table's number of sequences (" +
                                     std::to_string(pages.batch()) + ")");
  pages.check(static_cast<uint64_t>(k[0]));
  uint32_t most = 0;
  for (uint32_t b = 0; b < pages.batch(); ++b) most = std::max(most, pages.length(b));
  require(most > 0, "paged attention: the page table holds no tokens");
  dims.batch = static_cast<uint32_t>(q[0]);
  dims.nk = most;  // the longest sequence; each row sees its own
  dims.kv_rows = 1;
  dims.kv_keys = uint64_t(k[0]) * k[1] * k[2];
  dims.out_shape = q;
  dims.out_shape.back() = v[3];
  dims.lse_shape.assign(q.begin(), q.end() - 1);
  return dims;
}
}  // namespace detail

namespace {
// Submits the plan, waits, and hands over its outputs and what ran.
AttentionResult run(Context& ctx, detail::Plan& plan) {
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { plan.record(cmd); });
  plan.check_user_functions();
  AttentionResult result;
  result.gpu_ms = plan.gpu_ms();
  result.device_bytes = plan.allocated_bytes();
  result.tile_layout = plan.tile_layout();
  result.block_rows = plan.block_rows();
  result.group_rows = plan.group_rows();
  result.block_keys = plan.block_keys();
  result.splits = plan.key_chunks();
  result.out = plan.take_out();
  result.lse = plan.take_lse();
  return result;
}
}  // namespace

AttentionResult attention(Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                          const AttentionParams& params) {
  detail::Plan plan(ctx, q, k, v, params);
  return run(ctx, plan);
}

AttentionResult paged_attention(Context& ctx, const Tensor& q, const Tensor& k_pages,
                                const Tensor& v_pages, const PageTable& pages,
                                const AttentionParams& params) {
  detail::PlanOptions options;
  options.pages = &pages;
  detail::Plan plan(ctx, q, k_pages, v_pages, params, options);
  return run(ctx, plan);
}

std::array<Tensor, 3> upload_qkv(Context& ctx, const HostTensor& q, const HostTensor& k,
                                 const HostTensor& v, const Storage& storage) {
  std::array<Tensor, 3> t;
  const HostTensor* host[3] = {&q, &k, &v};
  const DType dtypes[3] = {storage.q, storage.k, storage.v};
  const char* names[3] = {"Q", "K", "V"};
  for (int i = 0; i < 3; ++i) {
    try {
      t[i] = Tensor::upload(ctx, *host[i], dtypes[i]);
    } catch (const VulkanError&) {
      throw;
    } catch (const Error& e) {
      throw Error(std::string(names[i]) + ": " + e.what());
    }
  }
  return t;
}

HostAttentionResult attention(Context& ctx, const HostTensor& q, const HostTensor& k,
                              const HostTensor& v, const AttentionParams& params, Storage storage) {
  check_shapes(q.shape, k.shape, v.shape);  // before any upload
  auto [tq, tk, tv] = upload_qkv(ctx, q, k, v, storage);
  AttentionResult r = attention(ctx, tq, tk, tv, params);
  HostAttentionResult host;
  host.out = r.out.download();
  if (!r.lse.empty()) host.lse = r.lse.download();
  host.gpu_ms = r.gpu_ms;
  host.device_bytes = r.device_bytes + tq.bytes() + tk.bytes() + tv.bytes();
  host.tile_layout = r.tile_layout;
  host.block_rows = r.block_rows;
  host.group_rows = r.group_rows;
  host.block_keys = r.block_keys;
  host.splits = r.splits;
  return host;
}

Tensor rope(Context& ctx, const Tensor& x, const RopeParams& params) {
  detail::Plan plan(ctx, x, params);
  ctx.impl().submit_and_wait([&](VkCommandBuffer cmd) { plan.record(cmd); });
  return plan.take_out();
}

AttentionRecording::AttentionRecording(Context& ctx, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const AttentionParams& params,
                                       const AttentionOutputs& outputs) {
  detail::PlanOptions options;
  options.outputs = outputs;
  options.dynamic_keys = true;
  plan_ = std::make_unique<detail::Plan>(ctx, q, k, v, params, options);
}
AttentionRecording::AttentionRecording(Context& ctx, const Tensor& q, KvCache& cache,
                                       const Tensor& k_new, const Tensor& v_new,
                                       const AttentionParams& params,
                                       const AttentionOutputs& outputs) {
  detail::PlanOptions options;
  options.outputs = outputs;
  options.append.k = &k_new;
  options.append.v = &v_new;
  plan_ = std::make_unique<detail::Plan>(ctx, q, cache.keys(), cache.values(), params, options);
}
AttentionRecording::AttentionRecording(AttentionRecording&&) noexcept = default;
AttentionRecording& AttentionRecording::operator=(AttentionRecording&&) noexcept = default;
AttentionRecording::~AttentionRecording() = default;

void AttentionRecording::record(VkCommandBuffer cmd) {
  plan_->record(cmd);
}
const Tensor& AttentionRecording::out() const {
  return plan_->out();
}
const Tensor& AttentionRecording::lse() const {
  return plan_->lse();
}
void AttentionRecording::set_keys(uint32_t n) {
  plan_->check_user_functions();  // the run before, finished
  plan_->set_keys(n);
}
void AttentionRecording::set_position(uint32_t position) {
  plan_->check_user_functions();
  plan_->set_position(position);
}
void AttentionRecording::check_user_functions() const {
  plan_->check_user_functions();
}

namespace {

KvCacheShape checked_cache_shape(const Tensor& k, const Tensor& v) {
  if (k.empty() || v.empty()) throw Error("KvCache: keys and values must be set");
  if (k.context() != v.context())
    throw Error("KvCache: keys and values must live on the same context");
  if (!k.is_dense() || !v.is_dense())
    throw Error("KvCache: keys and values must be dense, not prefix() or strided views");
  if (k.shape().size() != 4 || v.shape().size() != 4)
    throw Error("KvCache: keys and values are [B, Hkv, capacity, d]; got " +
                shape_string(k.shape()) + " and " + shape_string(v.shape()));
  for (int i = 0; i < 3; ++i)
    if (k.shape()[size_t(i)] != v.shape()[size_t(i)])
      throw Error("KvCache: keys " + shape_string(k.shape()) + " and values " +
                  shape_string(v.shape()) + " differ in their first three dimensions");
  if (k.dtype() != v.dtype() || !std::ranges::count(dtypes(DTypeUse::append), k.dtype()))
    throw Error("KvCache: keys and values are stored alike as " + dtype_list(DTypeUse::append) +
                "; got " + dtype_name(k.dtype()) + " and " + dtype_name(v.dtype()));
  for (int64_t x : k.shape())
    if (x <= 0 || x > int64_t(UINT32_MAX)) throw Error("KvCache: a dimension is out of range");
  auto dim = [](const Tensor& t, size_t i) { return static_cast<uint32_t>(t.shape()[i]); };
  return KvCacheShape{dim(k, 0), dim(k, 1), dim(k, 2), dim(k, 3), dim(v, 3), k.dtype()};
}

std::vector<int64_t> cache_dims(const KvCacheShape& s, uint32_t width) {
  if (s.batch == 0 || s.kv_heads == 0 || s.capacity == 0 || s.d == 0)
    throw Error("KvCache: batch, kv_heads, capacity and d must be at least 1");
  return {s.batch, s.kv_heads, s.capacity, width};
}

}  // namespace

KvCache::KvCache(Context& ctx, const KvCacheShape& shape)
    : shape_(shape),
      k_(ctx, cache_dims(shape, shape.d), shape.dtype),
      v_(ctx, cache_dims(shape, shape.dv ? shape.dv : shape.d), shape.dtype) {
  shape_ = checked_cache_shape(k_, v_);
}

KvCache::KvCache(Tensor keys, Tensor values)
    : shape_(checked_cache_shape(keys, values)), k_(std::move(keys)), v_(std::move(values)) {}
TileLayout AttentionRecording::tile_layout() const {
  return plan_->tile_layout();
}

}  // namespace flashvk
