// flashvk::flex (flashvk/flex.hpp): the engine's kernels compiled at run time with the user's
// score_mod and mask_mod, by glslang, from the GLSL that cmake/Shaders.cmake embeds
// (flex_tables.hpp). The functions enter through shaders/modifiers.glsl's FLEX hooks, which
// include flex_functions.glsl: served here, it declares flex_table[] and includes the user's
// files under their own names, so that glslang's errors name them.
#include "flashvk/flex.hpp"

#include <glslang/Public/ResourceLimits.h>
#include <glslang/Public/ShaderLang.h>
#include <glslang/SPIRV/GlslangToSpv.h>

#include <bit>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include "flashvk/error.hpp"
#include "flex_tables.hpp"
#include "plan.hpp"
#include "vk.hpp"

namespace flashvk::flex {

namespace {

constexpr const char* kScoreSignature =
    "float score_mod(float score, int b, int h, int q_idx, int kv_idx)";
constexpr const char* kMaskSignature = "bool mask_mod(int b, int h, int q_idx, int kv_idx)";

// A user file's name as includes and errors give it: the file's name without its folders, or
// the function's role.
std::string file_name(const std::string& file, const char* role) {
  if (file.empty()) return std::string(role) + ".glsl";
  size_t slash = file.find_last_of('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

class Includer : public glslang::TShader::Includer {
 public:
  explicit Includer(std::map<std::string, std::string> files) : files_(std::move(files)) {}
  IncludeResult* includeLocal(const char* header, const char*, size_t) override {
    return find(header);
  }
  IncludeResult* includeSystem(const char* header, const char*, size_t) override {
    return find(header);
  }
  void releaseInclude(IncludeResult* result) override { delete result; }

 private:
  IncludeResult* find(const char* header) {
    if (auto it = files_.find(header); it != files_.end())
      return new IncludeResult(header, it->second.data(), it->second.size(), nullptr);
    for (const detail::FlexSource& s : detail::flex_sources())
      if (std::strcmp(header, s.name) == 0)
        return new IncludeResult(header, s.text, std::strlen(s.text), nullptr);
    return nullptr;  // glslang reports the include it cannot open
  }
  std::map<std::string, std::string> files_;
};

// glslang's first error, in one line: "doc.glsl:3: 'doc' : undeclared identifier". An error in
// the engine's own files means a function is missing or has another signature: said as such.
std::string first_error(const std::string& log, const Modifiers& mods, const std::string& score,
                        const std::string& mask) {
  std::istringstream lines(log);
  std::string line, error;
  while (std::getline(lines, line))
    if (line.rfind("ERROR: ", 0) == 0) {
      error = line.substr(7);
      break;
    }
  while (!error.empty() && (error.back() == ' ' || error.back() == '\r')) error.pop_back();
  if (error.empty()) error = "glslang failed without a message";
  bool in_user = (!mods.score_mod.empty() && error.rfind(score + ":", 0) == 0) ||
                 (!mods.mask_mod.empty() && error.rfind(mask + ":", 0) == 0);
  if (in_user) return error;
  std::string want;
  if (!mods.score_mod.empty() && error.find("mask_mod") == std::string::npos)
    want = score + " must define " + kScoreSignature;
  if (!mods.mask_mod.empty() && error.find("score_mod") == std::string::npos)
    want += (want.empty() ? "" : "; ") + mask + " must define " + kMaskSignature;
  return want + " (glslang: " + error + ")";
}

// The user's text with every read flex_table[i] turned into flex_table_at(i), which checks i
// against the table's length. Lines stay where they were, so errors name the user's lines.
std::string checked_reads(const std::string& text) {
  static const std::string name = "flex_table";
  auto ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(name, at)) != std::string::npos;) {
    size_t after = hit + name.size(), open = after;
    while (open < text.size() && (text[open] == ' ' || text[open] == '\t')) ++open;
    bool whole =
        (hit == 0 || !ident(text[hit - 1])) && (after >= text.size() || !ident(text[after]));
    if (!whole || open >= text.size() || text[open] != '[') {
      out += text.substr(at, after - at);
      at = after;
      continue;
    }
    size_t close = open + 1;
    for (int depth = 1; close < text.size(); ++close) {
      if (text[close] == '[') ++depth;
      if (text[close] == ']' && --depth == 0) break;
    }
    if (close >= text.size()) {  // unbalanced: left for glslang to report
      out += text.substr(at);
      return out;
    }
    out += text.substr(at, hit - at) + "flex_table_at(" +
           checked_reads(text.substr(open + 1, close - open - 1)) + ")";
    at = close + 1;
  }
  return out + text.substr(at);
}

std::once_flag glslang_ready;

// FNV-1a, 64 bits: a digest that stays the same from run to run and build to build.
uint64_t digest(const std::string& text, uint64_t h = 14695981039346656037ull) {
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// The kernels' GLSL as this library embeds it: a cached SPIR-V of another version never matches.
uint64_t sources_digest() {
  static const uint64_t d = [] {
    uint64_t h = digest("flashvk::flex 1");
    for (const detail::FlexSource& s : detail::flex_sources())
      h = digest(std::string(s.name) + '\0' + s.text, h);
    return h;
  }();
  return d;
}

// What glslang compiles for one build and set of functions: the kernel's source, a preamble of
// the build's defines and the functions' switches, the files it includes besides the embedded
// ones (flex_functions.glsl: the table and the user's files, their reads checked), and after
// the kernel the main() that runs it and then reports a read past the table (kEpilogue).
struct Job {
  const char* source_name = nullptr;
  const char* source = nullptr;
  std::string preamble;
  std::map<std::string, std::string> files;
  std::string score, mask;  // the user's files' names, as errors give them
  // For Vulkan 1.3 (SPIR-V 1.6), as cmake/Shaders.cmake builds a CM_NV2 build: NVIDIA's second
  // cooperative-matrix extension, which glslang takes only there; else Vulkan 1.1 (SPIR-V 1.3).
  bool vulkan_1_3 = false;
};

Job prepare(const std::string& build, const Modifiers& mods) {
  if (!mods.user_functions()) throw Error("flex::compile: neither score_mod nor mask_mod is given");
  const detail::FlexBuild* found = nullptr;
  for (const detail::FlexBuild& b : detail::flex_builds())
    if (build == b.name) found = &b;
  if (!found) throw Error("internal: flashvk::flex has no kernel build '" + build + "'");
  Job job;
  job.source_name = found->source;
  for (const detail::FlexSource& s : detail::flex_sources())
    if (std::strcmp(s.name, found->source) == 0) job.source = s.text;
  if (!job.source) throw Error(std::string("internal: flashvk::flex lacks ") + found->source);
  std::istringstream defines(found->defines);
  for (std::string d; defines >> d;) {
    job.preamble += "#define " + d + "\n";
    job.vulkan_1_3 = job.vulkan_1_3 || d == "CM_NV2";
  }
  job.preamble += "#define FLEX\n#define main flex_kernel_main\n";
  if (!mods.score_mod.empty()) job.preamble += "#define FLEX_SCORE_MOD\n";
  if (!mods.mask_mod.empty()) job.preamble += "#define FLEX_MASK_MOD\n";
  job.score = file_name(mods.score_mod_name, "score_mod");
  job.mask = file_name(mods.mask_mod_name, "mask_mod");
  // The table and after it a word a read outside it sets (Plan::check_user_functions); its
  // length is the bound range's, less that word, so one build serves every table. A read is
  // clamped into the table and notes a miss in a register, without a branch or a store in the
  // kernels' loops: kEpilogue's main() writes the word once, after the kernel.
  std::string functions =
      "layout(std430, binding = B_FlexTable) readonly buffer FlexTable {\n"
      "  float flex_table_values[];\n"
      "};\n"
      "#define FLEX_TABLE_SIZE (flex_table_values.length() - 1)\n"
      "uint flex_missed = 0u;\n"
      "float flex_table_at(int i) {\n"
      "  flex_missed |= uint(uint(i) >= uint(FLEX_TABLE_SIZE));  // no branch, as || would be\n"
      "  float value = flex_table_values[clamp(i, 0, max(FLEX_TABLE_SIZE - 1, 0))];\n"
      "  return mix(0.0, value, uint(i) < uint(FLEX_TABLE_SIZE));  // a select: 0 outside\n"
      "}\n"
      "float flex_table_at(uint i) { return flex_table_at(int(min(i, 0x7fffffffu))); }\n";
  if (!mods.score_mod.empty()) {
    job.files[job.score] = checked_reads(mods.score_mod);
    functions += "#include \"" + job.score + "\"\n";
  }
  if (!mods.mask_mod.empty() && mods.mask_mod != mods.score_mod) {  // one text: included once
    if (job.files.count(job.mask)) job.mask = "mask_" + job.mask;   // two files of one name
    job.files[job.mask] = checked_reads(mods.mask_mod);
    functions += "#include \"" + job.mask + "\"\n";
  }
  job.files["flex_functions.glsl"] = functions;
  return job;
}

// After the kernel (renamed flex_kernel_main by the preamble): the main() that runs it, then
// sets the word after the table where one of its reads missed the table.
const char* const kEpilogue =
    "\n#undef main\n"
    "layout(std430, binding = B_FlexTable) buffer FlexMiss { float flex_table_words[]; };\n"
    "void main() {\n"
    "  flex_kernel_main();\n"
    "  if (flex_missed != 0u) flex_table_words[flex_table_words.length() - 1] = 1.0;\n"
    "}\n";

// A digest of everything glslang sees for `job`: its own text and the embedded GLSL.
uint64_t job_digest(const Job& job) {
  uint64_t h = digest(std::string(job.source_name) + '\0' + job.preamble + '\0' + kEpilogue,
                      sources_digest());
  for (const auto& [name, text] : job.files) h = digest(name + '\0' + text + '\0', h);
  return h;
}

std::vector<uint32_t> run_glslang(const Job& job, const Modifiers& mods) {
  std::call_once(glslang_ready, [] { glslang::InitializeProcess(); });
  Includer includer(job.files);
  glslang::TShader shader(EShLangCompute);
  const char* texts[] = {job.source, kEpilogue};
  const char* names[] = {job.source_name, "flex_main.glsl"};
  shader.setStringsWithLengthsAndNames(texts, nullptr, names, 2);
  shader.setPreamble(job.preamble.c_str());
  shader.setEnvInput(glslang::EShSourceGlsl, EShLangCompute, glslang::EShClientVulkan, 100);
  const bool v13 = job.vulkan_1_3;
  shader.setEnvClient(glslang::EShClientVulkan,
                      v13 ? glslang::EShTargetVulkan_1_3 : glslang::EShTargetVulkan_1_1);
  shader.setEnvTarget(glslang::EShTargetSpv,
                      v13 ? glslang::EShTargetSpv_1_6 : glslang::EShTargetSpv_1_3);
  auto messages = static_cast<EShMessages>(EShMsgSpvRules | EShMsgVulkanRules);
  if (!shader.parse(GetDefaultResources(), 460, false, messages, includer))
    throw Error(first_error(shader.getInfoLog(), mods, job.score, job.mask));
  glslang::TProgram program;
  program.addShader(&shader);
  if (!program.link(messages))
    throw Error(first_error(program.getInfoLog(), mods, job.score, job.mask));
  std::vector<uint32_t> spirv;
  glslang::SpvOptions options;
  glslang::GlslangToSpv(*program.getIntermediate(EShLangCompute), spirv, &options);
  return spirv;
}

// glslang's compiler, keeping each kernel's SPIR-V in `folder` (the pipeline cache's; "" keeps
// none), named by the digest of what glslang sees: a later process loads it instead of
// compiling again. A file that is not SPIR-V is compiled over; a failed write only costs the
// next process a compile.
class GlslangCompiler : public KernelCompiler {
 public:
  explicit GlslangCompiler(std::filesystem::path folder) : folder_(std::move(folder)) {}
  std::vector<uint32_t> compile(const std::string& build, const Modifiers& mods) override {
    Job job = prepare(build, mods);
    if (folder_.empty()) return run_glslang(job, mods);
    char name[64];
    std::snprintf(name, sizeof name, "flashvk-flex-%016llx.spv",
                  static_cast<unsigned long long>(job_digest(job)));
    std::filesystem::path file = folder_ / name;
    std::vector<uint32_t> words = read_spirv(file);
    if (!words.empty()) return words;
    words = run_glslang(job, mods);
    std::filesystem::path tmp = file;
    tmp += ".tmp" + std::to_string(std::random_device{}()) +
           std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(words.data()),
                static_cast<std::streamsize>(words.size() * 4));
      if (!out) return words;
    }
    std::error_code error;
    std::filesystem::rename(tmp, file, error);
    if (error) std::filesystem::remove(tmp, error);
    return words;
  }

