// The real `flashvk` command on files the test writes itself: a round trip against the float64
// reference, and one test per class of bad input (exit status, message, no output file).
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <optional>
#include <set>

#include "bench_cases.hpp"
#include "npy.hpp"
#include "pipelines.hpp"
#include "test_util.hpp"

namespace flashvk::test {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string output;  // stdout and stderr
};

// The binary: the build's, or $FLASHVK_CLI where the tests run from another folder (a GPU
// machine's copy: scripts/gpu_check.sh).
std::string cli_binary() {
  const char* moved = std::getenv("FLASHVK_CLI");
  return moved && *moved ? moved : FLASHVK_CLI;
}

Outcome run_cli(const std::string& args) {
  std::string command = cli_binary() + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Outcome o;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) o.output.append(buf, n);
  int raw = pclose(pipe);
  o.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return o;
}

// A .npy image as NumPy writes it (format 1.0, or 2.0 with a 4-byte header length).
std::string npy_bytes(const std::string& descr, const std::string& shape, const std::string& data,
                      int major = 1) {
  std::string header =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t prefix = major == 1 ? 10 : 12;
  header.append((64 - (prefix + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += char(major);
  out += char(0);
  size_t len = header.size();
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += char((len >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string float_data(const HostTensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size() * 4);
}

class CliTest : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() /
          ("flashvk_cli_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  std::string path(const std::string& name) const { return (dir / name).string(); }
  void put(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
  }
  void put_tensor(const std::string& name, const HostTensor& t) const { npy::write(path(name), t); }
  void write_qkv(std::vector<int64_t> q, std::vector<int64_t> k, std::vector<int64_t> v) const {
    put_tensor("q.npy", random_tensor(q, 1));
    put_tensor("k.npy", random_tensor(k, 2));
    put_tensor("v.npy", random_tensor(v, 3));
  }
  std::string qkv() const {
    return "--q " + path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy");
  }
  // The bad-input contract: non-zero exit, one `flashvk: error:` line naming the problem, no
  // output.
  void expect_refused(const std::string& args, const std::string& message) const {
    Outcome o = run_cli(args + " --out " + path("out.npy"));
    EXPECT_NE(o.status, 0) << o.output;
    EXPECT_LT(o.status, 128) << "crashed: " << o.output;
    EXPECT_EQ(o.output.rfind("flashvk: error: ", 0), 0u) << o.output;
    EXPECT_NE(o.output.find(message), std::string::npos)
        << "expected '" << message << "' in: " << o.output;
    EXPECT_EQ(std::count(o.output.begin(), o.output.end(), '\n'), 1) << o.output;
    for (const auto& entry : fs::directory_iterator(dir))
      EXPECT_EQ(entry.path().string().find("out.npy"), std::string::npos)
          << "left behind: " << entry.path();
  }
};

std::string read_text(const std::string& file) {
  std::ifstream in(file);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST_F(CliTest, RunRoundTripMatchesFloat64Reference) {
  HostTensor q = random_tensor({2, 4, 19, 24}, 1), k = random_tensor({2, 2, 33, 24}, 2),
             v = random_tensor({2, 2, 33, 8}, 3);
  put("q.npy", npy_bytes("<f4", "(2, 4, 19, 24)", float_data(q)));
  put("k.npy", npy_bytes("<f4", "(2, 2, 33, 24)", float_data(k), 2));  // format 2.0
  put("v.npy", npy_bytes("<f4", "(2, 2, 33, 8)", float_data(v)));
  for (const char* variant : {"naive", "flashd", "splitkv"}) {
    Outcome o = run_cli("run " + qkv() + " --out " + path("o.npy") + " --lse " + path("lse.npy") +
                        " --causal --scale 0.3 --variant " + variant);
    ASSERT_EQ(o.status, 0) << o.output;
    HostTensor out = npy::read(path("o.npy"), "O"), lse = npy::read(path("lse.npy"), "LSE");
    EXPECT_EQ(out.shape, (std::vector<int64_t>{2, 4, 19, 8}));
    EXPECT_EQ(lse.shape, (std::vector<int64_t>{2, 4, 19}));
    AttentionParams p;
    p.mods.causal = true;
    p.scale = 0.3f;
    reference::Result ref = reference::direct(q, k, v, p);
    EXPECT_LE(max_error(out.data, ref.out), tolerance(q, k, v, p)) << variant;
    EXPECT_LE(max_lse_error(lse.data, ref.lse), 1e-5) << variant;
  }
}

// The modifiers' options reach the engine (window, softcap, ALiBi from max_bias, sinks from a
// file) and the closing line names them; the trace JSON carries them.
TEST_F(CliTest, RunAndTraceTakeTheModifiers) {
  HostTensor q = random_tensor({1, 4, 21, 16}, 1), k = random_tensor({1, 2, 40, 16}, 2),
             v = random_tensor({1, 2, 40, 16}, 3);
  put_tensor("q.npy", q);
  put_tensor("k.npy", k);
  put_tensor("v.npy", v);
  HostTensor sinks({4});
  sinks.data = {0.5f, -1.0f, 2.0f, 0.0f};
  put_tensor("sinks.npy", sinks);
  std::string mods =
      " --window 7,2 --chunk 16 --softcap 2.5 --alibi-max-bias 4 --sinks " + path("sinks.npy");
  Outcome o = run_cli("run " + qkv() + mods + " --out " + path("o.npy") + " --lse " +
                      path("lse.npy") + " --variant flashd");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("window 7,2 chunk 16 softcap 2.5 alibi sinks"), std::string::npos)
      << o.output;
  AttentionParams p;
  p.mods.chunk_size = 16;
  p.mods.window_left = 7;
  p.mods.window_right = 2;
  p.mods.softcap = 2.5f;
  p.mods.alibi_max_bias = 4.0f;
  p.mods.sinks = sinks.data;
  reference::Result ref = reference::direct(q, k, v, p);
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out), tolerance(q, k, v, p));
  EXPECT_LE(max_lse_error(npy::read(path("lse.npy"), "LSE").data, ref.lse), 1e-5);

  o = run_cli("trace " + qkv() + mods + " --row 3 --head 2 --out " + path("t.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  nlohmann::json trace = nlohmann::json::parse(read_text(path("t.json")));
  EXPECT_EQ(trace.at("window"), (std::vector<int>{7, 2}));
  EXPECT_EQ(trace.at("chunk"), 16);
  EXPECT_EQ(trace.at("softcap"), 2.5);
  EXPECT_FLOAT_EQ(trace.at("alibi_slope").get<float>(), alibi_slopes(4, 4.0f)[2]);
  EXPECT_EQ(trace.at("sink"), 2.0);

  // A boolean mask (PyTorch's attn_mask, true attends), [1, 1, Nq, Nk] as NumPy writes it.
  std::string bits;
  std::vector<uint8_t> attend;
  for (int x = 0; x < 21 * 40; ++x) attend.push_back((x * 7) % 5 != 0);
  bits.assign(attend.begin(), attend.end());
  put("mask.npy", npy_bytes("|b1", "(1, 1, 21, 40)", bits));
  o = run_cli("run " + qkv() + " --mask " + path("mask.npy") + " --out " + path("o.npy") +
              " --variant splitkv");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("mask [1, 1, 21, 40]"), std::string::npos) << o.output;
  AttentionParams pm;
  pm.mods.mask = bool_mask(attend, {1, 1, 21, 40});
  reference::Result refm = reference::direct(q, k, v, pm);
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, refm.out), tolerance(q, k, v, pm));
}

// User-written attention from files (flashvk::flex): a relative-position bias read from
// --mod-table and a document mask, in run and trace, against float64 with their C++ twins; a file
// that does not compile is refused in one line naming it, with no output written.
TEST_F(CliTest, RunAndTraceTakeUserFunctions) {
  HostTensor q = random_tensor({1, 2, 21, 16}, 11), k = random_tensor({1, 2, 40, 16}, 12),
             v = random_tensor({1, 2, 40, 16}, 13);
  put_tensor("q.npy", q);
  put_tensor("k.npy", k);
  put_tensor("v.npy", v);
  HostTensor bias({81});
  for (int x = 0; x < 81; ++x) bias.data[size_t(x)] = 0.5f * std::cos(0.2f * float(x));
  put_tensor("bias.npy", bias);
  put("bias.glsl",
      "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
      "  return score + flex_table[kv_idx - (q_idx + FLEX_NK - FLEX_NQ) + 40];\n}\n");
  put("docs.glsl",
      "bool mask_mod(int b, int h, int q_idx, int kv_idx) {\n"
      "  return (q_idx + FLEX_NK - FLEX_NQ) / 13 == kv_idx / 13;\n}\n");
  std::string mods = " --score-mod " + path("bias.glsl") + " --mask-mod " + path("docs.glsl") +
                     " --mod-table " + path("bias.npy");
  Outcome o = run_cli("run " + qkv() + mods + " --out " + path("o.npy") + " --variant flash2");
#ifndef FLASHVK_TEST_FLEX
  EXPECT_NE(o.status, 0);
  GTEST_SKIP() << "flashvk::flex is not built: " << o.output;
#endif
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("score_mod bias.glsl mask_mod docs.glsl table [81]"), std::string::npos)
      << o.output;
  AttentionParams p;
  p.mods.score_mod = p.mods.mask_mod = "given";
  p.mods.score_twin = [&](double s, int, int, int i, int j) {
    return s + double(bias.data[size_t(j - (i + 19) + 40)]);
  };
  p.mods.mask_twin = [](int, int, int i, int j) { return (i + 19) / 13 == j / 13; };
  reference::Result ref = reference::direct(q, k, v, p);
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out), tolerance(q, k, v, p));

  o = run_cli("trace " + qkv() + mods + " --row 3 --head 1 --out " + path("t.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  nlohmann::json trace = nlohmann::json::parse(read_text(path("t.json")));
  EXPECT_EQ(trace.at("score_mod"), "bias.glsl");
  EXPECT_EQ(trace.at("mask_mod"), "docs.glsl");
  const auto& s = trace.at("steps").at("s");
  for (int j = 0; j < 40; ++j)  // row 3 sits on key 22: it sees keys 13..25, its document's
    EXPECT_EQ(s.at(size_t(j)).is_null(), j < 13 || j > 25) << "key " << j;
  // The pipeline report compiles them in: mask_mod's tile pass, then the kernel.
  o = run_cli("pipelines --variant flash2 --nq 21 --nk 40 --d 16 --heads 2" + mods + " --json " +
              path("p.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  nlohmann::json report = nlohmann::json::parse(read_text(path("p.json")));
  ASSERT_EQ(report.at("pipelines").size(), 2u) << o.output;
  EXPECT_EQ(report["pipelines"][0].at("shader"), "flex_tiles+flex");
  EXPECT_EQ(report["pipelines"][1].at("program"), "flash2");

  put("bad.glsl",
      "float score_mod(float score, int b, int h, int q_idx, int kv_idx) {\n"
      "  return score + missing_bias;\n}\n");
  o = run_cli("run " + qkv() + " --score-mod " + path("bad.glsl") + " --out " + path("bad.npy"));
  EXPECT_EQ(o.status, 1) << o.output;
  EXPECT_NE(o.output.find("bad.glsl:2: 'missing_bias' : undeclared identifier"), std::string::npos)
      << o.output;
  EXPECT_FALSE(fs::exists(path("bad.npy")));
  // A table of another type than float32.
  put("ints.npy", npy_bytes("<i4", "(2,)", std::string(8, '\1')));
  o = run_cli("run " + qkv() + " --mask-mod " + path("docs.glsl") + " --mod-table " +
              path("ints.npy") + " --out " + path("bad.npy"));
  EXPECT_EQ(o.status, 1) << o.output;
  EXPECT_NE(o.output.find("unsupported dtype '<i4'"), std::string::npos) << o.output;
  EXPECT_FALSE(fs::exists(path("bad.npy")));
  o = run_cli("run " + qkv() + " --mask-mod " + path("nowhere.glsl") + " --out " + path("bad.npy"));
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("cannot read"), std::string::npos) << o.output;
}

// --layout, --block-rows and --block-keys reach the engine; the closing line names the tiling
// that ran, and a layout the variant cannot use is refused without an output file.
TEST_F(CliTest, RunTakesTheTilingAndNamesIt) {
  HostTensor q = random_tensor({1, 2, 19, 8}, 7), k = random_tensor({1, 2, 45, 8}, 8),
             v = random_tensor({1, 2, 45, 8}, 9);
  put("q.npy", npy_bytes("<f4", "(1, 2, 19, 8)", float_data(q)));
  put("k.npy", npy_bytes("<f4", "(1, 2, 45, 8)", float_data(k)));
  put("v.npy", npy_bytes("<f4", "(1, 2, 45, 8)", float_data(v)));
  Outcome o = run_cli("run " + qkv() + " --out " + path("o.npy") +
                      " --variant splitkv --layout shared --block-rows 32 --block-keys 16 "
                      "--splits 3");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("splitkv (f32, shared 32x16, 3 splits)"), std::string::npos) << o.output;
  reference::Result ref = reference::direct(q, k, v, {});
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out), tolerance(q, k, v, {}));

  Outcome naive =
      run_cli("run " + qkv() + " --out " + path("n.npy") + " --variant naive --layout registers");
  EXPECT_EQ(naive.status, 1) << naive.output;
  EXPECT_NE(naive.output.find("tile_layout registers applies to the fused variants"),
            std::string::npos)
      << naive.output;
  EXPECT_FALSE(fs::exists(path("n.npy")));
  Outcome bad = run_cli("run " + qkv() + " --out " + path("n.npy") + " --layout diagonal");
  EXPECT_EQ(bad.status, 2) << bad.output;
}

