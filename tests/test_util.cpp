#include "test_util.hpp"

#include "testing.hpp"
#include "tiling.hpp"
#include "vk.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>

namespace flashvk::test {

namespace {

// llvmpipe (lavapipe's compiler) spends most of a test building pipelines. Without LLVM's
// optimisation passes it builds them about a third faster (46 s against 31 s for a ModifierTest
// case on a cold cache) and runs them slower, which no test times. Mesa's shader cache keeps
// such builds apart from optimised ones. Set before any Vulkan instance, for this process and
// the flashvk and viewer processes the tests start; a GALLIVM_PERF of the environment wins.
[[maybe_unused]] const int kFastBuilds = setenv("GALLIVM_PERF", "nopt", 0);
// And with the kernels' Unroll hints cleared (testing.hpp), leaving unrolling to llvmpipe: the
// same programs, about 3x faster to build again (a sample of 35 cases: 75 s against 240 s on a
// cold cache). Tests of long rows (llvmpipe's loop cap) build the kernels as shipped:
// shipped_kernels_context().
[[maybe_unused]] const bool kFewerUnrolls = [] {
  testing::clear_unroll_hints_on_llvmpipe(true);
  return true;
}();

// The default device as it is (0), with Vulkan's guaranteed minimum limits (1), and with the
// softmax in matrices (2).
std::unique_ptr<Context>& shared_context(int which = 0) {
  static std::unique_ptr<Context> ctx[3];
  return ctx[which];
}

Context& make_shared_context(int which) {
  static std::mutex mutex;  // threads of the concurrency tests may ask first
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Context>& ctx = shared_context(which);
  if (!ctx) {
    ContextOptions options = test_options();
    if (which == 1) options.limits = LimitOverrides::vulkan_minimums();
    if (which == 2) {
      std::vector<DeviceInfo> devices = list_devices();
      options.matrix_api = devices[default_device(devices)].nv_cooperative_matrix2
                               ? MatrixApi::nv2
                               : MatrixApi::emulated_nv2;
    }
    ctx = std::make_unique<Context>(Context::create(options));
  }
  return *ctx;
}

// Destroys the shared context when the tests end rather than in a static destructor at exit,
// where the validation layer's own statics may already be gone.
class SharedContextEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    shared_context(2).reset();
    shared_context(1).reset();
    shared_context(0).reset();
  }
};

[[maybe_unused]] ::testing::Environment* const environment =
    ::testing::AddGlobalTestEnvironment(new SharedContextEnvironment);

}  // namespace

ContextOptions test_options() {
  const char* env = std::getenv("FLASHVK_VALIDATION");
  ContextOptions options;
  options.validation = !(env && std::string(env) == "0");
  return options;
}

Context& context() {
  return make_shared_context(0);
}

Context shipped_kernels_context() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  testing::clear_unroll_hints_on_llvmpipe(false);
  struct Restore {
    ~Restore() { testing::clear_unroll_hints_on_llvmpipe(kFewerUnrolls); }
  } restore;
  return Context::create(test_options());
}

Context& minimum_context() {
  return make_shared_context(1);
}

Context& softmax_matrices_context() {
  return make_shared_context(2);
}


void expect_no_validation_messages(Context& ctx) {
  for (const std::string& m : ctx.take_validation_messages())
    ADD_FAILURE() << "validation layer (a test's own context): " << m;
}

void expect_no_validation_messages() {
  for (const std::string& m : context().take_validation_messages())
    ADD_FAILURE() << "validation layer: " << m;
  if (shared_context(1))
    for (const std::string& m : shared_context(1)->take_validation_messages())
      ADD_FAILURE() << "validation layer (Vulkan's minimum limits): " << m;
  if (shared_context(2))
    for (const std::string& m : shared_context(2)->take_validation_messages())
      ADD_FAILURE() << "validation layer (the softmax in matrices): " << m;
}

