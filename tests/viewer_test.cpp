// Headless screenshots of every preset, checked against what each panel should show.
#include <stb/stb_image.h>
#include <sys/wait.h>
#include <array>
#include <chrono>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include <imgui.h>

#include "lessons.hpp"
#include "npy.hpp"
#include "test_util.hpp"
#include "ui.hpp"

namespace flashvk::test {
namespace {

namespace fs = std::filesystem;

// Layout of ui.cpp at 1600 x 1000: controls 360 wide, derivation/output 470 wide on the right,
// plots above 62% of the height in the middle, the heatmap below.
constexpr int kWidth = 1600, kHeight = 1000, kLeft = 360, kRight = 470;
constexpr int kPlotsBottom = 620;

struct Image {
  int w = 0, h = 0;
  std::vector<uint8_t> rgba;
  bool near(int x, int y, int r, int g, int b, int tol = 12) const {
    const uint8_t* p = &rgba[(size_t(y) * size_t(w) + size_t(x)) * 4];
    return std::abs(p[0] - r) <= tol && std::abs(p[1] - g) <= tol && std::abs(p[2] - b) <= tol;
  }
  int count(int x0, int y0, int x1, int y1, int r, int g, int b, int tol = 12) const {
    int n = 0;
    for (int y = y0; y < y1; ++y)
      for (int x = x0; x < x1; ++x) n += near(x, y, r, g, b, tol);
    return n;
  }
};

Image screenshot(const std::string& args, std::string* output = nullptr) {
  fs::path png =
      fs::temp_directory_path() / ("flashvk_viewer_" + std::to_string(::getpid()) + ".png");
  std::string cmd = std::string(FLASHVK_VIEWER) + " --headless --screenshot " + png.string() + " " +
                    args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  int status = pclose(pipe);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  if (output) *output = out;
  Image img;
  int channels = 0;
  uint8_t* data = stbi_load(png.string().c_str(), &img.w, &img.h, &channels, 4);
  if (!data) {
    ADD_FAILURE() << "no PNG written: " << out;
    return img;
  }
  img.rgba.assign(data, data + size_t(img.w) * size_t(img.h) * 4);
  stbi_image_free(data);
  fs::remove(png);
  return img;
}

// The first plot (scores) occupies the top-left of the plots panel.
struct Box {
  int x0, y0, x1, y1;
};
Box scores_plot(const Image& img) {
  // The panels as draw_ui lays them out at this size; then the plot's dark background (25, 27,
  // 33) from the plots panel's top left.
  int left = std::clamp(int(img.w * 0.225), 300, 420),
      right = std::clamp(int(img.w * 0.29375), 376, 560);
  int plots_bottom = int(img.h * 0.62);
  Box b{left + 4, 0, left + (img.w - left - right) / 2, plots_bottom / 3};
  for (int y = 20; y < b.y1; ++y)
    if (img.count(b.x0, y, b.x1, y + 1, 25, 27, 33, 3) > 200)
      return {b.x0, y, b.x1, y + (plots_bottom - y) / 3 - 10};
  return b;
}

// Mean y of the white score line in a band of columns, or -1 if absent.
double line_y(const Image& img, const Box& box, double from, double to) {
  int x0 = box.x0 + int((box.x1 - box.x0) * from), x1 = box.x0 + int((box.x1 - box.x0) * to);
  double sum = 0;
  int n = 0;
  for (int y = box.y0 + 20; y < box.y1; ++y)
    for (int x = x0; x < x1; ++x)
      if (img.near(x, y, 220, 220, 220, 25)) sum += y, ++n;
  return n ? sum / n : -1;
}

// Every preset the viewer offers (the documents one where flashvk::flex is built).
const std::vector<std::string>& kPresets = viewer::preset_names();

TEST(Viewer, EveryPresetRendersAllPanels) {
  for (const std::string& preset : kPresets) {
    std::string out;
    Image img =
        screenshot(std::string("--preset ") + preset + " --variant flash2,flashd,splitkv", &out);
    ASSERT_EQ(img.w, kWidth) << preset;
    ASSERT_EQ(img.h, kHeight) << preset;
    // Plot backgrounds fill much of the plots panel.
    EXPECT_GT(img.count(kLeft, 0, kWidth - kRight, kPlotsBottom, 25, 27, 33, 3), 100000) << preset;
    // The step cursor (yellow) is drawn in the plots.
    EXPECT_GT(img.count(kLeft, 0, kWidth - kRight, kPlotsBottom, 255, 220, 0, 30), 100) << preset;
    // Each variant's colour appears (Okabe and Ito's: flashd reddish purple, splitkv orange,
    // flash2 bluish green).
    EXPECT_GT(img.count(kLeft, 0, kWidth, kHeight, 204, 121, 167, 30), 50) << preset << " flashd";
    EXPECT_GT(img.count(kLeft, 0, kWidth, kHeight, 230, 159, 0, 30), 50) << preset << " splitkv";
    EXPECT_GT(img.count(kLeft, 0, kWidth, kHeight, 0, 158, 115, 30), 50) << preset << " flash2";
    // Text in the controls and derivation panels (light grey glyph pixels).
    EXPECT_GT(img.count(0, 0, kLeft, kHeight, 255, 255, 255, 40), 500) << preset;
    EXPECT_GT(img.count(kWidth - kRight, 0, kWidth, kHeight, 255, 255, 255, 40), 500) << preset;
    EXPECT_NE(out.find("wrote"), std::string::npos) << out;
  }
}

// At 2560 wide the plots give each of the 240 keys 3 pixels: the whole row is drawn.
TEST(Viewer, FallingRisingScoresHaveTheirShape) {
  Image img = screenshot("--preset falling-rising --variant flashd --size 2560x1440");
  Box box = scores_plot(img);
  double start = line_y(img, box, 0.02, 0.06), bottom = line_y(img, box, 0.64, 0.68),
         end = line_y(img, box, 0.95, 0.98);
  ASSERT_GT(start, 0);
  ASSERT_GT(bottom, 0);
  ASSERT_GT(end, 0);
  EXPECT_GT(bottom - start, (box.y1 - box.y0) * 0.6) << "the fall to -2000 reaches the bottom";
  EXPECT_LT(end, bottom - (box.y1 - box.y0) * 0.6) << "the rise comes back up";
}

// Headless, --step places the plots' window as the viewer would and the summary names it: on
// falling-rising's failure (key 236 of 240) at 1280x720, a window that holds it.
TEST(Viewer, SummaryNamesThePlottedKeys) {
  std::string out;
  screenshot("--preset falling-rising --step 236 --size 1280x720", &out);
  size_t at = out.find("plots: keys ");
  ASSERT_NE(at, std::string::npos) << out;
  int lo = -1, hi = -1, n = -1;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "plots: keys %d-%d of %d", &lo, &hi, &n), 3) << out;
  EXPECT_EQ(n, 240);
  EXPECT_LE(lo, 236);
  EXPECT_GE(hi, 236);
  EXPECT_LT(hi - lo + 1, 240) << "240 keys at 3 px do not fit a 1280-wide window's plots";
}

