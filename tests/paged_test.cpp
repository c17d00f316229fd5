// Paged KV: a batch of sequences of different lengths whose K and V rows sit in pages of a
// shared pool, in the order a page table gives, attended in one call. Each sequence is compared
// with the float64 reference run on its own keys, gathered back into a dense tensor.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "test_util.hpp"
#ifdef FLASHVK_TEST_FLEX
#include "flashvk/flex.hpp"
#endif

namespace flashvk::test {
namespace {

TEST(PageTableTest, SequencesGrowByTakingFreePagesAndGiveThemBack) {
  PageTable t;
  t.page_size = 4;
  std::vector<uint32_t> free_pages = {9, 8, 7, 6, 5};  // taken from the back
  uint32_t a = t.add_sequence(), b = t.add_sequence();
  EXPECT_EQ(t.batch(), 2u);
  EXPECT_EQ(t.length(a), 0u);
  for (uint32_t n = 0; n < 5; ++n) {  // a: 5 tokens, pages 5 and 6
    PageTable::Slot s = t.grow(a, free_pages);
    EXPECT_EQ(s.page, n < 4 ? 5u : 6u);
    EXPECT_EQ(s.row, n % 4);
  }
  PageTable::Slot s = t.grow(b, free_pages);  // b: its first page, 7
  EXPECT_EQ(s.page, 7u);
  EXPECT_EQ(s.row, 0u);
  for (int n = 0; n < 3; ++n) t.grow(a, free_pages);  // a fills page 6: no new page
  EXPECT_EQ(t.length(a), 8u);
  t.grow(a, free_pages);  // a's ninth token takes page 8, in front of b's pages in indices
  EXPECT_EQ(t.indptr, (std::vector<uint32_t>{0, 3, 4}));
  EXPECT_EQ(t.indices, (std::vector<uint32_t>{5, 6, 8, 7}));
  EXPECT_EQ(t.last_page_len, (std::vector<uint32_t>{1, 1}));
  EXPECT_EQ(t.length(a), 9u);
  EXPECT_EQ(t.length(b), 1u);
  EXPECT_NO_THROW(t.check(10));
  expect_refused([&] { t.check(8); }, "indices[2] = 8 is not one of the 8 pages");
  t.release(a, free_pages);
  EXPECT_EQ(t.length(a), 0u);
  EXPECT_EQ(t.indptr, (std::vector<uint32_t>{0, 0, 1}));
  EXPECT_EQ(t.indices, (std::vector<uint32_t>{7}));
  EXPECT_EQ(free_pages, (std::vector<uint32_t>{9, 5, 6, 8}));
  free_pages.clear();
  for (int n = 0; n < 3; ++n) t.grow(b, free_pages);  // b's page has room for 3 more
  expect_refused([&] { t.grow(b, free_pages); }, "sequence 1 needs a page and none is free");
  PageTable bad = t;
  bad.last_page_len[1] = 5;
  expect_refused([&] { bad.check(10); }, "sequence 1 has last_page_len 5");
  bad = t;
  bad.indptr = {0, 1, 0};
  bad.last_page_len = {1, 4};
  expect_refused([&] { bad.check(10); }, "indptr decreases at sequence 1");
  PageTable huge;  // 2^15 + 1 references to one page of 2^16 tokens: 2^31 tokens
  huge.page_size = 1u << 16;
  huge.indptr = {0, (1u << 15) + 1};
  huge.indices.assign((1u << 15) + 1, 0);
  huge.last_page_len = {1};
  expect_refused([&] { huge.check(1); }, "sequence 0 holds 2147483649 tokens");
  PageTable zero;
  zero.page_size = 0;
  uint32_t z = zero.add_sequence();
  expect_refused([&] { zero.grow(z, free_pages); }, "page_size must be at least 1");
}

// A batch in pages: K and V of every sequence (dense, for the reference) and the pages
// holding them, filled token by token in turn so that a sequence's pages are not contiguous.
// Pages and rows that hold no token are NaN (1000 when quantised): a kernel that weighed one
// would say so.
struct PagedBatch {
  PageTable table;
  std::vector<HostTensor> k, v;  // per sequence [1, Hkv, length, d or dv]
  HostTensor k_pages, v_pages;   // [pages, Hkv, page_size, d or dv]
};

// K's and V's values: random_tensor's, or (K or V in a block format) exact_blocks' for the
// format.
PagedBatch make_paged(const std::vector<uint32_t>& lengths, uint32_t page_size, int64_t kv_heads,
                      int64_t d, int64_t dv, uint32_t pages, uint32_t seed,
                      const Storage& grid = Storage{}) {
  PagedBatch p;
  p.table.page_size = page_size;
  std::vector<uint32_t> free_pages(pages);
  for (uint32_t i = 0; i < pages; ++i) free_pages[i] = i;
  std::shuffle(free_pages.begin(), free_pages.end(), std::mt19937(seed));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.k_pages = HostTensor({pages, kv_heads, page_size, d});
  p.v_pages = HostTensor({pages, kv_heads, page_size, dv});
  std::fill(p.k_pages.data.begin(), p.k_pages.data.end(), nan);
  std::fill(p.v_pages.data.begin(), p.v_pages.data.end(), nan);
  for (uint32_t length : lengths) {
    p.table.add_sequence();
    auto values = [&](int64_t width, DType format) {
      std::vector<int64_t> shape = {1, kv_heads, length, width};
      return dtype_quantised(format) ? exact_blocks(shape, format, ++seed)
                                     : random_tensor(shape, ++seed);
    };
    p.k.push_back(values(d, grid.k));
    p.v.push_back(values(dv, grid.v));
  }
  uint32_t longest = *std::max_element(lengths.begin(), lengths.end());
  for (uint32_t t = 0; t < longest; ++t)
    for (uint32_t b = 0; b < lengths.size(); ++b) {
      if (t >= lengths[b]) continue;
      PageTable::Slot s = p.table.grow(b, free_pages);
      for (int64_t h = 0; h < kv_heads; ++h) {
        int64_t row = (int64_t(s.page) * kv_heads + h) * page_size + s.row;
        std::copy_n(p.k[b].data.begin() + (h * lengths[b] + t) * d, d,
                    p.k_pages.data.begin() + row * d);
        std::copy_n(p.v[b].data.begin() + (h * lengths[b] + t) * dv, dv,
                    p.v_pages.data.begin() + row * dv);
      }
    }
  return p;
}

// Rows [b] of a [B, ...] tensor's data, as a tensor of shape [1, ...].
HostTensor batch_slice(const HostTensor& x, int64_t b) {
  std::vector<int64_t> shape = x.shape;
  shape[0] = 1;
  HostTensor s(shape);
  std::copy_n(x.data.begin() + b * numel(shape), numel(shape), s.data.begin());
  return s;
}

// Each sequence of `gpu` against the float64 reference on its own keys (the values as stored).
void expect_sequences_match(const HostTensor& q, const PagedBatch& p, const Storage& storage,
                            const AttentionParams& params, const HostAttentionResult& gpu,
                            const std::string& what) {
  for (uint32_t b = 0; b < p.table.batch(); ++b) {
    SCOPED_TRACE(what + ", sequence " + std::to_string(b) + " of " +
                 std::to_string(p.table.length(b)) + " tokens");
    HostTensor out = batch_slice(gpu.out, b), lse = batch_slice(gpu.lse, b);
    if (p.table.length(b) == 0) {  // no keys: O = 0, LSE = the sink or -inf
      for (float x : out.data) EXPECT_EQ(x, 0.0f);
      int64_t nq = q.shape[2];
      for (int64_t r = 0; r < numel(lse.shape); ++r) {
        float want = params.mods.sinks.empty() ? -std::numeric_limits<float>::infinity()
                                               : params.mods.sinks[r / nq];
        EXPECT_EQ(lse.data[r], want);
      }
      continue;
    }
    HostTensor qs = stored_values(batch_slice(q, b), storage.q);
    HostTensor ks = stored_values(p.k[b], storage.k), vs = stored_values(p.v[b], storage.v);
    reference::Result ref = reference::direct(qs, ks, vs, params);
    DecodeRounding moved = decode_rounding(gpu.tile_layout, qs, ks, vs, params);
    EXPECT_LE(max_error(out.data, ref.out),
              tolerance(qs, ks, vs, params) + weight_rounding(gpu.tile_layout, vs) + moved.out);
    EXPECT_LE(max_lse_error(lse.data, ref.lse), 1e-5 + moved.lse);
  }
}

// The block formats quantise finite values only: there the rows without a token hold 1000.
HostTensor unused_rows_finite(HostTensor x, DType storage) {
  if (dtype_quantised(storage))
    for (float& e : x.data)
      if (std::isnan(e)) e = 1000.0f;
  return x;
}

HostAttentionResult run_paged(Context& ctx, const HostTensor& q, const PagedBatch& p,
                              const AttentionParams& params, const Storage& storage) {
  Tensor tq = Tensor::upload(ctx, q, storage.q);
  Tensor tk = Tensor::upload(ctx, unused_rows_finite(p.k_pages, storage.k), storage.k);
  Tensor tv = Tensor::upload(ctx, unused_rows_finite(p.v_pages, storage.v), storage.v);
  AttentionResult r = paged_attention(ctx, tq, tk, tv, p.table, params);
  HostAttentionResult host;
  host.out = r.out.download();
  host.lse = r.lse.download();
  host.tile_layout = r.tile_layout;
  return host;
}

class PagedTest : public VulkanTest, public ::testing::WithParamInterface<Variant> {};

// Five sequences (37, 1, 0, 70 and 16 tokens) in pages of 16 of a pool of 14, GQA (4 query
// heads on 2), in each layout the device runs: decoding (one query a sequence), the modifiers
// models combine (causal, a window, sinks, softcap, ALiBi) over three queries a sequence, and
// quantised K and V under fp16 Q.
TEST_P(PagedTest, EachSequenceMatchesTheReferenceOnItsOwnKeys) {
  Variant variant = GetParam();
  const DeviceInfo& info = context().device();
  const std::vector<uint32_t> lengths = {37, 1, 0, 70, 16};
  const int64_t heads = 4, kv_heads = 2, d = 32, dv = 32;
  PagedBatch p = make_paged(lengths, 16, kv_heads, d, dv, 14, 700);
  std::vector<TileLayout> layouts = {TileLayout::automatic, TileLayout::shared, TileLayout::blocks};
  if (info.subgroup_shuffle && info.texel_buffers) layouts.push_back(TileLayout::registers);

  // Each layout runs (the asked-for one, unless automatic) and each sequence of *batch matches.
  const PagedBatch* batch = &p;
  auto check = [&](const char* what, const HostTensor& q, AttentionParams params,
                   const Storage& storage, const std::vector<TileLayout>& in) {
    for (TileLayout layout : in) {
      params.hints.tile_layout = layout;
      HostAttentionResult gpu = run_paged(context(), q, *batch, params, storage);
      if (layout != TileLayout::automatic) {
        EXPECT_EQ(gpu.tile_layout, layout);
      }
      expect_sequences_match(q, *batch, storage, params, gpu,
                             std::string(what) + ", " + tile_layout_name(gpu.tile_layout));
    }
  };
  std::vector<TileLayout> with_lanes = layouts;  // splitkv: also the decoding kernel
  if (variant == Variant::splitkv && info.subgroup_shuffle) with_lanes.push_back(TileLayout::lanes);
  AttentionParams params;
  params.variant = variant;

  // Decoding: one query a sequence, fp32.
  HostTensor q1 = random_tensor({5, heads, 1, d}, 710);
  check("decode", q1, params, Storage{}, with_lanes);

  // Three queries a sequence, bottom-right aligned to its own length, with the modifiers.
  HostTensor q3 = random_tensor({5, heads, 3, d}, 720);
  AttentionParams mods = params;
  mods.mods.causal = true;
  mods.mods.window_left = 20;
  mods.mods.softcap = 8.0f;
  mods.mods.alibi_max_bias = 4.0f;
  mods.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  check("modifiers", q3, mods, Storage{}, layouts);

#ifdef FLASHVK_TEST_FLEX
  // User-written functions (flashvk::flex) index each sequence's own keys; also with q8_0 K and
  // q4_0 V. Neither depends on the sequence's length, which the reference's twin cannot see.
  flex::enable(context());
  AttentionParams user = params;
  user.mods.causal = true;
  user.mods.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  return kv_idx % 5 != 3;
})";
  user.mods.score_mod = R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score + 0.05 * float(kv_idx % 7) - 0.1 * float(h);
})";
  user.mods.mask_twin = [](int, int, int, int j) { return j % 5 != 3; };
  user.mods.score_twin = [](double s, int, int h, int, int j) {
    return s + 0.05 * double(j % 7) - 0.1 * double(h);
  };
  check("user functions", q3, user, Storage{}, with_lanes);
  if (info.fp16_storage)
    check("user functions, q8_0/q4_0", q3, user, Storage{DType::f16, DType::q8_0, DType::q4_0},
          {TileLayout::automatic});