HostTensor random_tensor(std::vector<int64_t> shape, uint32_t seed, float scale) {
  HostTensor t(std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (float& x : t.data) x = dist(rng);
  return t;
}

HostTensor round_to_half(const HostTensor& x) {
  HostTensor r = x;
  for (float& v : r.data) v = half_to_float(float_to_half(v));
  return r;
}

HostTensor exact_blocks(std::vector<int64_t> shape, DType format, uint32_t seed) {
  HostTensor t(std::move(shape));
  if (format == DType::f16) return round_to_half(random_tensor(t.shape, seed));
  constexpr int kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int top = format == DType::q5_1 ? 31 : 15;  // the affine formats' quants
  const int widest = format == DType::q8_0 || format == DType::iq4_nl ? 127
                     : format == DType::q4_0                          ? 8
                     : format == DType::q5_0                          ? 16
                                                                      : top + 4;
  int e = 0;
  while (std::ldexp(double(widest), e) > 2.0) --e;  // widest 2^e in (1, 2]
  for (size_t block = 0; block < t.data.size() / 32; ++block) {
    float d0 = std::ldexp(1.0f, e + pick(0, 1));
    int n[32], k = 0;
    int first = pick(0, 31), second = (first + pick(1, 31)) % 32;
    for (int j = 0; j < 32; ++j) {
      switch (format) {
        case DType::q8_0:
          n[j] = j == first ? 127 : pick(-127, 127);
          break;
        case DType::q4_0:
          n[j] = j == first ? -8 : pick(-7, 7);
          break;
        case DType::q5_0:
          n[j] = j == first ? -16 : pick(-15, 15);
          break;
        case DType::iq4_nl:
          n[j] = kIq4nl[j == first ? 0 : pick(1, 15)];
          break;
        default:  // q4_1, q5_1
          if (j == 0) k = pick(-top - 4, -4);
          n[j] = k + (j == first ? 0 : j == second ? top : pick(0, top));
      }
      t.data[block * 32 + size_t(j)] = d0 * float(n[j]);
    }
  }
  return t;
}

float max_abs(const HostTensor& x) {
  float m = 0.0f;
  for (float v : x.data) m = std::max(m, std::abs(v));
  return m;
}

double tolerance(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const AttentionParams& params, double u) {
  Dims d = check_shapes(q.shape, k.shape, v.shape);
  double scale = params.scale ? std::abs(*params.scale) : 1.0 / std::sqrt(double(d.d));
  double score_mag = scale * d.d * max_abs(q) * max_abs(k);  // bounds |scale| sum_c |q_c k_c|
  // ALiBi's bias, slope |diagonal - j|, is at most the largest slope times Nk + Nq.
  for (uint32_t b = 0; b < d.batch; ++b)
    for (uint32_t h = 0; h < d.heads; ++h)
      score_mag = std::max(score_mag, std::abs(double(alibi_slope(params.mods, d.heads, b, h))) *
                                          double(d.nk + d.nq));
  double vmax = std::max(1e-30f, max_abs(v));
  double accumulation = 32.0 * (1.0 + std::log2(double(d.nk)));
  return vmax * u * (4.0 * score_mag + accumulation);
}

double weight_rounding(TileLayout layout, const HostTensor& v) {
  if (layout != TileLayout::cooperative_matrix) return 0.0;
  return std::ldexp(double(max_abs(v)), -10);  // the bound 2^-11 max |v|, with a factor 2
}

DecodeRounding decode_rounding(TileLayout layout, const HostTensor& q, const HostTensor& ks,
                               const HostTensor& vs, const AttentionParams& params) {
  DecodeRounding r;
  if (layout != TileLayout::cooperative_matrix) return r;
  Dims d = check_shapes(q.shape, ks.shape, vs.shape);
  auto moved = [](float x) {  // how far fp16 may put x
    return half_to_float(float_to_half(x)) == x
               ? 0.0
               : std::ldexp(std::abs(double(x)), -10) + std::ldexp(1.0, -24);
  };
  std::vector<double> dk(ks.data.size());
  std::transform(ks.data.begin(), ks.data.end(), dk.begin(), moved);
  double pair_sum = 0.0;
  const uint32_t group = d.heads / d.kv_heads;
  for (uint32_t b = 0; b < d.batch; ++b)
    for (uint32_t h = 0; h < d.heads; ++h)
      for (uint32_t i = 0; i < d.nq; ++i) {
        const float* qi = q.data.data() + ((size_t(b) * d.heads + h) * d.nq + i) * d.d;
        for (uint32_t j = 0; j < d.nk; ++j) {
          const double* kj = dk.data() + ((size_t(b) * d.kv_heads + h / group) * d.nk + j) * d.d;
          double sum = 0.0;
          for (uint32_t c = 0; c < d.d; ++c) sum += std::abs(double(qi[c])) * kj[c];
          pair_sum = std::max(pair_sum, sum);
        }
      }
  double scale = params.scale ? std::abs(*params.scale) : 1.0 / std::sqrt(double(d.d));
  r.lse = scale * pair_sum;
  double v_moved = 0.0;  // the most a value of V moves
  for (float x : vs.data) v_moved = std::max(v_moved, moved(x));
  r.out = max_abs(vs) * std::expm1(2.0 * r.lse) + v_moved;
  return r;
}

double max_error(const std::vector<float>& gpu, const std::vector<double>& ref) {
  if (gpu.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double e = 0.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::isnan(gpu[i])) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::abs(double(gpu[i]) - ref[i]));
  }
  return e;
}

double max_lse_error(const std::vector<float>& gpu, const std::vector<double>& ref) {
  if (gpu.size() != ref.size()) return std::numeric_limits<double>::infinity();
  double e = 0.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::isinf(ref[i]) && ref[i] < 0) {
      if (!(std::isinf(gpu[i]) && gpu[i] < 0)) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (!std::isfinite(gpu[i])) return std::numeric_limits<double>::infinity();
    e = std::max(e, std::abs(double(gpu[i]) - ref[i]) / std::max(1.0, std::abs(ref[i])));
  }
  return e;
}

