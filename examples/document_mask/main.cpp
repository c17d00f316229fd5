// Attention of the application's own (flashvk::flex): sequences packed into one batch row, each a
// document that sees only itself, causally. The mask is a GLSL mask_mod reading a document id per
// token from flex_table; the engine compiles it into its kernels at run time and never reads the
// tiles it hides. The result is checked against flashvk's float64 reference, which applies the
// function's C++ twin. Exits 1 if the output is off, 2 on an error.
#include <cmath>
#include <cstdio>
#include <random>

#include "flashvk.hpp"
#include "flashvk/flex.hpp"
#include "flashvk/reference.hpp"

int main() try {
  const int64_t heads = 4, n = 600, d = 64;
  const int64_t starts[] = {0, 130, 350, 600};  // three documents of 130, 220 and 250 tokens
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto random = [&](std::vector<int64_t> shape) {
    flashvk::HostTensor t(std::move(shape));
    for (float& x : t.data) x = normal(rng);
    return t;
  };
  flashvk::HostTensor q = random({1, heads, n, d}), k = random({1, heads, n, d}),
                      v = random({1, heads, n, d});

  flashvk::Context ctx = flashvk::Context::create();
  flashvk::flex::enable(ctx);
  flashvk::AttentionParams params;
  params.mods.mask_mod = R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;  // the query's token
  return kv_idx <= q_pos && flex_table[kv_idx] == flex_table[q_pos];
})";
  params.mods.flex_table = flashvk::HostTensor({n});
  for (int64_t j = 0, doc = 0; j < n; ++j) {
    while (j >= starts[doc + 1]) ++doc;
    params.mods.flex_table.data[size_t(j)] = float(doc);
  }
  std::vector<float> ids = params.mods.flex_table.data;
  params.mods.mask_twin = [ids](int, int, int i, int j) {
    return j <= i && ids[size_t(j)] == ids[size_t(i)];  // Nq = Nk: q_pos = q_idx
  };

  flashvk::HostAttentionResult gpu = flashvk::attention(ctx, q, k, v, params);
  flashvk::reference::Result ref = flashvk::reference::direct(q, k, v, params);
  double error = 0;
  for (size_t x = 0; x < ref.out.size(); ++x)
    error = std::max(error, std::abs(double(gpu.out.data[x]) - ref.out[x]));
  std::printf("document_mask: %lld tokens in 3 documents on %s, max error %.2e against float64\n",
              static_cast<long long>(n), ctx.device().name.c_str(), error);
  return error < 1e-4 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "document_mask: %s\n", e.what());
  return 2;
}