#endif

  // fp16 (also the cooperative-matrix kernel, for the variants that have one: on the device's
  // matrix units, else emulated), and block formats for K and V under fp16 Q.
  if (!info.fp16_storage) return;
  params.mods.causal = true;
  std::vector<TileLayout> f16_layouts = {TileLayout::automatic};
  for (TileLayout layout : device_layouts(variant, d, dv))  // online has no matrix kernel
    if (layout == TileLayout::cooperative_matrix) f16_layouts.push_back(layout);
  check("f16", q3, params, Storage{DType::f16}, f16_layouts);
  // Block formats in the matrix kernel (decoded as its tiles are staged: heads found through
  // the pool's rows), on values each format and fp16 hold exactly (exact_blocks), so at the fp16
  // products' tolerance: q8_0 K and q4_1 V (heads of one half and of two), 16-key tiles.
  if (f16_layouts.size() > 1) {
    const Storage grid{DType::f16, DType::q8_0, DType::q4_1};
    PagedBatch exact = make_paged(lengths, 16, kv_heads, d, dv, 14, 730, grid);
    AttentionParams tiles = params;
    tiles.hints.block_keys = 16;
    batch = &exact;
    check("q8_0/q4_1 on their grids", q3, tiles, grid, {TileLayout::cooperative_matrix});
    batch = &p;
  }
  std::vector<TileLayout> quant_layouts = {TileLayout::automatic, TileLayout::shared};
  if (variant == Variant::splitkv && info.subgroup_shuffle)
    quant_layouts.push_back(TileLayout::lanes);
  check("q8_0/q4_0", q3, params, Storage{DType::f16, DType::q8_0, DType::q4_0}, quant_layouts);
  // ggml's other block formats: in decoding's variant q5_1 K and iq4_nl V, in flash2 q4_1 K and
  // q5_0 V.
  if (variant == Variant::splitkv)
    check("q5_1/iq4_nl", q3, params, Storage{DType::f16, DType::q5_1, DType::iq4_nl},
          quant_layouts);
  if (variant == Variant::flash2)
    check("q4_1/q5_0", q3, params, Storage{DType::f16, DType::q4_1, DType::q5_0},
          {TileLayout::automatic});
}