// --play: the Play button's steps, speed / 60 keys a frame, with the plots' window following the
// cursor; playback stops at the row's last key. The frames' times are printed, not judged.
TEST(Viewer, PlayStepsAsThePlayButtonDoes) {
  struct Play {
    int step, frames, speed, to;
  };
  for (Play p : {Play{100, 30, 120, 160}, Play{230, 30, 120, 239}}) {
    std::string out;
    screenshot("--preset falling-rising --size 1280x720 --step " + std::to_string(p.step) +
                   " --play " + std::to_string(p.frames) + " --speed " + std::to_string(p.speed),
               &out);
    size_t at = out.find("play: ");
    ASSERT_NE(at, std::string::npos) << out;
    int frames = 0, from = -1, to = -1;
    double speed = 0, median = 0, slowest = 0;
    ASSERT_EQ(std::sscanf(out.c_str() + at,
                          "play: %d frames at %lf steps/s, keys %d to %d: %lf ms a frame (median), "
                          "%lf ms the slowest",
                          &frames, &speed, &from, &to, &median, &slowest),
              6)
        << out;
    EXPECT_EQ(frames, p.frames);
    EXPECT_EQ(speed, p.speed);
    EXPECT_EQ(from, p.step);
    EXPECT_EQ(to, p.to) << out;
    EXPECT_GT(median, 0.0);
    EXPECT_GE(slowest, median);
    int lo = -1, hi = -1, n = -1;
    at = out.find("plots: keys ");
    ASSERT_EQ(std::sscanf(out.c_str() + at, "plots: keys %d-%d of %d", &lo, &hi, &n), 3) << out;
    EXPECT_LE(lo, to);
    EXPECT_GE(hi, to);
  }
}

// The user's own functions from files (--score-mod, --mask-mod, --mod-table): the float64
// reference takes their values from the device (flex::DeviceTwins). A copy of the documents
// preset's mask_mod gives the preset's own errors, to the digit (the mask is exact either way);
// a per-key bias capped by tanh leaves every variant within fp32 of float64, which a reference
// without the bias would miss by far.
TEST(Viewer, UsersOwnFunctionsAreComparedWithFloat64) {
#ifndef FLASHVK_VIEWER_FLEX
  GTEST_SKIP() << "flashvk::flex is not built";
#endif
  fs::path dir = fs::temp_directory_path() / ("flashvk_viewer_flex_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto put = [&](const char* name, const char* text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  std::string docs = put("mine.glsl", R"(bool mask_mod(int b, int h, int q_idx, int kv_idx) {
  int q_pos = q_idx + FLEX_NK - FLEX_NQ;
  return kv_idx <= q_pos && flex_table[kv_idx] == flex_table[q_pos];
})");
  // Each variant's "output error vs float64" from the summary, as printed (%.2e).
  auto errors = [](const std::string& out) {
    const std::string label = "output error vs float64 ";
    std::vector<double> found;
    for (size_t at = out.find(label); at != std::string::npos; at = out.find(label, at + 1))
      found.push_back(std::stod(out.substr(at + label.size())));
    return found;
  };
  std::string preset, mine;
  screenshot("--preset documents --variant flash2,flashd", &preset);
  screenshot("--preset documents --variant flash2,flashd --mask-mod " + docs, &mine);
  EXPECT_NE(mine.find("documents with mask_mod mine.glsl"), std::string::npos) << mine;
  EXPECT_EQ(errors(mine), errors(preset));
  EXPECT_EQ(errors(mine).size(), 2u) << mine;

  // A table alone replaces the preset's: its C++ twin (of the preset's own ids) gives way too.
  HostTensor ids({192});
  for (int j = 0; j < 192; ++j) ids.data[size_t(j)] = j < 100 ? 0.0f : 1.0f;
  npy::write((dir / "ids.npy").string(), ids);
  std::string two;
  screenshot("--preset documents --variant flash2,flashd --mod-table " + (dir / "ids.npy").string(),
             &two);
  EXPECT_EQ(errors(two).size(), 2u) << two;
  for (double e : errors(two)) EXPECT_LT(e, 2e-6) << two;

  std::string bias =
      put("bias.glsl", R"(float score_mod(float score, int b, int h, int q_idx, int kv_idx) {
  return score + 4.0 * tanh(flex_table[kv_idx] / 4.0);
})");
  HostTensor table({96});
  for (int j = 0; j < 96; ++j) table.data[size_t(j)] = 3.0f * std::sin(0.37f * float(j));
  npy::write((dir / "bias.npy").string(), table);
  std::string out;
  screenshot("--preset sample --variant flash1,flash2,flashd --score-mod " + bias +
                 " --mod-table " + (dir / "bias.npy").string(),
             &out);
  EXPECT_EQ(errors(out).size(), 3u) << out;
  for (double e : errors(out)) EXPECT_LT(e, 2e-6) << out;
  fs::remove_all(dir);
}