HostTensor rows_of(const HostTensor& x, int64_t begin, int64_t end) {
  std::vector<int64_t> shape = x.shape;
  int64_t rows = shape[shape.size() - 2], d = shape.back(), n = end - begin;
  shape[shape.size() - 2] = n;
  HostTensor out(shape);
  for (int64_t m = 0; m < x.numel() / (rows * d); ++m)
    std::copy_n(x.data.begin() + (m * rows + begin) * d, n * d, out.data.begin() + m * n * d);
  return out;
}

Dims dims(uint32_t heads, uint32_t kv_heads, uint32_t nq, uint32_t nk, uint32_t d, uint32_t dv) {
  Dims x = check_shapes({1, heads, nq, d}, {1, kv_heads, nk, d}, {1, kv_heads, nk, dv});
  x.kv_rows = x.nk;
  x.kv_keys = uint64_t(x.batch) * x.kv_heads * x.kv_rows;
  return x;
}

MatrixApi matrix_api_of(const DeviceInfo& info) {
  return detail::usable_matrix_api(info, test_options().matrix_api, "tests");
}

std::vector<TileLayout> device_layouts(const DeviceInfo& info, Variant v, uint32_t d,
                                       uint32_t dv) {
  std::vector<TileLayout> l = {TileLayout::automatic};
  if (!variant_info(v).fused) return l;
  l.push_back(TileLayout::shared);
  if (info.subgroup_shuffle && info.texel_buffers && d % 4 == 0 && dv % 4 == 0)
    l.push_back(TileLayout::registers);
  if (d % 4 == 0 && dv % 4 == 0) l.push_back(TileLayout::blocks);
  if (variant_info(v).splits_keys && info.subgroup_shuffle && d % 8 == 0 && dv % 8 == 0)
    l.push_back(TileLayout::lanes);
  // The matrix kernel on the device's units, else emulated (a context's default: it runs where
  // asked for by name), so that CPU drivers run its logic too; where the engine's tiling takes it
  // (the head dimensions, the shared memory).
  if (variant_info(v).matrix) {
    AttentionParams params;
    params.variant = v;
    params.hints.tile_layout = TileLayout::cooperative_matrix;
    Dims shape = dims(1, 1, 16, 64, d, dv);
    try {
      detail::choose_tiling({.info = info,
                             .matrix_api = matrix_api_of(info),
                             .dims = shape,
                             .params = params,
                             .dtype = DType::f16,
                             .kv = Storage(DType::f16)});
      l.push_back(TileLayout::cooperative_matrix);
    } catch (const Error&) {  // not on this device, or not at this shape
    }
  }
  return l;
}

std::vector<TileLayout> device_layouts(Variant v, uint32_t d, uint32_t dv) {
  return device_layouts(context().device(), v, d, dv);
}

void expect_keys_never_read(const HostTensor& q, HostTensor k, HostTensor v, AttentionParams params,
                            uint32_t from, uint32_t to) {
  const int64_t nk = k.shape[k.shape.size() - 2], d = k.shape.back(), dv = v.shape.back();
  HostTensor k_nan = k, v_nan = v;
  for (int64_t m = 0; m < k.numel() / (nk * d); ++m)
    for (int64_t j = from; j < to; ++j) {
      for (int64_t c = 0; c < d; ++c) {
        size_t at = size_t((m * nk + j) * d + c);
        k.data[at] = 0.0f;
        k_nan.data[at] = std::numeric_limits<float>::quiet_NaN();
      }
      for (int64_t c = 0; c < dv; ++c) {
        size_t at = size_t((m * nk + j) * dv + c);
        v.data[at] = 0.0f;
        v_nan.data[at] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  for (TileLayout layout :
       device_layouts(params.variant, static_cast<uint32_t>(d), static_cast<uint32_t>(dv))) {
    bool f16 = layout == TileLayout::cooperative_matrix;
    HostTensor qs = f16 ? round_to_half(q) : q, ks = f16 ? round_to_half(k) : k,
               vs = f16 ? round_to_half(v) : v;
    reference::Result ref = reference::direct(qs, ks, vs, params);
    params.hints.tile_layout = layout;
    HostAttentionResult gpu =
        attention(context(), qs, f16 ? round_to_half(k_nan) : k_nan,
                  f16 ? round_to_half(v_nan) : v_nan, params, f16 ? DType::f16 : DType::f32);
    if (layout != TileLayout::automatic) {
      EXPECT_EQ(gpu.tile_layout, layout);
    }
    EXPECT_LE(max_error(gpu.out.data, ref.out),
              tolerance(qs, ks, vs, params) + weight_rounding(gpu, vs))
        << tile_layout_name(layout);
    EXPECT_LE(max_lse_error(gpu.lse.data, ref.lse), 2e-5) << tile_layout_name(layout);
  }
}

}  // namespace flashvk::test