// --fp16-arithmetic reaches the engine: on inputs that are multiples of 1/2, whose fp16 products
// and their runs are exact, O is within P's rounding and the P V runs of the float64 reference
// (tests/fp16_arithmetic_test.cpp has the bound); a layout without fp16 products is refused, and
// so, on a device without shaderFloat16, is the option itself.
TEST_F(CliTest, RunTakesFp16Arithmetic) {
  auto halves = [](std::vector<int64_t> shape, uint32_t seed) {
    HostTensor t = random_tensor(std::move(shape), seed);
    for (float& x : t.data) x = 0.5f * std::clamp(std::round(2.0f * x), -2.0f, 2.0f);
    return t;
  };
  HostTensor q = halves({1, 4, 30, 32}, 1), k = halves({1, 2, 70, 32}, 2),
             v = halves({1, 2, 70, 32}, 3);
  put_tensor("q.npy", q);
  put_tensor("k.npy", k);
  put_tensor("v.npy", v);
  expect_refused("run " + qkv() + " --fp16-arithmetic --layout shared",
                 "fp16_arithmetic runs in tile_layout blocks or cooperative_matrix, not shared");
  if (!context().device().fp16_arithmetic) {
    expect_refused("run " + qkv() + " --fp16-arithmetic", "shaderFloat16");
    return;
  }
  Outcome o = run_cli("run " + qkv() + " --out " + path("o.npy") + " --causal --fp16-arithmetic");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("fp16 arithmetic"), std::string::npos) << o.output;
  AttentionParams p;
  p.mods.causal = true;
  reference::Result ref = reference::direct(q, k, v, p);
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out),
            tolerance(q, k, v, p) + 9.0 / 2048 * max_abs(v));
}

TEST_F(CliTest, RunReadsFloat16Inputs) {
  HostTensor q = round_to_half(random_tensor({5, 8}, 4)),
             k = round_to_half(random_tensor({9, 8}, 5));
  auto half_data = [](const HostTensor& t) {
    std::string s;
    for (float x : t.data) {
      uint16_t h = float_to_half(x);
      s.append(reinterpret_cast<const char*>(&h), 2);
    }
    return s;
  };
  put("q.npy", npy_bytes("<f2", "(5, 8)", half_data(q)));
  put("k.npy", npy_bytes("<f2", "(9, 8)", half_data(k)));
  put("v.npy", npy_bytes("<f2", "(9, 8)", half_data(k)));
  Outcome o = run_cli("run " + qkv() + " --out " + path("o.npy") + " --dtype f16");
  ASSERT_EQ(o.status, 0) << o.output;
  reference::Result ref = reference::direct(q, k, k, {});
  EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out), tolerance(q, k, k, {}));
}