TEST(Viewer, SummaryReportsExactOutputs) {
  std::string out;
  screenshot(
      "--preset masked-mid-row --variant naive,online,flash1,flash2,flashd,splitkv --step 10",
      &out);
  for (const char* v : {"naive", "online", "flash1", "flash2", "flashd", "splitkv"})
    EXPECT_NE(out.find(v), std::string::npos) << out;
  // Every variant's error against float64 is printed in the form "error vs float64 X.XXe-YY".
  size_t at = 0;
  int checked = 0;
  while ((at = out.find("error vs float64 ", at)) != std::string::npos) {
    at += 17;
    EXPECT_LT(std::stod(out.substr(at, 8)), 1e-5) << out;
    ++checked;
  }
  EXPECT_EQ(checked, 6);
}

// Stored inputs (fp16, q4_0 K and V): the kernels are compared with float64 on the values the
// device holds, so they stay exact; what the storage costs is printed apart, q4_0's far above
// fp16's, and the numbers are the float64 reference's own (checked here on the host).
TEST(Viewer, StoredInputsAreExactAgainstTheirStoredValuesAndTheirCostIsShown) {
  for (const char* preset : {"fp16-overflow", "q4-kv"}) {
    std::string out;
    screenshot(std::string("--preset ") + preset + " --variant flash2,flashd", &out);
    size_t at = 0;
    int checked = 0;
    while ((at = out.find("error vs float64 ", at)) != std::string::npos) {
      at += 17;
      EXPECT_LT(std::stod(out.substr(at, 8)), 1e-5) << preset << "\n" << out;
      ++checked;
    }
    EXPECT_EQ(checked, 2) << out;
    size_t cost = out.find("moves the float64 output by ");
    ASSERT_NE(cost, std::string::npos) << out;
    double moved = std::stod(out.substr(cost + 28, 8));
    size_t f16 = out.find("(fp16: ", cost);
    ASSERT_NE(f16, std::string::npos) << out;
    double fp16 = std::stod(out.substr(f16 + 7, 8));
    if (std::string(preset) == "q4-kv") {
      viewer::Inputs in = viewer::make_preset(preset, FLASHVK_ASSETS);
      AttentionParams p = in.params;
      HostTensor k = stored_values(in.k, DType::q4_0), v = stored_values(in.v, DType::q4_0);
      reference::Result given = reference::direct(in.q, in.k, in.v, p);
      reference::Result held = reference::direct(in.q, k, v, p);
      double want = 0;
      for (size_t c = 0; c < 32; ++c)  // row 7 of the only head: the last row
        want = std::max(want, std::abs(held.out[7 * 32 + c] - given.out[7 * 32 + c]));
      EXPECT_NEAR(moved, want, want * 1e-2) << out;
      EXPECT_GT(moved, 10 * fp16) << out;
    } else {
      EXPECT_EQ(moved, fp16) << out;  // fp16 storage: the same number twice
    }
  }
}

// From 1280 x 720 up nothing is cut at the side: the viewer asks ImGui how far each panel's
// content reached and how wide each plot title is, and names what did not fit.
TEST(Viewer, EveryPresetFitsAt1280x720And1920x1080) {
  for (auto [size, width] : {std::pair{"1280x720", 1280}, std::pair{"1920x1080", 1920}})
    for (const std::string& preset : kPresets) {
      std::string out;
      Image img =
          screenshot(std::string("--preset ") + preset +
                         " --variant naive,online,flash1,flash2,flashd,splitkv --size " + size,
                     &out);
      EXPECT_EQ(img.w, width) << preset;
      EXPECT_NE(out.find("layout: every panel's text fits its width"), std::string::npos)
          << preset << " at " << size << ":\n"
          << out;
    }
  std::string out;  // and the check does find what does not fit
  screenshot("--preset sample --size 800x600", &out);
  EXPECT_NE(out.find("wider than the p"), std::string::npos) << out;  // panel or plot
  EXPECT_EQ(out.find("every panel's text fits"), std::string::npos) << out;
}