 private:
  static std::vector<uint32_t> read_spirv(const std::filesystem::path& file) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    if (!in) return {};
    auto bytes = static_cast<size_t>(in.tellg());
    if (bytes < 20 || bytes % 4 != 0) return {};
    std::vector<uint32_t> words(bytes / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(words.data()), static_cast<std::streamsize>(bytes));
    if (!in || words[0] != 0x07230203u) return {};  // SPIR-V's magic number
    return words;
  }
  std::filesystem::path folder_;
};

}  // namespace

std::vector<uint32_t> compile(const std::string& build, const Modifiers& mods) {
  return run_glslang(prepare(build, mods), mods);
}

void enable(Context& ctx) {
  const std::string& cache = ctx.impl().cache_path;
  std::filesystem::path folder =
      cache.empty() ? std::filesystem::path() : std::filesystem::path(cache).parent_path();
  if (!cache.empty() && folder.empty()) folder = ".";
  ctx.set_kernel_compiler(std::make_shared<GlslangCompiler>(folder));
}

void check(const Modifiers& mods) {
  compile("flash2_f32", mods);
}

struct DeviceTwins::State {
  Context* ctx;
  Modifiers mods;
  uint32_t nq, nk;
  using Key = std::tuple<int, int, int, int>;  // b, h, q_idx, kv_idx
  std::set<std::pair<Key, uint32_t>> asked;    // and the score's fp32 bits
  std::map<std::pair<Key, uint32_t>, float> scores;
  std::map<Key, bool> kept;
};