// --kv-dtype stores K and V quantised: the output matches the float64 reference on the values
// K and V hold once stored, the summary line names the storage, and a head dim that is not
// whole blocks of 32 is refused in one line.
TEST_F(CliTest, RunStoresKAndVInTheKvDtype) {
  HostTensor q = random_tensor({1, 4, 5, 64}, 1), k = random_tensor({1, 2, 70, 64}, 2),
             v = random_tensor({1, 2, 70, 32}, 3);
  put_tensor("q.npy", q);
  put_tensor("k.npy", k);
  put_tensor("v.npy", v);
  AttentionParams params;
  params.mods.causal = true;
  for (const char* kv : {"q4_0", "q5_1"}) {
    Outcome o = run_cli("run " + qkv() + " --out " + path("o.npy") + " --kv-dtype " + kv +
                        " --causal");
    ASSERT_EQ(o.status, 0) << o.output;
    EXPECT_NE(o.output.find(std::string("f32/") + kv), std::string::npos) << o.output;
    HostTensor ks = stored_values(k, parse_dtype(kv)), vs = stored_values(v, parse_dtype(kv));
    reference::Result ref = reference::direct(q, ks, vs, params);
    EXPECT_LE(max_error(npy::read(path("o.npy"), "O").data, ref.out),
              tolerance(q, ks, vs, params))
        << kv;
  }
  write_qkv({1, 2, 4, 8}, {1, 2, 6, 8}, {1, 2, 6, 8});
  expect_refused("run " + qkv() + " --kv-dtype q8_0", "blocks of 32");
  expect_refused("run " + qkv() + " --kv-dtype q6_k", "--kv-dtype: unknown dtype 'q6_k'");
  expect_refused("run " + qkv() + " --dtype bf16", "--dtype must be f32 or f16");
}