// Each preset's lesson has points of interest inside its trace, at the steps its text names.
class LessonTest : public VulkanTest {};

// An ImGui context with its fonts built and no display (the controls are laid out and drawn
// in-process, no device needed), and frames of whatever `draw` draws.
class ImGuiFrames {
 public:
  explicit ImGuiFrames(float width = 1280.0f, float height = 720.0f) {
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;
    unsigned char* pixels = nullptr;
    int w = 0, h = 0;
    io.Fonts->GetTexDataAsRGBA32(&pixels, &w, &h);
    size(width, height);
  }
  ~ImGuiFrames() { ImGui::DestroyContext(); }
  ImGuiFrames(const ImGuiFrames&) = delete;
  ImGuiFrames& operator=(const ImGuiFrames&) = delete;
  void size(float width, float height) { ImGui::GetIO().DisplaySize = ImVec2(width, height); }
  template <class Draw>
  void frame(Draw draw) {
    ImGui::GetIO().DeltaTime = 1.0f / 60.0f;
    ImGui::NewFrame();
    draw();
    ImGui::Render();
  }
};

const viewer::PointOfInterest* point_at(const viewer::Lesson& lesson, int step) {
  for (const auto& p : lesson.points)
    if (p.step == step) return &p;
  return nullptr;
}

TEST_F(LessonTest, EveryPresetHasPointsOfInterestInItsTrace) {
  for (const std::string& preset : kPresets) {
    viewer::Model model(context());
    model.selected = {Variant::flash1, Variant::flashd, Variant::splitkv};
    model.load(viewer::make_preset(preset, FLASHVK_ASSETS));
    viewer::Lesson lesson = viewer::lesson_for(model);
    EXPECT_GT(lesson.intro.size(), 100u) << preset;
    ASSERT_GE(lesson.points.size(), 2u) << preset;
    for (size_t i = 0; i < lesson.points.size(); ++i) {
      const auto& p = lesson.points[i];
      EXPECT_GE(p.step, 0) << preset;
      EXPECT_LT(p.step, model.steps()) << preset;
      EXPECT_FALSE(p.title.empty() || p.look.empty()) << preset;
      if (i) {
        EXPECT_LE(lesson.points[i - 1].step, p.step) << preset << ": in step order";
      }
    }
    EXPECT_EQ(lesson.literal_flashd, std::string(preset) == "falling-rising") << preset;
  }
}

// The step plots show a window of keys around the cursor when the row is too long for a few
// pixels a key: at 1280x720 and 1920x1080 each preset's points of interest are inside the window
// when the cursor is on them, and a row that fits is shown whole.
TEST_F(LessonTest, PointsOfInterestAreInsideThePlottedWindow) {
  for (float width : {1280.0f, 1920.0f})
    for (const std::string& preset : kPresets) {
      viewer::Model model(context());
      model.selected = {Variant::flash2, Variant::flashd};
      model.load(viewer::make_preset(preset, FLASHVK_ASSETS));
      viewer::Lesson lesson = viewer::lesson_for(model);
      float px = viewer::plot_pixels(width);
      int steps = model.steps();
      for (const auto& p : lesson.points) {
        viewer::KeyWindow w = viewer::key_window(steps, p.step, px, viewer::UiState{});
        EXPECT_LE(w.lo, p.step) << preset << " at " << width << ": " << p.title;
        EXPECT_GT(w.hi, p.step) << preset << " at " << width << ": " << p.title;
        EXPECT_GE(px / float(w.hi - w.lo), viewer::kKeyPixels) << preset;
        if (float(steps) * viewer::kKeyPixels <= px) {
          EXPECT_EQ(w.lo, 0) << preset;
          EXPECT_EQ(w.hi, steps) << preset;
        }
      }
    }
  // A zoomed window stays where it was until the cursor leaves it, then follows it.
  viewer::UiState ui;
  ui.view_span = 40, ui.view_lo = 100, ui.view_cursor = 120;
  viewer::KeyWindow kept = viewer::key_window(1000, 130, 600.0f, ui);
  EXPECT_EQ(kept.lo, 100);
  EXPECT_EQ(kept.hi, 140);
  viewer::KeyWindow moved = viewer::key_window(1000, 500, 600.0f, ui);
  EXPECT_EQ(moved.lo, 480);
  EXPECT_EQ(moved.hi, 520);
}