DeviceTwins::DeviceTwins(Context& ctx, Modifiers mods, uint32_t nq, uint32_t nk)
    : state_(std::make_shared<State>()) {
  state_->ctx = &ctx;
  state_->mods = std::move(mods);
  state_->nq = nq;
  state_->nk = nk;
}

Modifiers DeviceTwins::noting() {
  Modifiers m = state_->mods;
  std::shared_ptr<State> st = state_;
  if (!m.score_mod.empty() && !m.score_twin)
    m.score_twin = [st](double s, int b, int h, int i, int j) {
      st->asked.insert({{b, h, i, j}, std::bit_cast<uint32_t>(float(s))});
      return s;
    };
  if (!m.mask_mod.empty() && !m.mask_twin)
    m.mask_twin = [st](int b, int h, int i, int j) {
      st->asked.insert({{b, h, i, j}, 0u});
      return true;
    };
  return m;
}

Modifiers DeviceTwins::answering() {
  State& st = *state_;
  std::vector<float> points;
  points.reserve(st.asked.size() * 5);
  for (const auto& [key, bits] : st.asked) {
    auto [b, h, i, j] = key;
    for (float x : {std::bit_cast<float>(bits), std::bit_cast<float>(b), std::bit_cast<float>(h),
                    std::bit_cast<float>(i), std::bit_cast<float>(j)})
      points.push_back(x);
  }
  std::vector<float> values =
      detail::evaluate_user_functions(*st.ctx, st.mods, st.nq, st.nk, points);
  size_t e = 0;
  for (const auto& [key, bits] : st.asked) {
    st.scores[{key, bits}] = values[2 * e];
    st.kept[key] = values[2 * e + 1] != 0.0f;
    ++e;
  }
  Modifiers m = st.mods;
  std::shared_ptr<State> held = state_;
  if (!m.score_mod.empty() && !m.score_twin)
    m.score_twin = [held](double s, int b, int h, int i, int j) {
      auto it = held->scores.find({{b, h, i, j}, std::bit_cast<uint32_t>(float(s))});
      if (it == held->scores.end())
        throw Error("flex::DeviceTwins: score_mod asked at a point the first run did not");
      return double(it->second);
    };
  if (!m.mask_mod.empty() && !m.mask_twin)
    m.mask_twin = [held](int b, int h, int i, int j) {
      auto it = held->kept.find({b, h, i, j});
      if (it == held->kept.end())
        throw Error("flex::DeviceTwins: mask_mod asked at a point the first run did not");
      return it->second;
    };
  return m;
}

}  // namespace flashvk::flex