std::vector<Variant> fused_variants() {
  std::vector<Variant> v;
  for (Variant x : all_variants())
    if (variant_info(x).fused) v.push_back(x);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Fused, PagedTest, ::testing::ValuesIn(fused_variants()),
                         variant_param_name);

// What paged attention cannot be asked for is refused by name, before any work.
TEST_F(VulkanTest, PagedAttentionRefusesWhatDoesNotFitByName) {
  PagedBatch p = make_paged({5, 9}, 4, 1, 8, 8, 6, 800);
  Context& ctx = context();
  Tensor q = Tensor::upload(ctx, random_tensor({2, 2, 1, 8}, 810), DType::f32);
  Tensor k = Tensor::upload(ctx, p.k_pages, DType::f32);
  Tensor v = Tensor::upload(ctx, p.v_pages, DType::f32);
  AttentionParams params;
  params.variant = Variant::naive;
  expect_refused([&] { paged_attention(ctx, q, k, v, p.table, params); }, "naive materialises");
  params = {};
  params.rope = RopeLayout::interleaved;
  expect_refused([&] { paged_attention(ctx, q, k, v, p.table, params); },
                 "rotate K before it goes into its page");
  params = {};
  params.mods.mask = HostTensor({1, 9});
  expect_refused([&] { paged_attention(ctx, q, k, v, p.table, params); }, "an additive mask");
  params = {};
  params.mods.key_mask.assign(2 * 9, 1);
  expect_refused([&] { paged_attention(ctx, q, k, v, p.table, params); }, "a key mask");
  PageTable other = p.table;
  other.page_size = 8;
  expect_refused([&] { paged_attention(ctx, q, k, v, other, {}); },
                 "K's pages hold 4 tokens; the page table's page_size is 8");
  Tensor q3 = Tensor::upload(ctx, random_tensor({3, 2, 1, 8}, 811), DType::f32);
  expect_refused([&] { paged_attention(ctx, q3, k, v, p.table, {}); },
                 "Q's batch (3) must be the page table's number of sequences (2)");
  other = p.table;
  other.indices[0] = 6;
  expect_refused([&] { paged_attention(ctx, q, k, v, other, {}); }, "is not one of the 6 pages");
  PageTable empty;
  empty.page_size = 4;
  empty.add_sequence();
  empty.add_sequence();
  expect_refused([&] { paged_attention(ctx, q, k, v, empty, {}); },
                 "the page table holds no tokens");
}

}  // namespace
}  // namespace flashvk::test