// The viewer traces only the row it shows, as a call of that row alone (row_call): for every
// preset whose row can be cut out, and a causal GQA input with a window, its trace is the whole
// call's, key by key, with FA2, FLASH-D and splitkv (given the whole call's chunks).
TEST_F(LessonTest, TheRowAloneTracesAsTheWholeCall) {
  std::vector<viewer::Inputs> cases;
  for (const std::string& preset : kPresets) cases.push_back(viewer::make_preset(preset, FLASHVK_ASSETS));
  viewer::Inputs gqa;
  gqa.name = "gqa";
  gqa.q = random_tensor({2, 4, 37, 16}, 1);
  gqa.k = random_tensor({2, 2, 53, 16}, 2);
  gqa.v = random_tensor({2, 2, 53, 8}, 3);
  gqa.params.mods.causal = true;
  gqa.params.mods.window_left = 20;
  gqa.params.mods.sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  gqa.params.mods.key_mask.assign(2 * 53, 1);
  gqa.params.mods.key_mask[53 + 30] = 0;
  cases.push_back(gqa);
  int cut = 0;
  for (const viewer::Inputs& in : cases) {
    Dims d = check_shapes(in.q.shape, in.k.shape, in.v.shape);
    uint32_t b = d.batch - 1, h = d.heads - 1, row = std::min(in.row, d.nq - 1);
    if (in.name == "gqa") row = 30;
    std::optional<viewer::RowCall> one = viewer::row_call(in, b, h, row);
    if (!one) {
      EXPECT_TRUE(in.params.mods.user_functions()) << in.name;
      continue;
    }
    ++cut;
    for (Variant v : {Variant::flash2, Variant::flashd, Variant::splitkv}) {
      AttentionParams whole = in.params, alone = one->params;
      whole.variant = alone.variant = v;
      Trace want = trace(context(), in.q, in.k, in.v, whole, b, h, row, in.storage);
      if (v == Variant::splitkv) alone.hints.splits = uint32_t(want.splits.size());
      Trace got = trace(context(), one->q, one->k, one->v, alone, 0, 0, 0, in.storage);
      std::string at = in.name + " " + variant_name(v);
      ASSERT_EQ(got.steps.size(), want.steps.size()) << at;
      EXPECT_EQ(got.tile_size, want.tile_size) << at;
      // Before the row's first key its LSE is the sink's where the whole call's workgroup read
      // those keys for other rows, and unwritten where the row alone skips them: not compared.
      size_t first = 0;
      while (first < want.steps.size() && std::isinf(want.steps.s[first])) ++first;
      for (size_t i = 0; i < want.steps.size(); ++i) {
        auto same = [](float x, float y) { return x == y || (std::isnan(x) && std::isnan(y)); };
        EXPECT_TRUE(same(got.steps.s[i], want.steps.s[i])) << at << " key " << i;
        EXPECT_TRUE(same(got.steps.w[i], want.steps.w[i])) << at << " key " << i;
        if (i >= first) {
          EXPECT_TRUE(same(got.steps.lse[i], want.steps.lse[i])) << at << " key " << i;
        }
        for (size_t c = 0; c < want.steps.o[i].size(); ++c)
          EXPECT_TRUE(same(got.steps.o[i][c], want.steps.o[i][c])) << at << " key " << i;
      }
      EXPECT_EQ(got.out, want.out) << at;
    }
  }
  EXPECT_GE(cut, int(kPresets.size()));
}

// The controls, drawn in-process by ImGui (no device needed to lay them out): |< < Play > >|
// stay where they are whatever the lesson's note says at the cursor, playing or not.
TEST_F(LessonTest, StepButtonsStayPutAcrossLessonNotes) {
  viewer::Model model(context());
  model.load(viewer::make_preset("falling-rising", FLASHVK_ASSETS));
  viewer::Lesson lesson = viewer::lesson_for(model);
  ImGuiFrames imgui;
  for (auto [width, height] : {std::pair{1280.0f, 720.0f}, std::pair{1920.0f, 1080.0f}}) {
    imgui.size(width, height);
    viewer::UiState ui;
    std::vector<int> steps = {5};  // a step with no note, then each point's
    for (const auto& p : lesson.points) steps.push_back(p.step);
    std::array<std::array<float, 4>, 5> first{};
    for (size_t k = 0; k <= steps.size(); ++k) {
      model.cursor = k < steps.size() ? steps[k] : 5;
      ui.playing = k == steps.size();  // and "Pause" in Play's place
      for (int frame = 0; frame < 2; ++frame) imgui.frame([&] { viewer::draw_ui(model, ui, 0.0); });
      for (int b = 0; b < 5; ++b) {
        float rect[4];
        ASSERT_TRUE(viewer::step_button_rect(b, rect)) << b;
        if (k == 0) {
          std::copy(rect, rect + 4, first[size_t(b)].begin());
          continue;
        }
        for (int c = 0; c < 4; ++c)
          EXPECT_EQ(rect[c], first[size_t(b)][size_t(c)])
              << "button " << b << " at step " << model.cursor << ", " << width;
      }
    }
  }
}

// falling-rising's point where the paper's FLASH-D fails shows a weight of ~1e-27 beside 0:
// arriving there (a button, a step, --step) puts the weight plot on a log scale once; a click
// back to linear stays while the cursor does; playing through the point changes nothing.
TEST_F(LessonTest, ThePaperFormsFailureShowsItsWeightOnALogScale) {
  viewer::Model model(context());
  model.load(viewer::make_preset("falling-rising", FLASHVK_ASSETS));
  viewer::Lesson lesson = viewer::lesson_for(model);
  int fail = viewer::literal_flashd_underflow(model);
  ASSERT_GE(fail, 0);
  const viewer::PointOfInterest* p = point_at(lesson, fail);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(p->log_weights);
  ASSERT_GT(model.ref_of(Variant::flashd).w[size_t(fail)], 1e-30) << "the true weight is there";
  for (const auto& other : lesson.points) {
    EXPECT_EQ(other.log_weights, other.step == fail) << other.title;
  }
  ImGuiFrames imgui;
  viewer::UiState ui;
  auto frame_at = [&](int step) {
    model.cursor = step;
    imgui.frame([&] { viewer::draw_ui(model, ui, 0.0); });
  };
  frame_at(5);
  EXPECT_FALSE(ui.log_w);
  frame_at(fail);
  EXPECT_TRUE(ui.log_w) << "arriving at step " << fail;
  ui.log_w = false;  // the click on the plot
  frame_at(fail);
  EXPECT_FALSE(ui.log_w) << "the click stays while the cursor does";
  frame_at(5);
  frame_at(fail);
  EXPECT_TRUE(ui.log_w) << "arriving again";
  ui.log_w = false;
  frame_at(5);
  ui.playing = true;
  frame_at(fail);
  EXPECT_FALSE(ui.log_w) << "playing through";
}