TEST_F(CliTest, TraceWritesJsonWithStepsAndTiles) {
  write_qkv({1, 2, 6, 8}, {1, 2, 70, 8}, {1, 2, 70, 8});
  Outcome o =
      run_cli("trace " + qkv() + " --row 4 --head 1 --variant flash2 --out " + path("t.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  nlohmann::json t = nlohmann::json::parse(read_text(path("t.json")));  // valid JSON
  EXPECT_EQ(t.at("variant"), "flash2");
  EXPECT_EQ(t.at("row"), 4);
  EXPECT_EQ(t.at("head"), 1);
  EXPECT_EQ(t.at("keys"), 70);
  EXPECT_EQ(t.at("steps").at("s").size(), 70u);
  EXPECT_EQ(t.at("tiles").at("size").get<uint32_t>() * t.at("tiles").at("m").size() >= 70, true);
  EXPECT_EQ(t.at("out").size(), 8u);
  EXPECT_TRUE(t.at("lse").is_number());
}

TEST_F(CliTest, DevicesAndHelp) {
  Outcome o = run_cli("devices");
  EXPECT_EQ(o.status, 0);
  EXPECT_NE(o.output.find("[default]"), std::string::npos);
  EXPECT_NE(o.output.find("cooperative matrices (fp16 into fp32) "), std::string::npos);
  for (const char* verb : {"run", "trace", "bench", "devices"}) {
    Outcome h = run_cli(std::string(verb) + " --help");
    EXPECT_EQ(h.status, 0) << verb;
    EXPECT_NE(h.output.find("usage: flashvk"), std::string::npos) << verb;
  }
}

using Json = nlohmann::ordered_json;

Json read_json(const std::string& file) {
  return Json::parse(read_text(file));
}

// The first row of bench JSON's results for `variant` (an empty object if there is none).
Json row_of(const Json& j, const std::string& variant) {
  for (const Json& r : j.at("results"))
    if (r.at("variant") == variant) return r;
  return Json::object();
}

// The runs_ms of the row of `variant` in bench JSON (the first such row).
std::vector<double> runs_of(const Json& j, const std::string& variant) {
  return row_of(j, variant).value("runs_ms", std::vector<double>{});
}

TEST_F(CliTest, BenchPrintsATableAndJson) {
  Outcome o = run_cli("bench --variant flash2 --heads 2 --nq 40 --nk 50 --d 16 --repeat 1 --json " +
                      path("b.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("flash2"), std::string::npos);
  EXPECT_TRUE(fs::exists(path("b.json")));
  Json json = read_json(path("b.json"));
  const Json& row = json.at("results").at(0);
  // The layout that ran and its tiles are named in the table's last column and in the JSON: the
  // ones the library runs for that shape on this device (on a CPU register tiles, as many keys
  // as a subgroup has lanes).
  AttentionParams params;
  params.variant = Variant::flash2;
  HostAttentionResult lib = attention(context(), random_tensor({1, 2, 40, 16}, 1),
                                      random_tensor({1, 2, 50, 16}, 2),
                                      random_tensor({1, 2, 50, 16}, 3), params);
  std::string layout = tile_layout_name(lib.tile_layout);
  EXPECT_EQ(row.at("tile_layout"), layout) << json;
  int rows = row.at("block_rows"), keys = row.at("block_keys");
  EXPECT_EQ(uint32_t(rows), lib.block_rows) << json;
  EXPECT_EQ(uint32_t(keys), lib.block_keys) << json;
  if (context().device().type == "cpu") {
    EXPECT_EQ(layout, "registers");
    EXPECT_EQ(uint32_t(keys), context().device().subgroup_size) << json;
  }
  EXPECT_GT(rows, 0) << json;
  std::string tiles = "  " + layout + " " + std::to_string(rows) + "x" + std::to_string(keys) + "\n";
  EXPECT_NE(o.output.find(tiles), std::string::npos) << tiles << o.output;
  // The time column is the JSON's median in us or ms; into a pipe there is no progress line.
  EXPECT_NE(o.output.find(" " + cli::time_text(row.at("ms").get<double>()) + " "),
            std::string::npos)
      << o.output;
  EXPECT_EQ(o.output.find("round 1"), std::string::npos) << o.output;
}

// Short times read in microseconds to 10 ns, long ones in milliseconds to 1 us.
TEST(BenchTable, TimesKeepTheirDigits) {
  EXPECT_EQ(cli::time_text(0.04512), "45.12 us");
  EXPECT_EQ(cli::time_text(0.054), "54.00 us");
  EXPECT_EQ(cli::time_text(0.99999), "999.99 us");
  EXPECT_EQ(cli::time_text(2.41), "2.410 ms");
  EXPECT_EQ(cli::time_text(52184.02), "52184.020 ms");
}

// A row's spread: its slowest run over its fastest, runs that timed nothing left out (bench notes
// rows past kUnsteadySpread: clocks that changed while they ran).
TEST(BenchTable, SpreadIsTheSlowestRunOverTheFastest) {
  cli::Row row{};
  EXPECT_EQ(row.spread(), 0.0);
  for (double ms : {0.357, 0.0, 1.708, 0.356, 1.855}) row.runs.push_back({ms, 0.0});
  EXPECT_DOUBLE_EQ(row.spread(), 1.855 / 0.356);
  EXPECT_GT(row.spread(), cli::kUnsteadySpread);
  row.runs = {{0.5, 0.0}, {0.6, 0.0}};
  EXPECT_DOUBLE_EQ(row.spread(), 1.2);
}

// --decode-loop: a cache of 48 tokens filled one a step; no Vulkan object after the first step,
// the JSON holds a GPU and host time for every step, and options that make no sense for it are
// refused by name.
TEST_F(CliTest, BenchDecodeLoopCountsObjectsAndTimesEveryStep) {
  Outcome o = run_cli(
      "bench --decode-loop --nk 48 --heads 4 --kv-heads 2 --d 32 --rope half "
      "--window 20,0 --json " +
      path("loop.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("48 steps of one token, H=4 Hkv=2 d=32 dv=32, f32, splitkv"),
            std::string::npos)
      << o.output;
  EXPECT_NE(o.output.find("after the first step: 0 Vulkan objects created, device memory +0 bytes"),
            std::string::npos)
      << o.output;
  Json json = read_json(path("loop.json"));
  const Json& loop = json.at("decode_loop");
  EXPECT_EQ(loop.at("steps"), 48);
  EXPECT_EQ(loop.at("rope"), "half");
  EXPECT_EQ(loop.at("objects_created_after_first_step"), 0);
  EXPECT_EQ(loop.at("host_us").size(), 48u);
  EXPECT_EQ(loop.at("gpu_ms").size(), 48u);
  if (context().device().timestamps) {
    EXPECT_GT(double(loop.at("gpu_ms_last")), 0.0) << loop;
    EXPECT_GT(double(loop.at("gpu_ms_one_attention")), 0.0) << loop;
  }
  for (const char* bad : {"--nq 4", "--causal", "--kv-dtype bf16", "--rope sideways"}) {
    Outcome refused = run_cli(std::string("bench --decode-loop --nk 8 --d 32 ") + bad);
    EXPECT_EQ(refused.status, 2) << bad << ": " << refused.output;
    EXPECT_EQ(refused.output.rfind("flashvk: error: ", 0), 0u) << refused.output;
  }
  Outcome quantised = run_cli(
      "bench --decode-loop --nk 16 --heads 2 --kv-heads 1 --d 32 "
      "--kv-dtype q4_0 --rope interleaved");
  ASSERT_EQ(quantised.status, 0) << quantised.output;
  EXPECT_NE(quantised.output.find("f32/q4_0, splitkv"), std::string::npos) << quantised.output;
  Outcome rope_alone = run_cli("bench --rope half --nq 8 --d 16");
  EXPECT_EQ(rope_alone.status, 2) << rope_alone.output;
  EXPECT_NE(rope_alone.output.find("--rope is for --decode-loop"), std::string::npos);
}

// --block-rows, --block-keys and --splits tune one shape: the tiling asked for runs and is
// reported; one the device cannot hold is refused before any table, by the engine's message.
TEST_F(CliTest, BenchTileSizesAreTunable) {
  Outcome o = run_cli(
      "bench --variant splitkv --nq 40 --nk 100 --d 16 --repeat 1 --layout shared --block-rows 32 "
      "--block-keys 16 --splits 3 --json " +
      path("t.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("  shared 32x16, 3 splits\n"), std::string::npos) << o.output;
  Json row = read_json(path("t.json")).at("results").at(0);
  EXPECT_EQ(row.at("block_rows"), 32) << row;
  EXPECT_EQ(row.at("block_keys"), 16) << row;
  EXPECT_EQ(row.at("splits"), 3) << row;

  uint32_t too_many = context().device().max_shared_memory / 128 + 1;  // 2 * 16 floats a key
  Outcome big = run_cli("bench --nq 8 --d 16 --layout shared --block-keys " +
                        std::to_string(too_many) + " --json " + path("x.json"));
  EXPECT_EQ(big.status, 1) << big.output;
  EXPECT_EQ(big.output.rfind("flashvk: error: block_keys " + std::to_string(too_many), 0), 0u)
      << big.output;
  EXPECT_FALSE(fs::exists(path("x.json")));
  // The matrix kernel's tiles (emulated where the device has no matrix units), as
  // gpu_bench.sh's sweep asks for them; a size that does not fit is refused in the words the
  // sweep reads.
  Outcome cm = run_cli(
      "bench --variant flash2 --nq 40 --d 16 --dtype f16 --repeat 1 "
      "--layout coopmat --block-keys 16");
  ASSERT_EQ(cm.status, 0) << cm.output;
  EXPECT_NE(cm.output.find("  cooperative_matrix 64x16"), std::string::npos) << cm.output;
  Outcome two = run_cli(
      "bench --variant flash2 --nq 40 --d 16 --dtype f16 --repeat 1 --check "
      "--layout coopmat --block-keys 16 --group-rows 32 --json " +
      path("g.json"));
  ASSERT_EQ(two.status, 0) << two.output;
  EXPECT_NE(two.output.find("  cooperative_matrix 128x16, 32 rows a group"), std::string::npos)
      << two.output;
  EXPECT_EQ(read_json(path("g.json")).at("results").at(0).at("group_rows"), 32);
  // (at d = 256, 64 keys' K and V^T tiles alone take 69 KiB; the engine uses 48 KiB at most)
  Outcome cm_big = run_cli(
      "bench --variant flash2 --nq 8 --d 256 --dtype f16 --layout coopmat "
      "--block-keys 64 --json " +
      path("y.json"));
  EXPECT_EQ(cm_big.status, 1) << cm_big.output;
  EXPECT_NE(cm_big.output.find("bytes of shared memory with 64 keys a tile"), std::string::npos)
      << cm_big.output;
  EXPECT_FALSE(fs::exists(path("y.json")));
  Outcome suite = run_cli("bench --suite standard --block-rows 32");
  EXPECT_EQ(suite.status, 2) << suite.output;
  EXPECT_NE(suite.output.find("drop --block-rows"), std::string::npos) << suite.output;
}

// --layout is checked; the cooperative-matrix layout runs on the matrix units where the device
// has them, else emulated (the tiles column says so), and is refused by name (exit 1, before any
// table) with --matrix-api none; --matrix-api is checked, nv2 refused where the device lacks it.
TEST_F(CliTest, BenchLayoutIsCheckedAndTheMatrixLayoutRefusedWithoutMatrices) {
  Outcome bad = run_cli("bench --nq 8 --d 16 --layout sideways");
  EXPECT_EQ(bad.status, 2) << bad.output;
  EXPECT_NE(bad.output.find("--layout must be auto, shared, registers, coopmat, lanes or blocks"),
            std::string::npos)
      << bad.output;
  // --check compares with float64 on the fp32 inputs: the error is their rounding to fp16 and
  // P's, about 2^-11 of max |v| (standard normal inputs, fixed seeds: max |v| under 5 here).
  Outcome o = run_cli(
      "bench --variant flash2 --nq 40 --d 16 --dtype f16 --layout coopmat --repeat 1 --check "
      "--json " +
      path("coopmat.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  bool units = context().device().cooperative_matrix;
  EXPECT_NE(o.output.find(units ? "  cooperative_matrix 64x" : ", emulated\n"), std::string::npos)
      << o.output;
  double err = read_json(path("coopmat.json")).at("results").at(0).at("max_err");
  EXPECT_LT(err, 5.0 / 2048) << o.output;
  Outcome none = run_cli("bench --variant flash2 --nq 40 --d 16 --dtype f16 --layout coopmat "
                         "--matrix-api none");
  EXPECT_EQ(none.status, 1) << none.output;
  EXPECT_EQ(none.output.rfind("flashvk: error: --layout coopmat needs cooperative matrices", 0),
            0u)
      << none.output;
  // A layout a variant of the list cannot run (the default list: every variant) is refused
  // before the table, in the engine's words.
  Outcome lanes = run_cli("bench --nq 1 --nk 64 --d 16 --layout lanes");
  EXPECT_EQ(lanes.status, 1) << lanes.output;
  EXPECT_EQ(lanes.output.rfind("flashvk: error: tile_layout lanes runs splitkv", 0), 0u)
      << lanes.output;
  Outcome api = run_cli("bench --nq 8 --d 16 --matrix-api tensor");
  EXPECT_EQ(api.status, 2) << api.output;
  EXPECT_NE(api.output.find("--matrix-api must be auto, khr, nv, nv2, emulated, emulated-nv2 or "
                            "none, got 'tensor'"),
            std::string::npos)
      << api.output;
  // The kernel that keeps the softmax in matrices: on NVIDIA's second extension where the device
  // has it, else refused by name; emulated anywhere.
  Outcome nv2 = run_cli("bench --variant flash2 --nq 40 --d 16 --dtype f16 --matrix-api nv2 "
                        "--repeat 1 --check");
  if (context().device().nv_cooperative_matrix2) {
    EXPECT_EQ(nv2.status, 0) << nv2.output;
  } else {
    EXPECT_EQ(nv2.status, 1) << nv2.output;
    EXPECT_NE(nv2.output.find("matrix_api nv2, but"), std::string::npos) << nv2.output;
  }
  Outcome emu = run_cli(
      "bench --variant flash2 --nq 40 --d 16 --dtype f16 --layout coopmat --matrix-api "
      "emulated-nv2 --repeat 1 --check --json " +
      path("emunv2.json"));
  ASSERT_EQ(emu.status, 0) << emu.output;
  EXPECT_NE(emu.output.find(", emulated\n"), std::string::npos) << emu.output;
  EXPECT_LT(read_json(path("emunv2.json")).at("results").at(0).at("max_err").get<double>(),
            5.0 / 2048)
      << emu.output;
}

// --peak and --check: the figures in the JSON agree with each other and with the shape's FLOPs.
TEST_F(CliTest, BenchPeakAndCheckFiguresAreConsistent) {
  Outcome o = run_cli(
      "bench --variant flash2 --heads 2 --nq 40 --nk 50 --d 16 --repeat 1 --peak --check "
      "--json " +
      path("p.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("of peak"), std::string::npos);
  Json json = read_json(path("p.json"));
  const Json& row = json.at("results").at(0);
  double ms = row.at("ms"), gflops = row.at("gflops");
  double peak = row.at("peak_gflops"), fraction = row.at("peak_fraction");
  EXPECT_GT(json.at("peak").at("fma_gflops").get<double>(), 0.0);
  EXPECT_GT(json.at("peak").at("bandwidth_gbs").get<double>(), 0.0);
  ASSERT_GT(ms, 0.0);
  EXPECT_NEAR(gflops, 4.0 * 2 * 40 * 50 * 16 / (ms * 1e6), 1e-3 * gflops);
  ASSERT_GT(peak, 0.0);
  EXPECT_NEAR(fraction, gflops / peak, 1e-3 * fraction);
  EXPECT_LT(row.at("max_err").get<double>(), 1e-5);
}

double median_of(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  size_t h = x.size() / 2;
  return x.size() % 2 ? x[h] : 0.5 * (x[h - 1] + x[h]);
}

// Variants run in rounds: each reports every run, its time is their median, and vs_flash2 the
// median of its run-by-run ratios to flash2's runs; --warm-cache turns the flush off.
TEST_F(CliTest, BenchReportsRunsAndRoundByRoundRatios) {
  Outcome o =
      run_cli("bench --heads 2 --nq 24 --d 8 --repeat 3 --warm-cache --json " + path("r.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  Json json = read_json(path("r.json"));
  EXPECT_EQ(json.at("runs"), 3);
  EXPECT_EQ(json.at("min_time"), 0);
  EXPECT_EQ(json.at("flashd_rounds"), 0);
  EXPECT_EQ(json.at("cache_flush"), false);
  std::vector<double> base = runs_of(json, "flash2");
  ASSERT_EQ(base.size(), 3u);
  EXPECT_DOUBLE_EQ(row_of(json, "flash2").at("vs_flash2").get<double>(), 1.0);
  for (const char* variant : {"naive", "online", "flash1", "flashd", "splitkv"}) {
    Json row = row_of(json, variant);
    std::vector<double> runs = runs_of(json, variant);
    ASSERT_EQ(runs.size(), 3u) << variant;
    EXPECT_NEAR(row.at("ms").get<double>(), median_of(runs), 1e-5 * median_of(runs)) << variant;
    std::vector<double> ratio;
    for (size_t i = 0; i < runs.size(); ++i) ratio.push_back(runs[i] / base[i]);
    EXPECT_NEAR(row.at("vs_flash2").get<double>(), median_of(ratio), 1e-3 * median_of(ratio))
        << variant;
  }
}

// --variant takes a list: exactly those variants run, in that order, and flash2 among them is
// the base of the others' ratios. A name given twice or unknown is a usage error.
TEST_F(CliTest, BenchRunsTheVariantsListed) {
  Outcome o =
      run_cli("bench --variant flashd,flash2 --nq 24 --d 8 --repeat 2 --json " + path("l.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  Json json = read_json(path("l.json"));
  std::vector<std::string> order;  // exactly the variants listed, in that order
  for (const Json& r : json.at("results")) order.push_back(r.at("variant"));
  EXPECT_EQ(order, (std::vector<std::string>{"flashd", "flash2"})) << json;
  std::vector<double> d = runs_of(json, "flashd");
  std::vector<double> base = runs_of(json, "flash2");
  ASSERT_EQ(d.size(), 2u);
  ASSERT_EQ(base.size(), 2u);
  EXPECT_NEAR(row_of(json, "flashd").at("vs_flash2").get<double>(),
              median_of({d[0] / base[0], d[1] / base[1]}), 1e-3);

  Outcome twice = run_cli("bench --variant flash2,flash2 --nq 8 --d 8");
  EXPECT_EQ(twice.status, 2) << twice.output;
  EXPECT_NE(twice.output.find("'flash2' is named twice"), std::string::npos) << twice.output;
  Outcome unknown = run_cli("bench --variant flash2,flash9 --nq 8 --d 8");
  EXPECT_EQ(unknown.status, 2) << unknown.output;
  EXPECT_NE(unknown.output.find("--variant: "), std::string::npos) << unknown.output;
  Outcome empty = run_cli("bench --variant flash2, --nq 8 --d 8");
  EXPECT_EQ(empty.status, 2) << empty.output;
}

// Runs `bench <options> --warm-cache --json <file>` and returns the JSON.
Json bench_json(const std::string& options, const std::string& file) {
  Outcome o = run_cli("bench " + options + " --warm-cache --json " + file);
  EXPECT_EQ(o.status, 0) << o.output;
  return o.status == 0 ? read_json(file) : Json::object();
}

// A usage error (exit status 2) whose message names `option`.
void expect_usage_error(const std::string& args, const std::string& option) {
  Outcome o = run_cli(args);
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find(option), std::string::npos) << o.output;
}

// --min-time: a variant whose first run is short runs more rounds, ceil(min-time / first run)
// but at least --repeat and at most 100, and flash2 as many as the most, so every ratio pairs.
TEST_F(CliTest, BenchAddsRoundsForShortRunsUpToTheMinTime) {
  Json json = bench_json("--variant flashd,naive,flash2 --nq 96 --d 16 --repeat 2 --min-time 0.01",
                         path("m.json"));
  EXPECT_EQ(json.value("min_time", 0.0), 0.01) << json;
  size_t most = 0;
  for (const char* variant : {"flashd", "naive"}) {
    std::vector<double> runs = runs_of(json, variant);
    ASSERT_FALSE(runs.empty()) << variant;
    double wanted = std::ceil(10.0 / runs[0]);
    EXPECT_EQ(double(runs.size()), std::clamp(wanted, 2.0, 100.0)) << variant << " " << runs[0];
    most = std::max(most, runs.size());
  }
  std::vector<double> base = runs_of(json, "flash2");
  EXPECT_GE(base.size(), most);
  EXPECT_GE(double(base.size()), std::clamp(std::ceil(10.0 / base[0]), 2.0, 100.0));

  expect_usage_error("bench --nq 8 --d 8 --min-time -1", "--min-time");
}

// --flashd-rounds: flashd and flash2 run at least that many rounds (the ratio's pairs), the
// other variants --repeat.
TEST_F(CliTest, BenchGivesFlashdAndFlash2AtLeastTheFlashdRounds) {
  Json json = bench_json("--variant naive,flashd,flash2 --nq 16 --d 8 --repeat 2 --flashd-rounds 5",
                         path("f.json"));
  EXPECT_EQ(json.value("flashd_rounds", 0), 5) << json;
  EXPECT_EQ(runs_of(json, "naive").size(), 2u);
  EXPECT_EQ(runs_of(json, "flashd").size(), 5u);
  EXPECT_EQ(runs_of(json, "flash2").size(), 5u);

  Json alone =
      bench_json("--variant flash2 --nq 16 --d 8 --repeat 1 --flashd-rounds 3", path("f2.json"));
  EXPECT_EQ(runs_of(alone, "flash2").size(), 3u);

  expect_usage_error("bench --nq 8 --d 8 --flashd-rounds -1", "--flashd-rounds");
}

// --gpu-warm: its value is in the JSON (by default 0 on CPU drivers, 1 on GPUs), and a negative
// one is a usage error.
TEST_F(CliTest, BenchWarmsGpusUpAndSaysHowLong) {
  Json json = bench_json("--variant flash2 --nq 16 --d 8 --repeat 1", path("w.json"));
  bool cpu = context().device().type == "cpu";
  EXPECT_EQ(json.value("gpu_warm", -1.0), cpu ? 0.0 : 1.0) << json;
  Json warmed =
      bench_json("--variant flash2 --nq 16 --d 8 --repeat 1 --gpu-warm 0.05", path("w2.json"));
  EXPECT_EQ(warmed.value("gpu_warm", -1.0), 0.05) << warmed;
  expect_usage_error("bench --nq 8 --d 8 --gpu-warm -1", "--gpu-warm");
}

// A bench row's vs_base: the median of its run-by-run time ratios to its base row's runs.
void expect_vs_base(const Json& row, const Json& base, const std::string& what) {
  std::vector<double> runs = row.at("runs_ms"), base_runs = base.at("runs_ms");
  ASSERT_EQ(runs.size(), base_runs.size()) << what;
  std::vector<double> ratio;
  for (size_t k = 0; k < runs.size(); ++k) ratio.push_back(runs[k] / base_runs[k]);
  EXPECT_NEAR(row.at("vs_base").get<double>(), median_of(ratio), 1e-3 * median_of(ratio)) << what;
}

// --suite modifiers: its shape in causal attention (the base), then with chunks of Nk/8 keys,
// softcap, (with flashvk::flex) ALiBi as a score_mod and a document mask_mod, ALiBi, sinks, a mask
// of the causal pattern in --causal's place and a sparse mask, in that order and in the same
// rounds: a row's vs_base is the median of its run-by-run ratios to the base's runs of its variant.
// The causal mask hides what causal attention hides (bottom-right aligned: its GFLOP/s counts the
// same pairs), the sparse one all but the first Nk/32 keys and Nk/8 up to the diagonal; the options
// the suite sets itself are refused.
TEST_F(CliTest, BenchSuiteModifiersRunsEachModifierBesideItsBase) {
  const int nq = 8, nk = 64, heads = 2, d = 8;
  Json json = bench_json(
      "--suite modifiers --variant flash2 --heads 2 --nq 8 --nk 64 --d 8 "
      "--repeat 3",
      path("mod.json"));
  const Json& rows = json.at("results");
  // With flashvk::flex, ALiBi as a score_mod and documents of Nk/8 keys as a mask_mod follow
  // softcap (causal within each document: the chunks' pairs).
#ifdef FLASHVK_TEST_FLEX
  const size_t u = 2;
#else
  const size_t u = 0;
#endif
  ASSERT_EQ(rows.size(), 7u + u) << json;
  // Pairs of causal attention, bottom-right aligned: query i sees keys 0 .. i + Nk - Nq; of the
  // chunks, those of them in the last one's chunk of 8; of the sparse mask, those below 2 or
  // above the last less 8.
  double causal_pairs = 0, chunk_pairs = 0, sparse_pairs = 0;
  for (int i = 0; i < nq; ++i)
    for (int j = 0, last = i + nk - nq; j <= last; ++j) {
      causal_pairs += 1;
      chunk_pairs += j / 8 == last / 8 ? 1 : 0;
      sparse_pairs += j < 2 || j > last - 8 ? 1 : 0;
    }
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& r = rows[i];
    bool score_mod = u && i == 3, mask_mod = u && i == 4;
    double pairs = i == 1 || mask_mod ? chunk_pairs : i == 6 + u ? sparse_pairs : causal_pairs;
    EXPECT_EQ(r.at("kind"), "modifier");
    EXPECT_EQ(r.at("variant"), "flash2");
    EXPECT_EQ(r.at("causal"), i < 5 + u) << i;
    EXPECT_EQ(r.at("chunk"), i == 1 ? 8 : 0) << i;
    EXPECT_EQ(r.at("softcap").get<double>(), i == 2 ? 30.0 : 0.0) << i;
    EXPECT_EQ(r.at("score_mod"), score_mod ? Json("alibi.glsl") : Json()) << i;
    EXPECT_EQ(r.at("mask_mod"), mask_mod ? Json("documents.glsl") : Json()) << i;
    EXPECT_EQ(r.at("alibi"), i == 3 + u) << i;
    EXPECT_EQ(r.at("sinks"), i == 4 + u) << i;
    EXPECT_EQ(r.at("mask"), i >= 5 + u) << i;
    EXPECT_EQ(r.value("mask_name", ""), i == 5 + u   ? "causal"
                                        : i == 6 + u ? "2 global + window 8"
                                                     : "")
        << i;
    EXPECT_EQ(r.at("runs_ms").size(), 3u) << i;
    expect_vs_base(r, rows[0], std::to_string(i));
    double flops = r.at("gflops").get<double>() * r.at("ms").get<double>() * 1e6;
    EXPECT_NEAR(flops, 4.0 * heads * pairs * d, 1e-3 * flops) << i;
  }
  EXPECT_DOUBLE_EQ(rows[0].at("vs_base").get<double>(), 1.0);

  Outcome table = run_cli("bench --suite modifiers --variant flashd --nq 8 --d 8 --repeat 1");
  ASSERT_EQ(table.status, 0) << table.output;
  EXPECT_NE(table.output.find("vs base"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("causal softcap 30"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("causal chunk 1 "), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("mask (causal)"), std::string::npos) << table.output;
  EXPECT_NE(table.output.find("mask (0 global + window 1)"), std::string::npos) << table.output;

  expect_usage_error("bench --suite modifiers --softcap 5", "drop --softcap");
  expect_usage_error("bench --suite modifiers --causal", "drop --causal");
  expect_usage_error("bench --suite standard --causal", "drop --causal");
  expect_usage_error("bench --suite everything", "'standard' or 'modifiers'");
}

// bench --kv-dtype f16,q8_0,q4_0: the shape once per storage of K and V, in that order and in the
// same rounds, each row's vs_base the median of its run-by-run ratios to the first storage's
// runs of its variant; a storage named twice is a usage error, and run takes one.
TEST_F(CliTest, BenchTimesEachKvStorageBesideTheFirst) {
  Json json = bench_json(
      "--variant flash2,splitkv --nq 1 --nk 64 --heads 2 --d 32 --dtype f16 "
      "--kv-dtype f16,q8_0,q4_0 --repeat 3",
      path("kv.json"));
  const Json& rows = json.at("results");
  ASSERT_EQ(rows.size(), 6u) << json;
  const char* kv[] = {"f16", "q8_0", "q4_0"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const Json& r = rows[i];
    EXPECT_EQ(r.at("dtype"), "f16") << i;
    EXPECT_EQ(r.at("kv_dtype"), kv[i / 2]) << i;
    EXPECT_EQ(r.at("variant"), i % 2 ? "splitkv" : "flash2") << i;
    EXPECT_EQ(r.at("runs_ms").size(), 3u) << i;
    expect_vs_base(r, rows[i % 2], std::to_string(i));
  }
  expect_usage_error("bench --nq 8 --d 32 --kv-dtype q8_0,q8_0", "'q8_0' is named twice");
  expect_usage_error("bench --nq 8 --d 32 --kv-dtype q8_0,q9", "--kv-dtype: ");
  // Refused before the table: a head size q8_0's blocks do not divide, a JSON file not writable.
  Outcome blocks = run_cli("bench --nq 8 --d 48 --kv-dtype f16,q8_0");
  EXPECT_EQ(blocks.status, 2) << blocks.output;
  EXPECT_EQ(blocks.output,
            "flashvk: error: --kv-dtype q8_0 stores blocks of 32 values: --d must "
            "be a multiple of 32, got 48\n");
  Outcome json_dir = run_cli("bench --nq 8 --d 8 --json " + path("no/such/dir/b.json"));
  EXPECT_EQ(json_dir.status, 1) << json_dir.output;
  EXPECT_EQ(json_dir.output,
            "flashvk: error: output file '" + path("no/such/dir/b.json") + "': cannot write\n");
  Outcome folder = run_cli("bench --nq 8 --d 8 --json " + dir.string());
  EXPECT_EQ(folder.status, 1) << folder.output;
  EXPECT_EQ(folder.output, "flashvk: error: output file '" + dir.string() + "': is a folder\n");
  write_qkv({4, 32}, {6, 32}, {6, 32});
  expect_usage_error("run --q " + path("q.npy") + " --k " + path("k.npy") + " --v " +
                         path("v.npy") + " --out " + path("o.npy") + " --kv-dtype f16,q8_0",
                     "takes one storage with run");
}

TEST_F(CliTest, MissingAndUnreadableFiles) {
  write_qkv({4, 8}, {6, 8}, {6, 8});
  expect_refused("run --q " + path("nope.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "Q file '" + path("nope.npy") + "': cannot open");
  expect_refused("run --q " + dir.string() + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "Q file");
  expect_refused("run --k " + path("k.npy") + " --v " + path("v.npy"),
                 "missing required option --q");
}

TEST_F(CliTest, EmptyTruncatedAndForeignFiles) {
  write_qkv({4, 8}, {6, 8}, {6, 8});
  put("empty.npy", "");
  expect_refused("run --q " + path("empty.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "file is empty");
  put("text.npy", "hello, this is not numpy data at all");
  expect_refused("run --q " + path("text.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "not a .npy file");
  put("cut.npy", npy_bytes("<f4", "(4, 8)", "").substr(0, 30));
  expect_refused("run --q " + path("cut.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "truncated inside the header");
  // The header promises 2^40 floats: refused before any allocation.
  put("liar.npy", npy_bytes("<f4", "(1048576, 1048576)", std::string(64, '\0')));
  expect_refused("run --q " + path("liar.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "header promises shape");
  put("short.npy", npy_bytes("<f4", "(4, 8)", std::string(100, '\0')));
  expect_refused("run --q " + path("short.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "holds only 100");
}

TEST_F(CliTest, UnsupportedDtypesAndRanks) {
  write_qkv({4, 8}, {6, 8}, {6, 8});
  put("f64.npy", npy_bytes("<f8", "(4, 8)", std::string(256, '\0')));
  expect_refused("run --q " + path("f64.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "unsupported dtype '<f8'");
  put("be.npy", npy_bytes(">f4", "(4, 8)", std::string(128, '\0')));
  expect_refused("run --q " + path("be.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "unsupported dtype '>f4'");
  put("r1.npy", npy_bytes("<f4", "(8,)", std::string(32, '\0')));
  expect_refused("run --q " + path("r1.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "Q must have rank 2");
  put("r5.npy", npy_bytes("<f4", "(1, 1, 1, 4, 8)", std::string(128, '\0')));
  expect_refused("run --q " + path("r5.npy") + " --k " + path("k.npy") + " --v " + path("v.npy"),
                 "got rank 5");
}

TEST_F(CliTest, ShapesThatDoNotFitTogether) {
  write_qkv({2, 3, 4, 8}, {2, 2, 6, 8}, {2, 2, 6, 8});
  expect_refused("run " + qkv(), "must be a multiple of K/V's heads");
  write_qkv({2, 2, 4, 8}, {1, 2, 6, 8}, {1, 2, 6, 8});
  expect_refused("run " + qkv(), "batch sizes differ");
  write_qkv({2, 2, 4, 8}, {2, 2, 6, 8}, {2, 2, 7, 8});
  expect_refused("run " + qkv(), "same number of keys");
  write_qkv({2, 2, 4, 8}, {2, 2, 6, 16}, {2, 2, 6, 8});
  expect_refused("run " + qkv(), "same head dim");
}

TEST_F(CliTest, TensorTooLargeForTheDeviceNamesTheLimit) {
  // K of 540000 x 64 floats is 138 MB, over lavapipe's 128 MiB maxStorageBufferRange.
  put_tensor("q.npy", HostTensor({1, 64}));
  put_tensor("k.npy", HostTensor({540000, 64}));
  put_tensor("v.npy", HostTensor({540000, 1}));
  if (list_devices()[0].max_storage_buffer_range >= 540000ull * 64 * 4)
    GTEST_SKIP() << "device has a larger range";
  expect_refused("run " + qkv(), "maxStorageBufferRange");
}

TEST_F(CliTest, BadOptionValues) {
  write_qkv({1, 2, 4, 8}, {1, 2, 6, 8}, {1, 2, 6, 8});
  expect_refused("run " + qkv() + " --variant flash3", "unknown variant 'flash3'");
  expect_refused("run " + qkv() + " --scale abc", "--scale expects a finite number");
  expect_refused("run " + qkv() + " --scale inf", "--scale expects a finite number");
  expect_refused("run " + qkv() + " --splits 0", "--splits must be between 1");
  expect_refused("run " + qkv() + " --dtype f64", "--dtype must be f32 or f16");
  expect_refused("run " + qkv() + " --rope sideways", "unknown rope layout");
  expect_refused("run " + qkv() + " --device 99", "device 99 does not exist");
  expect_refused("run " + qkv() + " --device -1", "--device must be between 0");
  expect_refused("run " + qkv() + " --frobnicate", "not expected: --frobnicate");
  expect_refused("run " + qkv() + " --scale 1 --scale 2", "--scale: At Most 1");
  expect_refused("run " + qkv() + " --causal=false", "disallowed flag override");  // no value
  Outcome missing = run_cli("bench --nq");  // a value missing at the end
  EXPECT_EQ(missing.status, 2) << missing.output;
  EXPECT_NE(missing.output.find("--nq: 1 required"), std::string::npos) << missing.output;
  expect_refused("trace " + qkv() + " --row 4", "--row 4 is out of range");
  expect_refused("trace " + qkv() + " --row 0 --head 2", "--head 2 is out of range");
  expect_refused("trace " + qkv() + " --row 0 --batch 1", "--batch 1 is out of range");
  expect_refused("trace " + qkv() + " --row -3", "--row must be between 0");
  expect_refused("run " + qkv() + " --window 3", "--window must be L,R");
  expect_refused("run " + qkv() + " --window 3,-2", "--window must be L,R with integers");
  expect_refused("run " + qkv() + " --window a,b", "--window must be L,R with integers");
  expect_refused("run " + qkv() + " --softcap 0", "--softcap must be positive");
  expect_refused("run " + qkv() + " --chunk 0", "--chunk must be a positive integer");
  expect_refused("run " + qkv() + " --chunk 2,3", "--chunk must be a positive integer");
  expect_refused("run " + qkv() + " --alibi-max-bias -1", "--alibi-max-bias must be positive");
  put_tensor("three.npy", random_tensor({3}, 4));
  expect_refused("run " + qkv() + " --sinks " + path("three.npy"),
                 "sinks has 3 entries; expected one per query head (H = 2)");
  expect_refused("run " + qkv() + " --sinks " + path("none.npy"), "sinks file");
  expect_refused("run " + qkv() + " --alibi-max-bias 8 --alibi-slopes " + path("three.npy"),
                 "not both");
  expect_refused("frobnicate", "unknown command 'frobnicate'");
}

// `flashvk pipelines`: every pipeline of the calls, with the constants it was created from, in
// the table, the JSON and as SPIR-V files; where the driver gives no statistics (lavapipe) the
// report says so, and --check refuses to pass.
TEST_F(CliTest, PipelinesListsEachPipelineWithItsConstantsAndSpirv) {
  bool statistics = context().device().pipeline_statistics;
  Outcome o = run_cli(
      "pipelines --variant flash2,splitkv,naive --nq 40 --nk 300 --d 32 --causal "
      "--json " +
      path("p.json") + " --spirv " + path("spv"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("6 pipelines for 3 calls"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find("no statistics") != std::string::npos, !statistics) << o.output;
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(path("p.json")));
  ASSERT_EQ(doc["pipelines"].size(), 6u) << doc.dump(1);
  std::set<std::string> programs;
  for (const auto& p : doc["pipelines"]) {
    programs.insert(p["program"].get<std::string>());
    EXPECT_TRUE(p["statistics"].is_object());
    EXPECT_EQ(p["statistics"].empty(), !statistics) << p.dump(1);
    ASSERT_EQ(p["spec_constants"].size(), 21u);  // shaders/spec_constants.glsl
    for (size_t i = 0; i < 21; ++i) EXPECT_EQ(p["spec_constants"][i]["id"], i);
    EXPECT_EQ(p["spec_constants"][7]["name"], "MODS");
    std::string spv = path("spv/" + p["shader"].get<std::string>() + ".spv");
    std::ifstream f(spv, std::ios::binary);
    uint32_t magic = 0;
    f.read(reinterpret_cast<char*>(&magic), 4);
    EXPECT_EQ(magic, 0x07230203u) << spv;
  }
  EXPECT_EQ(programs, (std::set<std::string>{"flash2", "splitkv", "splitkv_merge", "naive_scores",
                                             "naive_softmax", "naive_pv"}));
  EXPECT_EQ(run_cli("pipelines --suite nope").status, 2);
  // --check cannot tell spills without the statistics: refused, not passed. With them it fails
  // exactly when the report counts a pipeline that spills (this fp32 call builds no matrix
  // kernel).
  Outcome check = run_cli("pipelines --variant flash2 --nq 8 --check");
  if (!statistics) {
    EXPECT_EQ(check.status, 1) << check.output;
    EXPECT_NE(check.output.find("--check needs the driver's statistics"), std::string::npos)
        << check.output;
  } else {
    bool spills = check.output.find("0 of 1 pipeline") == std::string::npos;
    EXPECT_EQ(check.status, spills ? 1 : 0) << check.output;
  }
}

// --skip-listed leaves out, without compiling, the builds an earlier report lists (the same
// shader, constants and required subgroup size), and keeps the others.
TEST_F(CliTest, PipelinesSkipTheBuildsAnEarlierReportLists) {
  const std::string call = "pipelines --nq 40 --nk 300 --d 32 --variant ";
  Outcome first = run_cli(call + "flash2 --json " + path("first.json"));
  ASSERT_EQ(first.status, 0) << first.output;
  Outcome o = run_cli(call + "flash2,splitkv --skip-listed " + path("first.json") + " --json " +
                      path("second.json"));
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("2 pipelines for 2 calls"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("1 more as listed in"), std::string::npos) << o.output;
  nlohmann::json doc = nlohmann::json::parse(std::ifstream(path("second.json")));
  ASSERT_EQ(doc["pipelines"].size(), 2u) << doc.dump(1);
  EXPECT_EQ(doc["pipelines"][0]["program"], "splitkv");
  EXPECT_EQ(doc["pipelines"][1]["program"], "splitkv_merge");
  EXPECT_EQ(doc["skipped_as_listed"], 1);
  // Another shape is another build: nothing is skipped.
  o = run_cli("pipelines --nq 40 --nk 300 --d 64 --variant flash2 --skip-listed " +
              path("first.json"));
  EXPECT_NE(o.output.find("1 pipeline for 1 call"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("0 more as listed in"), std::string::npos) << o.output;
  // Only a report of this build on this device and driver, and not with user functions.
  std::ofstream(path("not.json")) << "{\"calls\": 3}\n";
  doc = nlohmann::json::parse(std::ifstream(path("first.json")));
  doc["device"]["name"] = "another GPU";
  std::ofstream(path("other.json")) << doc.dump();
  std::ofstream(path("mod.glsl")) << "float score_mod(float s, int b, int h, int i, int j) "
                                     "{ return s; }\n";
  for (auto [args, words] :
       {std::pair{"--skip-listed " + path("not.json"),
                  "is not a report of `flashvk pipelines --json`"},
        std::pair{"--skip-listed " + path("missing.json"), "cannot read"},
        std::pair{"--skip-listed " + path("other.json"), "is a report of another GPU"},
        std::pair{"--score-mod " + path("mod.glsl") + " --skip-listed " + path("first.json"),
                  "cannot tell the builds of --score-mod or --mask-mod apart"}}) {
    o = run_cli(call + "flash2 " + args);
    EXPECT_GT(o.status, 0) << o.output;
    EXPECT_LT(o.status, 128) << o.output;
    EXPECT_EQ(o.output.rfind("flashvk: error: ", 0), 0u) << o.output;
    EXPECT_NE(o.output.find(words), std::string::npos) << o.output;
  }
}

// The FMA share and the matrix instructions of a kernel's key loop, from ACO's assembly: the
// loop is the largest span that a branch jumps back over.
TEST(IsaMix, CountsTheFmasAndMatrixInstructionsOfTheLargestLoop) {
  const char* assembly = R"(BB0:
  v_mov_b32 v0, 0
  s_mov_b32 s0, 0
  v_wmma_f32_16x16x16_f16 v[8:15], v[0:7], v[16:23], v[8:15]
BB1:
  v_fma_f32 v1, v2, v3, v1
  v_pk_fma_f16 v4, v5, v6, v4
  v_dot2_f32_f16 v7, v8, v9, v7
  v_wmma_f32_16x16x16_f16 v[24:31], v[0:7], v[16:23], v[24:31]
  v_wmma_f32_16x16x16_f16 v[32:39], v[0:7], v[16:23], v[32:39]
  v_add_f32 v1, v1, v0
  v_readlane_b32 s1, v1, 0
  s_cbranch_scc1 BB1
BB2:
  v_fma_f32 v1, v1, v1, v1
  s_cbranch_vccz BB2
  s_endpgm
)";
  cli::IsaMix mix = cli::isa_mix(assembly);
  EXPECT_EQ(mix.valu, 9u);  // v_readlane is not VALU arithmetic
  EXPECT_EQ(mix.fma, 4u);
  EXPECT_EQ(mix.matrix, 3u);
  EXPECT_EQ(mix.loop_valu, 6u);
  EXPECT_EQ(mix.loop_fma, 3u);
  EXPECT_EQ(mix.loop_matrix, 2u);  // not the one before the loop
  EXPECT_FALSE(cli::lacks_matrix_loop(mix));
  // The products outside the loop, in ordinary arithmetic within it: what --check fails.
  cli::IsaMix outside = cli::isa_mix(R"(BB0:
  v_wmma_f32_16x16x16_f16 v[8:15], v[0:7], v[16:23], v[8:15]
BB1:
  v_fma_f32 v1, v2, v3, v1
  s_cbranch_scc1 BB1
  s_endpgm
)");
  EXPECT_EQ(outside.matrix, 1u);
  EXPECT_EQ(outside.loop_matrix, 0u);
  EXPECT_TRUE(cli::lacks_matrix_loop(outside));
  // Nothing read (a disassembler that does not know the chip): nothing to judge.
  EXPECT_FALSE(cli::lacks_matrix_loop(cli::isa_mix("")));
}

// RDNA's subgroups a SIMD by whole workgroups in a WGP's 128 KiB of LDS (1 KiB steps), over 4
// SIMDs, in subgroups of 32 lanes: RADV's own figure rounds the LDS bound up (ceil(32768 /
// (36864 / 4)) = 4), where floor(131072 / 36864) = 3 workgroups of 4 subgroups give 3.
TEST(StatisticColumns, RdnaSubgroupsASimdCountWholeWorkgroups) {
  EXPECT_EQ(rdna_subgroups_per_simd(36352, 128, 32, 4), 3.0);
  EXPECT_EQ(rdna_subgroups_per_simd(45568, 128, 32, 3), 2.0);
  EXPECT_EQ(rdna_subgroups_per_simd(23040, 128, 32, 5), 5.0);
  // 1 KiB steps: 43520 B takes 44032, 2 workgroups of 8; 8704 B takes 9216, 14 of 2.
  EXPECT_EQ(rdna_subgroups_per_simd(43520, 256, 32, 5), 4.0);
  EXPECT_EQ(rdna_subgroups_per_simd(8704, 64, 32, 8), 7.0);
  // 64 lanes: 4 workgroups of 2 subgroups over 4 SIMDs, each counting twice.
  EXPECT_EQ(rdna_subgroups_per_simd(27136, 128, 64, 6), 4.0);
  EXPECT_EQ(rdna_subgroups_per_simd(45568, 256, 64, 6), 4.0);
  // Registers bound it (the driver's figure), or no LDS at all.
  EXPECT_EQ(rdna_subgroups_per_simd(1024, 64, 32, 2), 2.0);
  EXPECT_EQ(rdna_subgroups_per_simd(0, 64, 32, 16), 16.0);
  DeviceInfo gcn, rdna2;
  gcn.registers_per_simd = 256, rdna2.registers_per_simd = 512;
  EXPECT_FALSE(is_rdna(gcn));
  EXPECT_TRUE(is_rdna(rdna2));
}

// The report's columns from each driver's own names: RADV's, AMD's own driver's and NVIDIA's
// (as yuzu and RenderDoc show them), a name in another case, and a column whose only candidates
// are ambiguous or missing stays empty, never a wrong number.
TEST(StatisticColumns, ReadEachDriversNames) {
  auto stats = [](std::vector<std::pair<const char*, double>> list) {
    std::vector<PipelineStatistic> out;
    for (auto [name, value] : list) out.push_back({name, "", uint64_t(value)});
    return out;
  };
  auto columns = [](const std::vector<PipelineStatistic>& s) {
    std::map<std::string, double> by_key;
    std::vector<std::optional<double>> values = cli::column_values(s);
    for (size_t i = 0; i < values.size(); ++i)
      if (values[i]) by_key[cli::statistic_columns()[i].key] = *values[i];
    return by_key;
  };
  using Map = std::map<std::string, double>;
  Map radv = columns(stats({{"Driver pipeline hash", 77},
                            {"Code size", 25532},
                            {"LDS size", 27136},
                            {"Scratch size", 0},
                            {"Subgroups per SIMD", 4},
                            {"Instructions", 4857},
                            {"Pre-Sched SGPRs", 90},
                            {"Pre-Sched VGPRs", 240},
                            {"Spilled SGPRs", 0},
                            {"Spilled VGPRs", 3},
                            {"SGPRs", 128},
                            {"VGPRs", 256}}));
  EXPECT_EQ(radv, (Map{{"registers", 256},
                       {"scalar_registers", 128},
                       {"spilled_registers", 3},
                       {"spilled_scalar_registers", 0},
                       {"scratch_bytes", 0},
                       {"shared_bytes", 27136},
                       {"subgroups_per_simd", 4},
                       {"instructions", 4857},
                       {"binary_bytes", 25532}}));
  Map amdvlk = columns(stats({{"numUsedVgprs", 96},
                              {"numUsedSgprs", 40},
                              {"numAvailableVgprs", 256},
                              {"ldsUsageSizeInBytes", 8192},
                              {"scratchMemUsageInBytes", 16}}));
  EXPECT_EQ(amdvlk, (Map{{"registers", 96},
                         {"scalar_registers", 40},
                         {"scratch_bytes", 16},
                         {"shared_bytes", 8192}}));
  // NVIDIA 580 on an H200 (register blocks 64x64; its Local Memory Size as the engine reads it).
  Map nvidia = columns(stats({{"Register Count", 255},
                              {"Binary Size", 86272},
                              {"Stack Size", 0},
                              {"Local Memory Size", 64},
                              {"Shared Memory Size", 48656}}));
  EXPECT_EQ(nvidia, (Map{{"registers", 255},
                         {"scratch_bytes", 64},
                         {"shared_bytes", 48656},
                         {"binary_bytes", 86272}}));
  // By meaning, in any case: one statistic a column; two that could be it, or none, leave it out.
  Map other = columns(stats({{"REGISTERS USED", 64},
                             {"Max Registers", 255},
                             {"Spill Stores", 8},
                             {"Spill Loads", 8},
                             {"Shared memory (bytes)", 1024}}));
  EXPECT_EQ(other, (Map{{"registers", 64}, {"shared_bytes", 1024}}));
  EXPECT_TRUE(columns({}).empty());
}

}  // namespace
}  // namespace flashvk::test
