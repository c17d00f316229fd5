// flashvk-viewer: step through the FlashAttention family on real GPU traces.
#include <imgui.h>
#include <imgui_impl_vulkan.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <sstream>
#include <thread>

#include "args.hpp"
#include "npy.hpp"
#include "render.hpp"
#include "window.hpp"

namespace flashvk::viewer {
namespace {

const char* kHelp = R"(usage: flashvk-viewer [options]

Opens the viewer on the shipped sample. With --headless (or when there is no display) it renders
one frame offscreen through Vulkan, writes it as PNG and prints a summary.

options:
  --preset NAME       one of the presets listed below (default sample)
  --q Q.npy --k K.npy --v V.npy   load inputs instead of a preset
  --variant A,B,...   variants to step together (default flash1,flash2,flashd)
  --row R             query row to trace (default: the preset's)
  --step N            step cursor: the state after key N (default: the row's last visible key)
  --causal            causal mask (over a preset's inputs or the files')
  --score-mod FILE --mask-mod FILE --mod-table FILE
                      your own score_mod / mask_mod in GLSL and their flex_table (as for
                      `flashvk run`), over a preset's inputs or the files'; the float64
                      reference takes their values as the device computes them (fp32)
  --headless          render offscreen, no window
  --screenshot FILE   the PNG to write (headless; default viewer.png)
  --size WxH          headless image size (default 1600x1000)
  --play N            headless: then play N frames (1/60 s each) from the cursor, as the Play
                      button does, and print each frame's time (median, slowest); the PNG is
                      the last frame
  --speed S           playback speed in steps per second, 1 to 500 (default 20, as the slider)
  --then-row R        headless: after the first frame ask for query row R as the slider does,
                      drawing frames while the worker traces it, and print how long it took
  --assets DIR        folder with sample/ (default: assets next to the build, or ./assets)
  --device N          Vulkan device index

example:
  flashvk-viewer --headless --screenshot out.png --preset falling-rising --variant flash2,flashd
)";

// The usage text and the presets, each with what it shows (presets.def).
std::string help() {
  std::string text = std::string(kHelp) + "\npresets:\n";
  for (const std::string& name : preset_names())
    text += "  " + name + std::string(name.size() < 18 ? 18 - name.size() : 1, ' ') +
            preset_description(name) + "\n";
  return text;
}

std::vector<Variant> parse_variants(const std::string& list) {
  std::vector<Variant> out;
  std::stringstream ss(list);
  std::string name;
  while (std::getline(ss, name, ',')) {
    try {
      out.push_back(parse_variant(name));
    } catch (const Error& e) {
      throw cli::UsageError{std::string("--variant: ") + e.what()};
    }
  }
  if (out.empty()) throw cli::UsageError{"--variant needs at least one variant"};
  return out;
}

struct Options {
  Inputs inputs;
  UiState ui;
  std::vector<Variant> variants = {Variant::flash1, Variant::flash2, Variant::flashd};
  int step = -1, device = -1, play = 0, then_row = -1;
  bool headless = false;
  std::string window_screenshot;  // --screenshot without --headless: save the window, then exit
  std::string screenshot = "viewer.png";
  uint32_t width = 1600, height = 1000;
};

Options parse(const std::vector<std::string>& argv) {
  cli::Args args(argv,
                 {"preset", "q", "k", "v", "variant", "row", "step", "screenshot", "size", "assets",
                  "device", "play", "speed", "then-row", "score-mod", "mask-mod", "mod-table"},
                 {"headless", "causal"});
  Options o;
  o.ui.assets = args.text("assets", FLASHVK_ASSETS);
  o.headless = args.flag("headless");
  o.screenshot = args.text("screenshot", o.screenshot);
  if (!o.headless && args.has("screenshot")) o.window_screenshot = o.screenshot;
  o.device = int(args.integer("device", -1, 0, 1 << 20));
  o.step = int(args.integer("step", -1, 0, INT32_MAX));
  o.play = int(args.integer("play", 0, 1, 100000));
  if (args.has("speed")) {
    const std::string text = args.text("speed");
    char* end = nullptr;
    double speed = std::strtod(text.c_str(), &end);
    if (end == text.c_str() || *end != '\0' || !(speed >= 1 && speed <= 500))
      throw cli::UsageError{"--speed must be a number of steps per second from 1 to 500, got '" +
                            text + "'"};
    o.ui.speed = float(speed);
  }
  if (o.play && !o.headless) throw cli::UsageError{"--play is for --headless"};
  if (args.has("then-row") && !o.headless) throw cli::UsageError{"--then-row is for --headless"};
  if (args.has("variant")) o.variants = parse_variants(args.text("variant"));
  if (args.has("size")) {
    unsigned w = 0, h = 0;
    if (std::sscanf(args.text("size").c_str(), "%ux%u", &w, &h) != 2 || w < 800 || h < 600 ||
        w > 8192 || h > 8192)
      throw cli::UsageError{"--size must be WxH between 800x600 and 8192x8192, got '" +
                            args.text("size") + "'"};
    o.width = w, o.height = h;
  }
  if (args.has("q") || args.has("k") || args.has("v")) {
    o.inputs.name = "files";
    o.inputs.q = npy::read(args.required("q"), "Q");
    o.inputs.k = npy::read(args.required("k"), "K");
    o.inputs.v = npy::read(args.required("v"), "V");
    o.inputs.params.mods.causal = args.flag("causal");
  } else {
    std::string preset = args.text("preset", "sample");
    o.inputs = make_preset(preset, o.ui.assets);
    const auto& names = preset_names();
    o.ui.preset = int(std::find(names.begin(), names.end(), preset) - names.begin());
  }
  // The user's own functions, over a preset's or the files' inputs: the reference takes their
  // values from the device (flex::DeviceTwins), so a preset's C++ twins give way.
  Modifiers& mods = o.inputs.params.mods;
  if (args.has("mod-table")) mods.flex_table = {};
  cli::modifier_options(args, mods);
  if (args.has("score-mod") || args.has("mod-table")) mods.score_twin = nullptr;
  if (args.has("mask-mod") || args.has("mod-table")) mods.mask_twin = nullptr;
  if (args.has("score-mod") || args.has("mask-mod") || args.has("mod-table"))
    o.inputs.name += " with " + modifier_text(mods);
  Dims d = check_shapes(o.inputs.q.shape, o.inputs.k.shape, o.inputs.v.shape);
  if (args.has("row")) {
    auto row = args.integer("row", 0, 0, int64_t(d.nq) - 1);
    o.inputs.row = uint32_t(row);
  }
  if (args.has("then-row")) o.then_row = int(args.integer("then-row", 0, 0, int64_t(d.nq) - 1));
  return o;
}

// Headless playback (--play): the frames' times and the keys they went through.
struct Playback {
  int frames = 0, from = 0, to = 0;
  float speed = 0;
  double median_ms = 0, slowest_ms = 0;
};

// Headless timings: from the inputs read to the first frame; --then-row's change of row.
struct Timings {
  double open_s = 0;
  int row_from = -1, row_to = -1, row_frames = 0;
  double row_s = 0;
};

void print_summary(const Model& model, const std::string& path, KeyWindow plots, double frame_ms,
                   const Playback& play, const Timings& times) {
  const Dims& d = model.dims();
  std::printf("flashvk-viewer: %s on %s\n", model.inputs().name.c_str(),
              model.context().device().name.c_str());
  std::printf("  input B=%u H=%u Nq=%u Nk=%u d=%u dv=%u%s, row %u of head %u, step %d of %d\n",
              d.batch, d.heads, d.nq, d.nk, d.d, d.dv,
              model.inputs().params.mods.causal ? " causal" : "", model.row, model.head,
              model.cursor, model.steps() - 1);
  for (const auto& t : model.traces()) {
    double err = 0;
    for (size_t c = 0; c < model.direct().out.size(); ++c)
      err = std::max(err, std::abs(double(t.gpu.out[c]) - model.direct().out[c]));
    int rescales = 0, underflows = 0;
    for (size_t i = 1; i < t.gpu.steps.size(); ++i)
      rescales += t.gpu.steps.m[i] > t.gpu.steps.m[i - 1] && std::isfinite(t.gpu.steps.m[i - 1]);
    for (size_t i = 0; i < t.gpu.steps.size(); ++i)
      underflows += t.gpu.steps.w[i] == 0.0f && t.ref.w[i] > kUnderflowFloor;  // as Model::find
    std::printf(
        "  %-8s output error vs float64 %.2e, %u tiles of %u keys, %d rescales of m, %d weight "
        "underflows\n",
        variant_name(t.variant), err, unsigned(t.gpu.tiles.size()), t.gpu.tile_size, rescales,
        underflows);
  }
  const Storage& st = model.inputs().storage;
  if (st.q != DType::f32 || st.k != DType::f32 || st.v != DType::f32)
    std::printf(
        "  storage %s: moves the float64 output by %.2e from the inputs as given (fp16: "
        "%.2e); the errors above are against float64 on the stored values\n",
        cli::storage_text(st).c_str(), model.storage_cost(), model.fp16_cost());
  Lesson lesson = lesson_for(model);
  std::printf("  lesson: %zu points of interest", lesson.points.size());
  for (const auto& p : lesson.points)
    std::printf("%s step %d (%s)", &p == lesson.points.data() ? ":" : ",", p.step, p.title.c_str());
  std::printf("\n");
  // What the step plots show, as the interactive viewer would with the cursor on this step.
  std::printf("  plots: keys %d-%d of %d\n", plots.lo, plots.hi - 1, model.steps());
  std::printf("  frame: %.1f ms to draw and render (the last of 3)\n", frame_ms);
  std::printf("  open: %.2f s from the inputs read to the first frame\n", times.open_s);
  if (times.row_to >= 0)
    std::printf("  row change: row %d to %d in %.2f s, %d frames drawn meanwhile\n", times.row_from,
                times.row_to, times.row_s, times.row_frames);
  if (play.frames)
    std::printf(
        "  play: %d frames at %.0f steps/s, keys %d to %d: %.1f ms a frame (median), %.1f ms "
        "the slowest\n",
        play.frames, double(play.speed), play.from, play.to, play.median_ms, play.slowest_ms);
  const auto& overflows = layout_overflows();
  if (overflows.empty()) std::printf("  layout: every panel's text fits its width\n");
  for (const auto& o : overflows) std::printf("  layout: %s\n", o.c_str());
  if (!model.last_error.empty()) std::printf("  error: %s\n", model.last_error.c_str());
  std::printf("  wrote %s\n", path.c_str());
}

int run_headless(Options& o) {
  auto opened = std::chrono::steady_clock::now();
  Device dev({}, false, o.device);
  Context ctx = Context::adopt(dev.external());  // the engine runs on the viewer's own device
  Model model(ctx);
  model.selected = o.variants;
  model.load(std::move(o.inputs));
  open_at_step(model, o.step);
  Offscreen target(dev, o.width, o.height, VK_FORMAT_R8G8B8A8_UNORM);
  ImGui::CreateContext();
  ImGuiIO& io = ImGui::GetIO();
  io.IniFilename = nullptr;
  io.DisplaySize = ImVec2(float(o.width), float(o.height));
  ImGui::StyleColorsDark();
  init_imgui_vulkan(dev, target.render_pass(), 2);
  std::vector<uint8_t> pixels;
  double frame_ms = 0;
  // One frame: the panels drawn (playback advanced by dt) and rendered, its time in ms.
  auto frame = [&](double dt, bool render) {
    auto start = std::chrono::steady_clock::now();
    io.DeltaTime = 1.0f / 60.0f;
    ImGui_ImplVulkan_NewFrame();
    ImGui::NewFrame();
    draw_ui(model, o.ui, dt);
    ImGui::Render();
    if (render) pixels = target.render();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
  };
  for (int i = 0; i < 3; ++i)  // auto-sized widgets settle after a frame or two
    frame_ms = frame(0.0, i == 2);
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  Timings timing;
  timing.open_s = since(opened);
  if (o.then_row >= 0) {  // as the row slider: the worker traces, the frames go on meanwhile
    timing.row_from = int(model.row), timing.row_to = o.then_row;
    auto asked = std::chrono::steady_clock::now();
    Request r = model.wanted();
    r.row = uint32_t(o.then_row);
    model.submit(std::move(r));
    while (model.busy()) {  // drawn as the window draws while busy (kBusyFrame apart)
      frame(0.0, false);
      ++timing.row_frames;
      std::this_thread::sleep_for(std::chrono::duration<double>(kBusyFrame));
    }
    timing.row_s = since(asked);
    for (int i = 0; i < 2; ++i) frame(0.0, i == 1);
  }
  Playback play;
  if (o.play) {  // as the Play button: the cursor moves speed / 60 keys a frame
    play.frames = o.play, play.from = model.cursor, play.speed = o.ui.speed;
    o.ui.playing = true;
    std::vector<double> times;
    for (int i = 0; i < o.play; ++i) times.push_back(frame(1.0 / 60.0, true));
    play.to = model.cursor;
    std::sort(times.begin(), times.end());
    play.median_ms = times[times.size() / 2];
    play.slowest_ms = times.back();
  }
  write_png(o.screenshot, pixels, o.width, o.height);
  print_summary(model, o.screenshot,
                key_window(model.steps(), model.cursor, plot_pixels(float(o.width)), o.ui),
                frame_ms, play, timing);
  ImGui_ImplVulkan_Shutdown();
  ImGui::DestroyContext();
  return 0;
}

int run(int argc, char** argv) {
  std::vector<std::string> argv_list(argv + 1, argv + argc);
  for (const auto& a : argv_list)
    if (a == "--help" || a == "-h") return std::cout << help(), 0;
  Options o = parse(argv_list);
  if (!o.headless && !display_available()) {
    std::fprintf(stderr, "flashvk-viewer: no display; rendering headless to %s\n",
                 o.screenshot.c_str());
    o.headless = true;
  }
  if (o.headless) return run_headless(o);
  return run_window(o.device, std::move(o.inputs), o.ui, o.variants, o.step, o.window_screenshot);
}

}  // namespace
}  // namespace flashvk::viewer

int main(int argc, char** argv) {
  try {
    return flashvk::viewer::run(argc, argv);
  } catch (const flashvk::cli::UsageError& e) {
    std::fprintf(stderr, "flashvk-viewer: error: %s\n", e.message.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashvk-viewer: error: %s\n", e.what());
    return 1;
  }
}