// A window's first frames come while the worker traces what it opened with (draw_opening):
// the model says what it traces until the trace is shown, and the frames go on meanwhile.
TEST_F(LessonTest, TheWindowDrawsWhileItsFirstTraceRuns) {
  viewer::Model model(context());
  viewer::Request first;
  first.inputs = viewer::make_preset("falling-rising", FLASHVK_ASSETS);
  first.selected = {Variant::flash2, Variant::flashd};
  first.fresh = true;
  model.submit(std::move(first));
  EXPECT_TRUE(model.busy());
  EXPECT_EQ(model.progress().rfind("falling-rising, row ", 0), 0u) << model.progress();
  {
    ImGuiFrames imgui;
    do {  // at least one frame, however fast the device
      imgui.frame([&] { viewer::draw_opening(model); });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } while (!model.poll());
  }
  EXPECT_FALSE(model.busy());
  EXPECT_EQ(model.progress(), "");
  EXPECT_EQ(model.steps(), 240);
  EXPECT_EQ(model.traces().size(), 2u);
  // Closing the window: a request in flight and one waiting are dropped, what is shown stays.
  viewer::Request next = model.wanted();
  next.row = 0;
  model.submit(next);
  model.submit(next);
  model.wait();
  EXPECT_FALSE(model.busy());
  EXPECT_FALSE(model.poll());
  EXPECT_EQ(model.steps(), 240);
}

// The keyboard: arrows step one key and stop playback, space plays and pauses (not past the end).
TEST_F(LessonTest, ArrowsStepAndSpacePlays) {
  viewer::Model model(context());
  model.load(viewer::make_preset("falling-rising", FLASHVK_ASSETS));
  viewer::UiState ui;
  model.cursor = 10;
  viewer::step_keys(model, ui, false, true, false);
  EXPECT_EQ(model.cursor, 11);
  viewer::step_keys(model, ui, true, false, false);
  viewer::step_keys(model, ui, true, false, false);
  EXPECT_EQ(model.cursor, 9);
  viewer::step_keys(model, ui, false, false, true);
  EXPECT_TRUE(ui.playing);
  viewer::advance_playback(model, ui, 0.5);  // 20 steps/s
  EXPECT_EQ(model.cursor, 19);
  viewer::step_keys(model, ui, false, true, false);
  EXPECT_FALSE(ui.playing);
  EXPECT_EQ(model.cursor, 20);
  model.cursor = 0;
  viewer::step_keys(model, ui, true, false, false);
  EXPECT_EQ(model.cursor, 0);
  model.cursor = model.steps() - 1;
  viewer::step_keys(model, ui, false, true, true);
  EXPECT_EQ(model.cursor, model.steps() - 1);
  EXPECT_FALSE(ui.playing) << "nothing to play after the last key";
}

// A double click shows the whole row, however long, until the next zoom; a zoomed plot's y axis
// spans the values of the keys it shows, not the row's.
TEST(Viewer, DoubleClickShowsTheWholeRowAndZoomedPlotsRescale) {
  viewer::UiState ui;
  ui.view_span = 40, ui.view_lo = 100, ui.view_cursor = 120;
  viewer::show_whole_row(ui, 16384);
  for (int cursor : {0, 9000, 16383}) {
    viewer::KeyWindow w = viewer::key_window(16384, cursor, 400.0f, ui);
    EXPECT_EQ(w.lo, 0);
    EXPECT_EQ(w.hi, 16384);
  }
  std::vector<double> falling;  // falling-rising's scores: 0 to -1987.5, then -2000 up to 14.5
  for (int j = 0; j < 160; ++j) falling.push_back(-12.5 * j);
  for (int j = 0; j < 80; ++j) falling.push_back(-2000.0 + 25.5 * j);
  viewer::YRange all = viewer::y_range({&falling}, {}, false);
  EXPECT_EQ(all.lo, -2000.0);
  EXPECT_EQ(all.hi, 14.5);
  viewer::YRange zoom = viewer::y_range({&falling}, {200, 240}, false);
  EXPECT_EQ(zoom.lo, -2000.0 + 25.5 * 40);
  EXPECT_EQ(zoom.hi, -2000.0 + 25.5 * 79);
  std::vector<double> w = {1.0, 0.5, 0.0, 1e-27, 2e-27, 0.0};  // a log axis: the positive ones
  viewer::YRange tiny = viewer::y_range({&w}, {2, 6}, true);
  EXPECT_DOUBLE_EQ(tiny.lo, 1e-27);
  EXPECT_DOUBLE_EQ(tiny.hi, 2e-27);
  // A log axis stops at 1e-30 (fp32's edge), not at float64's subnormals (falling-rising's
  // float64 weights reach 1.4e-315).
  std::vector<double> deep = {1.0, 1.4e-315, 1e-200, 1e-27};
  viewer::YRange floor = viewer::y_range({&deep}, {0, 4}, true);
  EXPECT_NEAR(std::log10(floor.lo), -30.0, 1e-9);
  EXPECT_DOUBLE_EQ(floor.hi, 1.0);
}

// --step places the cursor in a window as headless (open_at_step), clamped to the row.
TEST_F(LessonTest, StepOpensWhereAsked) {
  viewer::Model model(context());
  model.load(viewer::make_preset("falling-rising", FLASHVK_ASSETS));
  EXPECT_EQ(model.cursor, 239);
  viewer::open_at_step(model, 0);
  EXPECT_EQ(model.cursor, 0);
  viewer::open_at_step(model, 100000);
  EXPECT_EQ(model.cursor, 239);
}

// A change of row is traced on the worker while frames are drawn: --then-row reports it and the
// summary then describes the new row (the time is printed, not judged).
TEST(Viewer, ThenRowTracesTheNewRowWhileFramesGoOn) {
  std::string out;
  screenshot("--preset sample --variant flash2,flashd --then-row 7", &out);
  int from = -1, to = -1, frames = -1;
  double secs = -1;
  size_t at = out.find("row change: ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.c_str() + at, "row change: row %d to %d in %lf s, %d frames", &from,
                        &to, &secs, &frames),
            4)
      << out;
  EXPECT_EQ(from, 20);
  EXPECT_EQ(to, 7);
  EXPECT_GE(frames, 1);
  EXPECT_NE(out.find("row 7 of head 0"), std::string::npos) << out;
  EXPECT_NE(out.find("open: "), std::string::npos) << out;
}

// The variants' colours stay apart for the common colour-vision deficiencies: simulated with
// Machado, Oliveira and Fernandes (2009) at full severity in linear RGB, every pair is at least
// 10 apart in CIELAB (and in normal vision too).
TEST(Viewer, VariantColoursStayApartForColourBlindEyes) {
  auto linear = [](double c) {
    c /= 255.0;
    return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
  };
  auto lab = [](const std::array<double, 3>& rgb) {  // linear sRGB (D65) to CIELAB
    double x = 0.4124 * rgb[0] + 0.3576 * rgb[1] + 0.1805 * rgb[2];
    double y = 0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2];
    double z = 0.0193 * rgb[0] + 0.1192 * rgb[1] + 0.9505 * rgb[2];
    auto f = [](double t) { return t > 0.008856 ? std::cbrt(t) : 7.787 * t + 16.0 / 116.0; };
    double fx = f(x / 0.95047), fy = f(y), fz = f(z / 1.08883);
    return std::array<double, 3>{116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)};
  };
  using Matrix = std::array<std::array<double, 3>, 3>;
  const Matrix kNormal = {{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}};
  const Matrix kProtanopia = {{{0.152286, 1.052583, -0.204868},
                               {0.114503, 0.786281, 0.099216},
                               {-0.003882, -0.048116, 1.051998}}};
  const Matrix kDeuteranopia = {{{0.367322, 0.860646, -0.227968},
                                 {0.280085, 0.672501, 0.047413},
                                 {-0.011820, 0.042940, 0.968881}}};
  const Matrix kTritanopia = {{{1.255528, -0.076749, -0.178779},
                               {-0.078411, 0.930809, 0.147602},
                               {0.004733, 0.691367, 0.303900}}};
  for (const Matrix* m : {&kNormal, &kProtanopia, &kDeuteranopia, &kTritanopia}) {
    std::vector<std::array<double, 3>> seen;
    for (Variant v : all_variants()) {
      uint32_t c = viewer::variant_color(v);  // 0xAABBGGRR
      std::array<double, 3> rgb = {linear(c & 0xff), linear((c >> 8) & 0xff),
                                   linear((c >> 16) & 0xff)},
                            sim{};
      for (int r = 0; r < 3; ++r)
        for (int k = 0; k < 3; ++k) sim[r] += (*m)[r][k] * rgb[k];
      for (double& x : sim) x = std::clamp(x, 0.0, 1.0);
      seen.push_back(lab(sim));
    }
    for (size_t a = 0; a < seen.size(); ++a)
      for (size_t b = a + 1; b < seen.size(); ++b) {
        double d =
            std::hypot(seen[a][0] - seen[b][0], seen[a][1] - seen[b][1], seen[a][2] - seen[b][2]);
        EXPECT_GE(d, 10.0) << variant_name(all_variants()[a]) << " and "
                           << variant_name(all_variants()[b]) << ", matrix "
                           << (m == &kNormal         ? "normal"
                               : m == &kProtanopia   ? "protanopia"
                               : m == &kDeuteranopia ? "deuteranopia"
                                                     : "tritanopia");
      }
  }
}

// falling-rising: scores -12.5 j fall for 160 keys. In fp32 the seed's w_8 = 1 / (1 + e^100)
// is 0 (e^100 > FLT_MAX), so ln w = -inf and every later literal w stays 0; the true weight
// first exceeds 1e-30 at key 236 (s = -62 against the first key's 0), where the kernel's
// flashd has it and the literal form does not.
TEST_F(LessonTest, FallingRisingShowsWhereTheLiteralFlashDFails) {
  viewer::Model model(context());
  model.selected = {Variant::flashd};
  model.load(viewer::make_preset("falling-rising", FLASHVK_ASSETS));
  const auto& literal = model.literal_flashd().w;
  EXPECT_EQ(viewer::literal_flashd_zero(model), 8);
  EXPECT_GT(literal[7], 0.0);
  EXPECT_EQ(literal[8], 0.0);
  EXPECT_EQ(viewer::literal_flashd_underflow(model), 236);
  for (size_t i = 8; i < literal.size(); ++i) EXPECT_EQ(literal[i], 0.0) << i;
  viewer::Lesson lesson = viewer::lesson_for(model);
  ASSERT_NE(point_at(lesson, 8), nullptr);
  ASSERT_NE(point_at(lesson, 236), nullptr);
  const auto& gpu = model.traces().at(0).gpu.steps.w;
  double exact = std::exp(-62.0) / (1.0 + std::exp(-62.0) + std::exp(-87.5));  // keys 0, 236, 235
  EXPECT_NEAR(gpu[236], exact, exact * 1e-3) << "the kernel's stable form keeps the weight";
  EXPECT_GT(gpu.back(), 0.99f);
  model.literal_flashd_shown = true;  // "run to the next underflow" then stops there
  model.cursor = 9;
  EXPECT_EQ(model.find(viewer::Jump::underflow, +1), 236);
}

TEST_F(LessonTest, OtherPresetsPointWhereTheirEventsAre) {
  auto lesson_of = [&](const char* preset, viewer::Model& model) {
    model.selected = {Variant::flash1, Variant::splitkv};
    model.load(viewer::make_preset(preset, FLASHVK_ASSETS));
    return viewer::lesson_for(model);
  };
  {  // e^s passes fp16's 65504 at the first score above ln 65504, computed here from the formula
    viewer::Model model(context());
    viewer::Lesson lesson = lesson_of("fp16-overflow", model);
    int first = -1;
    for (int j = 0; j < 200 && first < 0; ++j)
      if (16.0 * std::sin(0.05 * j) * std::sin(0.011 * j) > std::log(65504.0)) first = j;
    ASSERT_GT(first, 0);
    EXPECT_NE(point_at(lesson, first), nullptr) << first;
  }
  {  // the largest rescale of the sample row is a step where flash1's m rises on the GPU
    viewer::Model model(context());
    viewer::Lesson lesson = lesson_of("sample", model);
    bool found = false;
    for (const auto& p : lesson.points)
      if (p.title.find("rescale") != std::string::npos) {
        const auto& m = model.traces().at(0).gpu.steps.m;
        EXPECT_GT(m[size_t(p.step)], m[size_t(p.step - 1)]);
        found = true;
      }
    EXPECT_TRUE(found);
  }
  {  // empty-split: keys 64..127 are masked, the second of four chunks reports m = -inf
    viewer::Model model(context());
    viewer::Lesson lesson = lesson_of("empty-split", model);
    EXPECT_NE(point_at(lesson, 64), nullptr);
    const auto& splits = model.traces().at(1).gpu.splits;
    ASSERT_EQ(splits.size(), 4u);
    EXPECT_EQ(splits[1].begin, 64u);
    EXPECT_TRUE(std::isinf(splits[1].m) && splits[1].m < 0);
    viewer::Model flash2_only(context());  // the preset selects splitkv when it is not
    flash2_only.selected = {Variant::flash2};
    flash2_only.load(viewer::make_preset("empty-split", FLASHVK_ASSETS));
    EXPECT_EQ(flash2_only.selected, (std::vector<Variant>{Variant::flash2, Variant::splitkv}));
  }
  {  // masked-mid-row: the block of masked keys starts at 40
    viewer::Model model(context());
    viewer::Lesson lesson = lesson_of("masked-mid-row", model);
    EXPECT_NE(point_at(lesson, 40), nullptr);
    EXPECT_NE(point_at(lesson, 0), nullptr);
  }
  {  // fully-masked-row: row 3 of 40 queries over 24 keys, causal, sees no key
    viewer::Model model(context());
    viewer::Lesson lesson = lesson_of("fully-masked-row", model);
    for (double s : model.scores()) EXPECT_TRUE(std::isinf(s));
    EXPECT_NE(lesson.points.front().title.find("no key"), std::string::npos);
  }
}

TEST(Viewer, BadOptionsAreRefused) {
  std::string cmd = std::string(FLASHVK_VIEWER) + " --headless --preset nope 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  char buf[512] = {0};
  size_t n = fread(buf, 1, sizeof buf - 1, pipe);
  int status = pclose(pipe);
  EXPECT_NE(WEXITSTATUS(status), 0);
  EXPECT_NE(std::string(buf, n).find("unknown preset 'nope'"), std::string::npos);
}

TEST(Viewer, PlayOptionsAreChecked) {
  for (auto [args, says] : {std::pair<const char*, const char*>{"--headless --play 10 --speed 0",
                                                                "--speed must be a number"},
                            {"--headless --play 0", "--play"},
                            {"--play 10 --screenshot x.png", "--play is for --headless"}}) {
    std::string cmd = std::string(FLASHVK_VIEWER) + " " + args + " 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    char buf[512] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, pipe);
    int status = pclose(pipe);
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
    EXPECT_NE(std::string(buf, n).find(says), std::string::npos) << args << ": " << buf;
  }
}

}  // namespace
}  // namespace flashvk::test
