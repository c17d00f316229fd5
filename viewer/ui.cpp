#include "ui.hpp"

#include <imgui.h>
#include <imgui_internal.h>  // the windows' extents, to check that their content fits

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "args.hpp"
#include "npy.hpp"

namespace flashvk::viewer {
namespace {

const char* kPanels[] = {"Whole window", "Controls", "Plots", "Heatmap", "Derivation", "Output"};
std::map<int, ImVec4> g_panel_rects;
std::vector<std::string> g_overflows;
std::array<ImRect, 5> g_step_buttons;  // |< < Play > >| as drawn in the last frame

}  // namespace

uint32_t variant_color(Variant v) {
  switch (v) {
    // Okabe and Ito's palette, told apart with the common colour-vision deficiencies too.
    case Variant::naive:
      return IM_COL32(110, 110, 110, 255);  // grey, darker than the float64 reference's white
    case Variant::online:
      return IM_COL32(40, 130, 210, 255);  // blue, lightened for the dark background
    case Variant::flash1:
      return IM_COL32(86, 180, 233, 255);  // sky blue
    case Variant::flash2:
      return IM_COL32(0, 158, 115, 255);  // bluish green
    case Variant::flashd:
      return IM_COL32(204, 121, 167, 255);  // reddish purple
    case Variant::splitkv:
      return IM_COL32(230, 159, 0, 255);  // orange
  }
  return IM_COL32_WHITE;
}

namespace {
const ImU32 kReference = IM_COL32(255, 255, 255, 200);
const ImU32 kCursor = IM_COL32(255, 220, 0, 255);
const ImU32 kLiteral = IM_COL32(255, 90, 90, 255);     // FLASH-D in the paper's form
const ImU32 kSinkShare = IM_COL32(205, 165, 95, 255);  // an attention sink's share

void wrapped_tooltip(const char* text) {
  ImGui::BeginTooltip();
  ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
  ImGui::TextUnformatted(text);
  ImGui::PopTextWrapPos();
  ImGui::EndTooltip();
}

// What the item just drawn does, shown on hover.
void tip(const char* text) {
  if (ImGui::IsItemHovered()) wrapped_tooltip(text);
}

void help_marker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  tip(text);
}

// Before an item of width `w`: on the same line as the last item if it still fits there.
void flow(float w) {
  float right = ImGui::GetItemRectMax().x + ImGui::GetStyle().ItemSpacing.x + w;
  if (right <= ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x) ImGui::SameLine();
}

float button_width(const char* label) {
  return ImGui::CalcTextSize(label, nullptr, true).x + 2 * ImGui::GetStyle().FramePadding.x;
}

// Text wrapped at spaces only (ImGui's own wrapping also breaks after '.', splitting numbers
// such as 1.19e-27 over two lines); a continuation line keeps the first line's indentation.
void wrap_lines(const char* text) {
  float width = ImGui::GetContentRegionAvail().x;
  std::string s = text, indent = s.substr(0, s.find_first_not_of(' '));
  if (indent.size() == s.size()) indent.clear();
  std::string line;
  size_t at = 0;
  while (at < s.size()) {
    size_t space = s.find(' ', at + 1);
    std::string word = s.substr(at, space == std::string::npos ? std::string::npos : space - at);
    std::string next = line + word;
    if (!line.empty() && line != indent && ImGui::CalcTextSize(next.c_str()).x > width) {
      ImGui::TextUnformatted(line.c_str());
      size_t start = word.find_first_not_of(' ');
      line = indent + (start == std::string::npos ? "" : word.substr(start));
    } else {
      line = next;
    }
    // A word wider than the line (a long path) is cut where the line ends, not left to run out.
    while (line.size() > 1 && ImGui::CalcTextSize(line.c_str()).x > width) {
      size_t fit = line.size() - 1;
      while (fit > 1 && ImGui::CalcTextSize(line.c_str(), line.c_str() + fit).x > width) --fit;
      if (fit <= indent.size()) break;  // not even the indentation fits: leave it
      ImGui::TextUnformatted(line.c_str(), line.c_str() + fit);
      line = indent + line.substr(fit);
    }
    at = space == std::string::npos ? s.size() : space;
  }
  ImGui::TextUnformatted(line.c_str());
}

void wrapped(const char* fmt, ...) IM_FMTARGS(1);
void wrapped(const char* fmt, ...) {
  char buf[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  wrap_lines(buf);
}

void colored_wrapped(ImU32 color, const char* fmt, ...) IM_FMTARGS(2);
void colored_wrapped(ImU32 color, const char* fmt, ...) {
  char buf[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(color));
  wrap_lines(buf);
  ImGui::PopStyleColor();
}

void disabled_wrapped(const char* text) {
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  wrap_lines(text);
  ImGui::PopStyleColor();
}

bool begin_panel(int index, float x, float y, float w, float h) {
  ImGui::SetNextWindowPos(ImVec2(x, y), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(w, h), ImGuiCond_Always);
  g_panel_rects[index] = ImVec4(x, y, w, h);
  return ImGui::Begin(
      kPanels[index], nullptr,
      ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoCollapse);
}

// Ends a panel, noting it if anything drawn in it reached past its right edge (panels scroll
// vertically; nothing may be cut at the side).
void end_panel(int index) {
  ImGuiWindow* w = ImGui::GetCurrentWindow();
  float over = w->DC.CursorMaxPos.x - w->WorkRect.Max.x;
  if (over > 1.0f)
    g_overflows.push_back(std::string(kPanels[index]) + ": content " +
                          std::to_string(int(std::ceil(over))) + " px wider than the panel");
  ImGui::End();
}

// Numbers as a person writes them: 1, 9.3, -2000, 0.531; tiny and huge ones as 1e-05.
std::string number(double v) {
  char buf[48];
  double a = std::abs(v);
  if (a == 0 || (a >= 1e-3 && a < 1e6)) {
    int decimals = a == 0 ? 0 : std::clamp(3 - int(std::floor(std::log10(a))), 0, 6);
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    std::string t = buf;
    if (t.find('.') != std::string::npos) {
      t.erase(t.find_last_not_of('0') + 1);
      if (t.back() == '.') t.pop_back();
    }
    return t == "-0" ? "0" : t;
  }
  std::snprintf(buf, sizeof buf, "%.2g", v);
  return buf;
}

}  // namespace

YRange y_range(const std::vector<const std::vector<double>*>& series, KeyWindow win, bool log_y,
               double hline) {
  // A log axis reaches down to kUnderflowFloor (1e-30, the edge of fp32), not to float64's
  // subnormals: where values lie below it, the axis starts there and they are drawn on it.
  auto tr = [&](double v) { return log_y ? (v >= kUnderflowFloor ? std::log10(v) : NAN) : v; };
  double lo = INFINITY, hi = -INFINITY;
  bool below = false;
  for (const auto* y : series) {
    int from = win.hi > win.lo ? std::max(0, win.lo) : 0;
    int to = win.hi > win.lo ? std::min(int(y->size()), win.hi) : int(y->size());
    for (int i = from; i < to; ++i) {
      double v = tr((*y)[size_t(i)]);
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
      below |= log_y && (*y)[size_t(i)] > 0 && (*y)[size_t(i)] < kUnderflowFloor;
    }
  }
  if (below && lo <= hi) lo = std::min(lo, std::log10(kUnderflowFloor));
  if (std::isfinite(hline) && std::isfinite(tr(hline)))
    lo = std::min(lo, tr(hline)), hi = std::max(hi, tr(hline));
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
  if (log_y) return {std::pow(10.0, lo), std::pow(10.0, hi)};
  return {lo, hi};
}

namespace {

struct Series {
  std::string label;
  ImU32 color;
  std::vector<double> y;
  bool thin = false;
};

// A line plot over the key index with the cursor marked. NaN and infinities leave gaps.
// A step plot over keys [win.lo, win.hi) of `steps` (the whole range without `win`); with `ui`,
// the mouse wheel zooms it around the key under the mouse, dragging pans it and a double click
// gives the whole row back. On a log axis a value of exactly 0 (no error) is a ring at the floor.
void plot(const char* title, const char* about, const std::vector<Series>& series, int steps,
          int cursor, bool log_y, ImVec2 size, const std::vector<int>& markers = {},
          double hline = NAN, const char* x_label = "key", KeyWindow win = {},
          UiState* ui = nullptr) {
  if (win.hi <= win.lo) win = {0, steps};
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(title, size);
  ImVec2 p1(p0.x + size.x, p0.y + size.y);
  dl->AddRectFilled(p0, p1, IM_COL32(25, 27, 33, 255));
  dl->AddRect(p0, p1, IM_COL32(80, 80, 90, 255));
  auto tr = [&](double v) { return log_y ? (v > 0 ? std::log10(v) : NAN) : v; };
  std::vector<const std::vector<double>*> ys;
  for (const auto& s : series) ys.push_back(&s.y);
  YRange yr = y_range(ys, win, log_y, hline);
  double lo = log_y ? std::log10(yr.lo) : yr.lo, hi = log_y ? std::log10(yr.hi) : yr.hi;
  float pad = 18.0f;
  float x0 = p0.x + 4, x1 = p1.x - 4, y0 = p0.y + pad, y1 = p1.y - 4;
  const int span = win.hi - win.lo;
  auto X = [&](double i) {
    return float(x0 + (x1 - x0) * (span > 1 ? (i - win.lo) / (span - 1) : 0.5));
  };
  auto inside = [&](int i) { return i >= win.lo && i < win.hi; };
  auto Y = [&](double v) {  // on a log axis, values below it on its floor (y_range)
    double t = log_y && tr(v) < lo ? lo : tr(v);
    return float(y1 - (y1 - y0) * (t - lo) / (hi - lo));
  };
  // The title on top; the axis's ends as plain numbers at its top and bottom right.
  ImVec2 title_size = ImGui::CalcTextSize(title);
  if (title_size.x > size.x - 8)
    g_overflows.push_back(std::string("plot '") + title + "': title wider than the plot");
  dl->AddText(ImVec2(p0.x + 4, p0.y + 2), IM_COL32(220, 220, 220, 255), title);
  auto axis_label = [&](double v, float y) {
    std::string text = number(log_y ? std::pow(10.0, v) : v);
    ImVec2 ts = ImGui::CalcTextSize(text.c_str());
    ImVec2 at(x1 - ts.x - 2, y);
    dl->AddRectFilled(ImVec2(at.x - 2, at.y), ImVec2(at.x + ts.x + 2, at.y + ts.y),
                      IM_COL32(25, 27, 33, 255));
    dl->AddText(at, IM_COL32(170, 170, 180, 255), text.c_str());
  };
  if (std::isfinite(hline))
    dl->AddLine(ImVec2(x0, Y(hline)), ImVec2(x1, Y(hline)), IM_COL32(255, 80, 80, 160));
  int stride = std::max(1, span / int(std::max(1.0f, x1 - x0)));
  for (const auto& s : series) {
    bool have = false;
    ImVec2 prev;
    for (int i = win.lo; i < std::min(win.hi, int(s.y.size())); i += stride) {
      double v = s.y[size_t(i)];
      if (log_y && v == 0.0) {  // exactly 0: a ring on the floor, where the log axis cannot go
        dl->AddCircle(ImVec2(X(i), y1 - 3), 3.0f, s.color);
        have = false;
        continue;
      }
      if (!std::isfinite(tr(v))) {
        have = false;
        continue;
      }
      ImVec2 pt(X(i), Y(v));
      if (have)
        dl->AddLine(prev, pt, s.color, s.thin ? 1.0f : 2.0f);
      else if (s.y.size() == 1 || stride > 1)
        dl->AddCircleFilled(pt, 2.0f, s.color);
      prev = pt;
      have = true;
    }
  }
  for (int m : markers)
    if (inside(m))
      dl->AddTriangleFilled(ImVec2(X(m), y0 + 8), ImVec2(X(m) - 4, y0), ImVec2(X(m) + 4, y0),
                            IM_COL32(255, 90, 90, 255));
  if (cursor >= 0 && inside(cursor))
    dl->AddLine(ImVec2(X(cursor), y0), ImVec2(X(cursor), y1), kCursor, 1.5f);
  if (ui && span > 0) {
    ImGuiIO& io = ImGui::GetIO();
    float per_key = (x1 - x0) / float(std::max(1, span - 1));
    if (ImGui::IsItemHovered() && io.MouseWheel != 0.0f) {  // zoom around the key under the mouse
      double at = double(win.lo) + double((io.MousePos.x - x0) / per_key);
      int next = std::clamp(int(std::lround(span * std::pow(0.8, double(io.MouseWheel)))),
                            std::min(steps, 8), steps);
      ui->view_span = next;
      ui->view_lo = int(std::lround(at - (at - win.lo) * next / span));
    }
    if (ImGui::IsItemActive() && io.MouseDelta.x != 0.0f) {  // pan
      ui->view_span = span;
      ui->view_lo = win.lo - int(std::lround(io.MouseDelta.x / per_key));
    }
    if (ImGui::IsItemHovered() && ImGui::IsMouseDoubleClicked(0)) show_whole_row(*ui, steps);
  }
  axis_label(hi, y0);  // over the lines and the cursor, on their own dark box
  axis_label(lo, y1 - 2 * ImGui::GetFontSize());
  // The x axis: the first and last key shown, at the bottom corners.
  auto key_number = [&](int key, bool right) {
    std::string text = std::to_string(key);
    ImVec2 ts = ImGui::CalcTextSize(text.c_str());
    ImVec2 at(right ? x1 - ts.x - 2 : x0 + 2, y1 - ts.y);
    dl->AddRectFilled(ImVec2(at.x - 2, at.y), ImVec2(at.x + ts.x + 2, at.y + ts.y),
                      IM_COL32(25, 27, 33, 255));
    dl->AddText(at, IM_COL32(170, 170, 180, 255), text.c_str());
  };
  if (span > 0) {
    key_number(win.lo, false);
    if (span > 1) key_number(win.hi - 1, true);
  }
  if (ImGui::IsItemHovered() && steps > 0) {
    int i = std::clamp(win.lo + int(std::lround((ImGui::GetIO().MousePos.x - x0) / (x1 - x0) *
                                                float(std::max(0, span - 1)))),
                       0, steps - 1);
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
    ImGui::TextDisabled("%s", about);
    ImGui::PopTextWrapPos();
    ImGui::Text("%s %d", x_label, i);
    for (const auto& s : series)
      if (size_t(i) < s.y.size()) ImGui::Text("%s: %.6g", s.label.c_str(), s.y[size_t(i)]);
    ImGui::EndTooltip();
  }
}

std::vector<double> as_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

// Asks for `r` on the worker thread; what is shown stays until it is done (Model::poll).
void request(Model& model, UiState& ui, Request r) {
  try {
    model.submit(std::move(r));
  } catch (const Error& e) {
    ui.status = e.what();
  }
}

void load(Model& model, UiState& ui, Inputs in) {
  Request r;
  r.inputs = std::move(in);
  r.selected = model.wanted().selected;
  r.fresh = true;
  request(model, ui, std::move(r));
}

// The lesson of what is shown, made again when the inputs or the row change; a preset about
// FLASH-D's literal form turns its curve on.
void refresh_lesson(const Model& model, UiState& ui) {
  std::string of =
      model.inputs().name + "/" + std::to_string(model.batch) + "/" + std::to_string(model.head) +
      "/" + std::to_string(model.row) + "/" + std::to_string(model.steps()) + "/" +
      std::to_string(int(model.inputs().storage.q)) +
      std::to_string(int(model.inputs().storage.k)) +
      std::to_string(model.inputs().params.mods.causal) + std::to_string(model.traces().size()) +
      "/" + std::to_string(model.generation());
  if (of == ui.lesson_of) return;
  bool new_inputs = ui.lesson_of.rfind(model.inputs().name + "/", 0) != 0;
  ui.lesson = lesson_for(model);
  ui.lesson_of = of;
  ui.point = -1;
  if (new_inputs) ui.literal_flashd = ui.lesson.literal_flashd;
}

void go_to_point(Model& model, UiState& ui, int dir) {
  const auto& points = ui.lesson.points;
  int n = int(points.size()), to = -1;
  if (dir > 0) {
    for (int i = 0; i < n && to < 0; ++i)
      if (points[size_t(i)].step > model.cursor ||
          (points[size_t(i)].step == model.cursor && i > ui.point))
        to = i;
  } else {
    for (int i = n - 1; i >= 0 && to < 0; --i)
      if (points[size_t(i)].step < model.cursor ||
          (points[size_t(i)].step == model.cursor && i < ui.point))
        to = i;
  }
  if (to < 0) {
    ui.status = dir > 0 ? "that was the lesson's last point; try another preset or row"
                        : "that was the lesson's first point";
    return;
  }
  ui.point = to;
  model.cursor = points[size_t(to)].step;
  ui.playing = false;
  ui.status.clear();
}

void controls_lesson(Model& model, UiState& ui) {
  const Lesson& lesson = ui.lesson;
  ImGui::Separator();
  ImGui::Text("Lesson");
  wrapped("%s", lesson.intro.c_str());
  if (lesson.points.empty()) return;
  if (ImGui::Button("< previous")) go_to_point(model, ui, -1);
  tip("Moves the step cursor to the previous point of interest of this lesson.");
  flow(button_width("next point of interest >"));
  if (ImGui::Button("next point of interest >")) go_to_point(model, ui, +1);
  tip("Moves the step cursor to the next step worth seeing and says what to look at there.");
  int at = -1;  // the point the cursor is on, if any
  for (int i = 0; i < int(lesson.points.size()); ++i)
    if (lesson.points[size_t(i)].step == model.cursor && (at < 0 || i == ui.point)) at = i;
  if (at >= 0 && lesson.points[size_t(at)].log_weights && !ui.playing &&
      ui.log_point != model.cursor)
    ui.log_w = true;  // once on arriving, by a button, a step or --step; a click undoes it
  ui.log_point = at >= 0 && lesson.points[size_t(at)].log_weights ? model.cursor : -1;
  if (at >= 0) {
    const PointOfInterest& p = lesson.points[size_t(at)];
    colored_wrapped(kCursor, "%d of %zu, step %d: %s", at + 1, lesson.points.size(), p.step,
                    p.title.c_str());
    wrapped("%s", p.look.c_str());
  } else {
    std::string steps;
    for (const auto& p : lesson.points)
      steps += (steps.empty() ? "" : ", ") + std::to_string(p.step);
    ImGui::TextDisabled("%zu points of interest, at steps", lesson.points.size());
    wrapped("%s", steps.c_str());
  }
}

void controls_inputs(Model& model, UiState& ui) {
  const auto& names = preset_names();
  if (ImGui::BeginCombo("preset", model.inputs().name.c_str())) {  // names what is shown
    for (int i = 0; i < int(names.size()); ++i) {
      if (ImGui::Selectable(names[size_t(i)].c_str(), names[size_t(i)] == model.inputs().name)) {
        ui.preset = i;
        try {
          load(model, ui, make_preset(names[size_t(i)], ui.assets));
        } catch (const Error& e) {
          ui.status = e.what();
        }
      }
      if (ImGui::IsItemHovered()) wrapped_tooltip(preset_description(names[size_t(i)]).c_str());
    }
    ImGui::EndCombo();
  }
  tip("Built-in inputs, each with a lesson: cases that break naive code. The sample is the one "
      "in assets/sample.");
  std::string about = preset_description(model.inputs().name);
  if (!about.empty()) wrapped("%s", about.c_str());
}

void controls_other_inputs(Model& model, UiState& ui) {
  if (ImGui::CollapsingHeader("Random input")) {
    RandomSpec& r = ui.random;
    ImGui::SliderInt("heads", &r.heads, 1, 8);
    tip("Query heads (and as many KV heads).");
    ImGui::SliderInt("queries", &r.nq, 1, 256);
    tip("Query rows Nq.");
    ImGui::SliderInt("keys", &r.nk, 1, 2048);
    tip("Keys Nk: the steps of a row.");
    ImGui::SliderInt("head dim", &r.d, 1, 256);
    tip("d, the length of each query, key and value row.");
    ImGui::InputFloat("scale", &r.scale);
    tip("The factor on q.k; 0 means 1/sqrt(d).");
    ImGui::Checkbox("causal##random", &r.causal);
    tip("Bottom-right causal mask: query i sees keys j <= i + Nk - Nq.");
    ImGui::InputInt("seed", &r.seed);
    tip("Seed of the Gaussian inputs.");
    if (ImGui::Button("Generate")) load(model, ui, make_random(r));
    tip("Makes the random inputs and traces them; the preset box then says \"random\".");
  }
  if (ImGui::CollapsingHeader("Load .npy")) {
    ImGui::InputText("Q", ui.q_path, sizeof ui.q_path);
    tip("Path of a float32 .npy of shape [B, H, Nq, d] (or fewer leading axes).");
    ImGui::InputText("K", ui.k_path, sizeof ui.k_path);
    tip("Path of a float32 .npy of shape [B, Hkv, Nk, d].");
    ImGui::InputText("V", ui.v_path, sizeof ui.v_path);
    tip("Path of a float32 .npy of shape [B, Hkv, Nk, dv].");
    if (ImGui::Button("Load")) {
      try {
        Inputs in;
        in.name = "files";
        in.q = npy::read(ui.q_path, "Q");
        in.k = npy::read(ui.k_path, "K");
        in.v = npy::read(ui.v_path, "V");
        load(model, ui, std::move(in));
      } catch (const Error& e) {
        ui.status = e.what();
      }
    }
    tip("Reads the three files and traces them; the preset box then says \"files\".");
  }
  if (ImGui::CollapsingHeader("Your mask or bias (GLSL)")) {
    ImGui::InputText("score_mod", ui.score_path, sizeof ui.score_path);
    tip("A GLSL file defining float score_mod(float score, int b, int h, int q_idx, int kv_idx),\n"
        "which turns each scaled score into its own (docs/engine.md). Empty: as it is.");
    ImGui::InputText("mask_mod", ui.mask_path, sizeof ui.mask_path);
    tip("A GLSL file defining bool mask_mod(int b, int h, int q_idx, int kv_idx): false hides\n"
        "key kv_idx from query q_idx. Empty: as it is.");
    ImGui::InputText("table", ui.table_path, sizeof ui.table_path);
    tip("A float32 .npy the functions read as flex_table[] (ids, biases). Empty: as it is.");
    if (ImGui::Button("Apply")) {
      try {
        Inputs in = model.wanted().inputs;
        Modifiers& m = in.params.mods;
        auto read = [](const char* path) {
          std::ifstream file(path, std::ios::binary);
          std::string text((std::istreambuf_iterator<char>(file)), {});
          if (!file.good() && !file.eof()) text.clear();
          if (text.empty()) throw Error(std::string("cannot read '") + path + "' (a GLSL file)");
          return text;
        };
        if (*ui.score_path) m.score_mod = read(ui.score_path), m.score_mod_name = ui.score_path;
        if (*ui.mask_path) m.mask_mod = read(ui.mask_path), m.mask_mod_name = ui.mask_path;
        // The device's values stand in (DeviceTwins), also for a preset's twin of another table.
        if (*ui.score_path || *ui.table_path) m.score_twin = nullptr;
        if (*ui.mask_path || *ui.table_path) m.mask_twin = nullptr;
        if (*ui.table_path) m.flex_table = npy::read(ui.table_path, "table");
        in.name += " with " + modifier_text(m);
        load(model, ui, std::move(in));
      } catch (const Error& e) {
        ui.status = e.what();
      }
    }
    tip("Compiles them into the kernels and traces again; the float64 reference takes their\n"
        "values from the GPU (the host cannot run GLSL).");
  }
}

void controls_selection(Model& model, UiState& ui) {
  ImGui::Separator();
  ImGui::Text("Variants");
  help_marker(
      "Each selected variant is traced on the GPU for the chosen row and stepped in lockstep.");
  // The controls show what was asked for last; a change while it is traced waits its turn.
  Request want = model.wanted();
  std::vector<Variant>& selected = want.selected;
  bool changed = false;
  bool first = true;
  for (Variant v : all_variants()) {
    bool on = std::find(selected.begin(), selected.end(), v) != selected.end();
    if (!first) flow(ImGui::GetFrameHeight() + 8 + ImGui::CalcTextSize(variant_name(v)).x);
    first = false;
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(variant_color(v)));
    if (ImGui::Checkbox(variant_name(v), &on)) {
      changed = true;
      if (on)
        selected.push_back(v);
      else
        selected.erase(std::remove(selected.begin(), selected.end(), v),
                             selected.end());
    }
    ImGui::PopStyleColor();
    tip(variant_info(v).about);
  }
  ImGui::Checkbox("FLASH-D, the paper's form (fp32)", &ui.literal_flashd);
  tip("Draws FLASH-D's literal recurrence w_i = sigma(s_i - s_(i-1) + ln w_(i-1)), run in "
      "fp32, in the weight plot (red): it underflows where the kernels' form does not.");
  const Dims& d = model.dims();
  int b = int(want.batch), h = int(want.head), r = int(want.row);
  if (ImGui::SliderInt("batch", &b, 0, int(d.batch) - 1)) want.batch = uint32_t(b), changed = true;
  tip("Which batch entry to trace.");
  if (ImGui::SliderInt("head", &h, 0, int(d.heads) - 1)) want.head = uint32_t(h), changed = true;
  tip("Which query head to trace (and the heatmap's head).");
  if (ImGui::SliderInt("query row", &r, 0, int(d.nq) - 1)) want.row = uint32_t(r), changed = true;
  tip("The query row whose keys the steps walk through.");
  bool causal = want.inputs.params.mods.causal;
  if (ImGui::Checkbox("causal", &causal)) want.inputs.params.mods.causal = causal, changed = true;
  tip("Bottom-right causal mask: query i sees keys j <= i + Nk - Nq.");
  ImGui::SameLine();
  const Storage st = want.inputs.storage;
  if (ImGui::RadioButton("fp32", st.k == DType::f32))
    want.inputs.storage = DType::f32, changed = true;
  tip("Q, K and V stored as fp32.");
  ImGui::SameLine();
  if (ImGui::RadioButton("fp16", st.k == DType::f16))
    want.inputs.storage = DType::f16, changed = true;
  tip("Q, K and V stored as fp16 (the state stays fp32); the float64 reference sees the same "
      "rounded inputs, and the Output panel says what the rounding costs.");
  if (d.d % 32 == 0 && d.dv % 32 == 0) {  // ggml's blocks of 32 along the head dimension
    ImGui::SameLine();
    if (ImGui::RadioButton("q4_0 K,V", st.k == DType::q4_0))
      want.inputs.storage = Storage(DType::f32, DType::q4_0, DType::q4_0),
      changed = true;
    tip("K and V stored as ggml's q4_0: 32 values share an fp16 scale d, each value one of 16 "
        "levels d (q - 8). The float64 reference sees the dequantised values; the Output panel "
        "says how far they move the output.");
  }
  if (changed) request(model, ui, std::move(want));
}

void controls_stepping(Model& model, UiState& ui) {
  ImGui::Separator();
  int last = std::max(0, model.steps() - 1);
  ImGui::SliderInt("step", &model.cursor, 0, last);
  tip("The step cursor: the state after key `step`. Drag, or use the buttons below.");
  struct StepButton {
    const char* label;
    const char* about;
    int to;
  } buttons[] = {{"|<", "To the first key.", 0},
                 {"<", "One key back.", std::max(0, model.cursor - 1)},
                 {ui.playing ? "Pause" : "Play", "Steps forward by itself, at steps/s.", -1},
                 {">", "One key on.", std::min(last, model.cursor + 1)},
                 {">|", "To the last key.", last}};
  for (const auto& b : buttons) {
    bool play = b.to < 0;  // as wide as "Pause" either way, so that > and >| stay put
    float w = play ? button_width("Pause") : button_width(b.label);
    if (&b != buttons) flow(w);
    if (ImGui::Button(b.label, ImVec2(play ? w : 0.0f, 0.0f))) {
      if (play)
        ui.playing = !ui.playing;
      else
        model.cursor = b.to;
    }
    g_step_buttons[size_t(&b - buttons)] = {ImGui::GetItemRectMin(), ImGui::GetItemRectMax()};
    tip(b.about);
  }
  ImGui::SliderFloat("steps/s", &ui.speed, 1.0f, 500.0f, "%.0f", ImGuiSliderFlags_Logarithmic);
  tip("Playback speed. Keys: left and right arrows step, space plays and pauses.");
  ImGui::Text("Run to the next:");
  struct JumpButton {
    const char* label;
    const char* about;
    Jump jump;
  } jumps[] = {
      {"tile", "The last key of the next tile of the tiled kernels.", Jump::tile},
      {"rescale of m", "The next key that raises the running max m.", Jump::rescale},
      {"NaN/Inf", "The next step whose output state has a NaN or an infinity.", Jump::nonfinite},
      {"underflow",
       "The next step where a weight is 0 but the float64 weight is above 1e-30 (the literal "
       "FLASH-D's too, when it is drawn).",
       Jump::underflow},
      {"error", "The next step whose error against float64 exceeds the threshold.", Jump::error}};
  for (const auto& j : jumps) {
    if (&j != jumps) flow(button_width(j.label));
    if (ImGui::Button(j.label)) {
      int to = model.find(j.jump, +1);
      if (to >= 0)
        model.cursor = to;
      else
        ui.status = std::string("no further ") + j.label;
    }
    tip(j.about);
  }
  float thr = float(model.error_threshold);
  if (ImGui::InputFloat("error limit", &thr, 0, 0, "%.1e")) model.error_threshold = thr;
  tip("The threshold of \"error\" (red line in the error plot).");
}

void controls_export(Model& model, UiState& ui) {
  ImGui::Separator();
  float save = button_width("Save CSV");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x - save -
                          ImGui::GetStyle().ItemSpacing.x);
  ImGui::InputText("##csv", ui.csv_path, sizeof ui.csv_path);
  tip("Where Save CSV writes the trace.");
  ImGui::SameLine();
  if (ImGui::Button("Save CSV")) {
    std::ofstream(ui.csv_path) << model.csv();
    ui.status = std::string("wrote ") + ui.csv_path;
  }
  tip("Writes every selected variant's per-key state (s, m, l, w, LSE, error, o) as CSV.");
  ImGui::SetNextItemWidth(ImGui::GetContentRegionAvail().x - save -
                          ImGui::GetStyle().ItemSpacing.x);
  ImGui::InputText("##png", ui.png_path, sizeof ui.png_path);
  tip("Where Save PNG writes the image.");
  ImGui::SameLine();
  if (ImGui::Button("Save PNG")) ui.png_requested = true;
  tip("Saves the panel chosen below (or the whole window) as PNG.");
  ImGui::Combo("panel", &ui.png_panel, kPanels, IM_ARRAYSIZE(kPanels));
  tip("What Save PNG saves.");
}

void draw_controls(Model& model, UiState& ui) {
  ImGui::PushItemWidth(ImGui::GetContentRegionAvail().x * 0.6f);
  ImGui::Text("flashvk viewer");
  ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
  wrapped("%s", model.context().device().name.c_str());
  ImGui::PopStyleColor();
  controls_inputs(model, ui);
  const Dims& d = model.dims();
  wrapped("B=%u H=%u Hkv=%u Nq=%u Nk=%u d=%u dv=%u", d.batch, d.heads, d.kv_heads, d.nq, d.nk, d.d,
          d.dv);
  // The step buttons above the lesson, whose note changes length from step to step.
  controls_stepping(model, ui);
  controls_lesson(model, ui);
  if (!ui.status.empty()) colored_wrapped(IM_COL32(255, 140, 120, 255), "%s", ui.status.c_str());
  controls_selection(model, ui);
  ImGui::Separator();
  controls_other_inputs(model, ui);
  controls_export(model, ui);
  ImGui::PopItemWidth();
}

// One colour-coded entry per line drawn, flowing onto more lines when the panel is narrow.
void legend(const Model& model, const UiState& ui) {
  bool first = true;
  auto entry = [&](ImU32 color, const std::string& text) {
    if (!first) flow(ImGui::CalcTextSize(text.c_str()).x);
    first = false;
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(color), "%s", text.c_str());
  };
  for (const auto& t : model.traces())
    entry(variant_color(t.variant), std::string("-- ") + variant_name(t.variant));
  entry(kReference, "-- float64 reference");
  if (ui.literal_flashd) entry(kLiteral, "-- FLASH-D paper form (fp32)");
  entry(kCursor, "| step " + std::to_string(model.cursor));
  if (!first) flow(ImGui::CalcTextSize("(?)").x);
  ImGui::TextDisabled("(?)");
  tip("Lines that agree lie on top of each other. Hover a plot for its values at a key.");
}

}  // namespace

void draw_opening(const Model& model) {
  const ImGuiIO& io = ImGui::GetIO();
  ImGui::SetNextWindowPos(ImVec2(io.DisplaySize.x * 0.5f, io.DisplaySize.y * 0.5f),
                          ImGuiCond_Always, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowSize(ImVec2(std::min(ImGui::GetFontSize() * 40, io.DisplaySize.x - 20), 0));
  ImGui::Begin("Opening", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                   ImGuiWindowFlags_NoSavedSettings);
  float fraction = 0;
  std::string what = model.progress(&fraction);
  wrapped("Tracing %s.", what.empty() ? "..." : what.c_str());
  ImGui::ProgressBar(fraction, ImVec2(-1, 0));
  ImGui::TextDisabled("The first run on a machine also compiles the kernels (Mesa keeps them).");
  ImGui::End();
}

namespace {

// While the worker traces: what, how far, and that the plots still show what was traced before.
void progress_line(const Model& model) {
  float fraction = 0;
  std::string what = model.progress(&fraction);
  if (what.empty()) return;
  ImGui::ProgressBar(fraction, ImVec2(ImGui::GetFontSize() * 8, 0), "");
  ImGui::SameLine();
  colored_wrapped(kCursor, "Tracing %s. Shown until then: row %u of head %u.", what.c_str(),
                  model.row, model.head);
}

void draw_plots(Model& model, UiState& ui) {
  int n = model.steps();
  progress_line(model);
  legend(model, ui);
  // The whole row, its shown window boxed and the cursor marked: where the plots are.
  ImVec2 avail = ImGui::GetContentRegionAvail();
  const float strip = 10.0f;
  ImVec2 size((avail.x - 8) / 2, (avail.y - 16 - strip - 4) / 3);
  KeyWindow win = key_window(n, model.cursor, size.x - 8, ui);
  if (ui.view_span > 0) ui.view_lo = win.lo;
  ui.view_cursor = model.cursor;
  ui.shown = win;
  {
    ImDrawList* dl = ImGui::GetWindowDrawList();
    ImVec2 p0 = ImGui::GetCursorScreenPos();
    ImGui::InvisibleButton("overview", ImVec2(avail.x, strip));
    tip("The whole row; the box is the keys the plots show (mouse wheel on a plot: zoom, drag: "
        "pan, double click: the whole row). Click to move the cursor.");
    float w = avail.x, per = n > 0 ? w / float(n) : 0.0f;
    dl->AddRectFilled(p0, ImVec2(p0.x + w, p0.y + strip), IM_COL32(25, 27, 33, 255));
    dl->AddRectFilled(ImVec2(p0.x + per * float(win.lo), p0.y),
                      ImVec2(p0.x + per * float(win.hi), p0.y + strip), IM_COL32(90, 90, 110, 255));
    float cx = p0.x + per * (float(model.cursor) + 0.5f);
    dl->AddLine(ImVec2(cx, p0.y), ImVec2(cx, p0.y + strip), kCursor, 2.0f);
    if (ImGui::IsItemClicked() && n > 0)
      model.cursor = std::clamp(int((ImGui::GetIO().MousePos.x - p0.x) / per), 0, n - 1);
  }
  std::vector<Series> s_series = {{"s", IM_COL32(220, 220, 220, 255), model.scores(), false}};
  if (!model.raw_scores().empty())  // softcap: the score before it, thin and orange
    s_series.insert(s_series.begin(),
                    {"s before softcap", IM_COL32(255, 150, 40, 255), model.raw_scores(), true});
  std::vector<Series> m_series, l_series, w_series, e_series, o_series;
  std::vector<int> rescales;
  for (const auto& t : model.traces()) {
    ImU32 c = variant_color(t.variant);
    std::string name = variant_name(t.variant);
    if (variant_info(t.variant).keeps_max) {
      m_series.push_back({name, c, as_double(t.gpu.steps.m)});
      l_series.push_back({name, c, as_double(t.gpu.steps.l)});
    } else {
      m_series.push_back({"flashd L", c, as_double(t.gpu.steps.lse)});
    }
    w_series.push_back({name, c, as_double(t.gpu.steps.w)});
    w_series.push_back({name + " (float64)", kReference, t.ref.w, true});
    e_series.push_back({name, c, t.error});
    if (!t.o_norm.empty()) {
      std::vector<double> o0;
      for (const auto& o : t.o_norm) o0.push_back(o.empty() ? NAN : o[0]);
      o_series.push_back({name + " o[0]", c, o0});
    }
  }
  if (ui.literal_flashd)
    w_series.push_back({"FLASH-D paper form (fp32)", kLiteral, model.literal_flashd().w});
  // An attention sink's share of the denominator after each key: e^(sink - LSE), from the first
  // traced variant's running LSE (every fused variant keeps one) and from its float64 twin.
  double sink = reference::row_sink(model.inputs().params, model.head);
  bool has_sink = std::isfinite(sink);
  for (const auto& t : model.traces()) {
    if (!has_sink || !variant_info(t.variant).keeps_lse) continue;
    std::vector<double> gpu, ref;
    for (float lse : t.gpu.steps.lse) gpu.push_back(std::exp(sink - double(lse)));
    for (double lse : t.ref.lse) ref.push_back(std::exp(sink - lse));
    w_series.push_back(
        {std::string("sink's share (") + variant_name(t.variant) + ")", kSinkShare, gpu});
    w_series.push_back({"sink's share (float64)", kReference, ref, true});
    break;
  }
  if (!model.traces().empty()) {
    const auto& m = model.traces()[0].gpu.steps.m;
    for (int i = 1; i < int(m.size()); ++i)
      if (m[size_t(i)] > m[size_t(i - 1)] && std::isfinite(m[size_t(i - 1)])) rescales.push_back(i);
  }
  // In fp16, e^s overflows above ln 65504 = 11.09: the line a max-free fp16 kernel cannot cross.
  double fp16_exp_limit = model.inputs().storage.q == DType::f16 ? std::log(65504.0) : NAN;
  plot(std::isfinite(fp16_exp_limit) ? "scores s (red: fp16 e^s limit)"
       : model.raw_scores().empty()  ? "scores s"
                                     : "scores s (orange: before softcap)",
       std::isfinite(fp16_exp_limit)
           ? "The scaled scores s = scale * q.k of the row; gaps are masked keys. The inputs are "
             "stored as fp16: the red line is ln 65504 = 11.09, above which e^s overflows fp16."
           : "The scaled scores s = scale * q.k of the row; gaps are masked keys.",
       s_series, n, model.cursor, false, size, {}, fp16_exp_limit, "key", win, &ui);
  ImGui::SameLine();
  plot("running max m (flashd: L)",
       "Each variant's running max m; red triangles mark where it rises and the state is "
       "rescaled by e^(m_prev - m_new). FLASH-D keeps no max: its running log-sum-exp L is drawn.",
       m_series, n, model.cursor, false, size, rescales, NAN, "key", win, &ui);
  plot(ui.log_l ? "denominator l (log)" : "denominator l",
       "The softmax denominator, relative to the current max: it drops when m rises. Click to "
       "switch between log and linear scale.",
       l_series, n, model.cursor, ui.log_l, size, {}, NAN, "key", win, &ui);
  if (ImGui::IsItemClicked()) ui.log_l = !ui.log_l;
  ImGui::SameLine();
  plot(has_sink ? (ui.log_w ? "weight w (log; tan: sink's share)" : "weight w (tan: the sink's share)")
       : ui.log_w ? "weight w of the new key (log)"
                  : "weight w of the new key",
       has_sink ? "The weight the newest key gets in the normalised output, per variant, with the "
                  "float64 weights in white. Tan: the attention sink's share of the "
                  "denominator, e^(sink - L) with L the running log-sum-exp; it starts at 1 (the "
                  "sink is the state's start) and falls as keys add to the denominator. Click to "
                  "switch between linear and log scale."
                : "The weight the newest key gets in the normalised output, per variant, with "
                  "the float64 weights in white. FLASH-D's w is this quantity; for the others it "
                  "is e^(s-m)/l. Click to switch between linear and log scale (on the log "
                  "scale a weight of exactly 0 is a ring on the floor).",
       w_series, n, model.cursor, ui.log_w, size, {}, NAN, "key", win, &ui);
  if (ImGui::IsItemClicked()) ui.log_w = !ui.log_w;
  plot("error vs float64 (log)",
       "Per step, the largest difference between the GPU's state and the same variant's "
       "float64 recurrence; the red line is the error limit; a ring on the floor: exactly 0.",
       e_series, n, model.cursor, true, size, {}, model.error_threshold, "key", win, &ui);
  ImGui::SameLine();
  plot("output o[0]", "The first component of the output each state stands for (FA2's o/l).",
       o_series, n, model.cursor, false, size, {}, NAN, "key", win, &ui);
}

void draw_heatmap(Model& model, UiState& ui) {
  const Dims& d = model.dims();
  ImGui::Checkbox("show P (else S)", &ui.show_p);
  tip("P = softmax(S) row by row, on a square-root colour scale (most of P is tiny); S = the "
      "scaled scores.");
  uint32_t br = 64, bc = model.tile_size();
  flow(ImGui::CalcTextSize("(?)").x);
  ImGui::TextDisabled("(?)");
  tip("Rows are queries, columns keys. Click a tile to move the step cursor to its last key.");
  wrapped(
      "Tiles of %u keys (the kernels'), drawn in blocks of %u query rows; yellow box: the "
      "current tile, yellow line: the row; grey: masked keys; shaded: tiles the kernels skip "
      "(causal limit, window, chunk, mask).%s%s",
      bc, br, d.nq == 1 ? " One query: the map is a single row, drawn 24 px tall." : "",
      ui.shown.hi - ui.shown.lo < int(d.nk) && ui.shown.hi > ui.shown.lo
          ? " Keys as the plots show them."
          : "");
  const auto& heat = ui.show_p ? model.heat_p() : model.heat_s();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  if (heat.empty() && d.nq > 0) {
    wrapped("The map of %u x %u pairs is too large to draw.", d.nq, d.nk);
    return;
  }
  if (d.nq == 0 || avail.x < 1 || avail.y < 1) return;
  // The keys the plots show (all of them, unless the row is too long for its plots).
  uint32_t klo = 0, khi = d.nk;
  if (ui.shown.hi > ui.shown.lo && uint32_t(ui.shown.hi) <= d.nk)
    klo = uint32_t(ui.shown.lo), khi = uint32_t(ui.shown.hi);
  uint32_t nkw = khi - klo;
  // Square cells, as large as fit; a map of few rows gets rows at least 24 px tall.
  float cell = std::min(avail.x / float(nkw), avail.y / float(d.nq));
  // Rows up to 3 times as tall as wide fill a panel that square cells would leave half empty.
  float cw = cell, ch = std::max({cell, 24.0f / float(d.nq), std::min(avail.y / float(d.nq), 3 * cell)});
  ImVec2 extent(cw * float(nkw), std::min(avail.y, ch * float(d.nq)));
  ImGui::InvisibleButton("heatmap", extent);
  int cols = std::min<int>(int(nkw), int(extent.x)), rows = std::min<int>(int(d.nq), int(extent.y));
  float pw = extent.x / float(cols), ph = extent.y / float(rows);
  double lo = INFINITY, hi = -INFINITY;
  for (double v : heat)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo)) hi = lo + 1;
  for (int r = 0; r < rows; ++r) {
    size_t i = size_t(r) * d.nq / size_t(rows);
    for (int c = 0; c < cols; ++c) {
      size_t j = klo + size_t(c) * nkw / size_t(cols);
      double v = heat[i * d.nk + j];
      ImU32 col = IM_COL32(40, 40, 40, 255);  // a masked key, in S and in P alike
      if (std::isfinite(v) && std::isfinite(model.heat_s()[i * d.nk + j])) {
        float t = float((v - lo) / (hi - lo));
        if (ui.show_p) t = std::sqrt(t);  // most of P is tiny: a square root shows its shape
        col = ImGui::ColorConvertFloat4ToU32(ImVec4(t, 0.3f * t + 0.1f, 1.0f - t, 1.0f));
      }
      float fx = float(c), fy = float(r);
      dl->AddRectFilled(ImVec2(p0.x + fx * pw, p0.y + fy * ph),
                        ImVec2(p0.x + (fx + 1) * pw, p0.y + (fy + 1) * ph), col);
    }
  }
  float sx = extent.x / float(nkw), sy = extent.y / float(d.nq);
  for (uint32_t i0 = 0; bc && i0 < d.nq; i0 += br) {
    for (uint32_t j0 = bc ? klo / bc * bc : 0; bc && j0 < khi; j0 += bc) {
      ImVec2 a(p0.x + float(std::max(j0, klo) - klo) * sx, p0.y + float(i0) * sy);
      ImVec2 b(p0.x + float(std::min(khi, j0 + bc) - klo) * sx,
               p0.y + float(std::min(d.nq, i0 + br)) * sy);
      // Skipped: no row of the block sees a key of the tile (causal limit, window, chunk:
      // window_keys; an additive mask or a mask_mod that hides the whole tile).
      const Modifiers& p = model.inputs().params.mods;
      uint32_t last_row = std::min(d.nq, i0 + br) - 1;
      KeyRange first = window_keys(p, d.nq, d.nk, i0), last = window_keys(p, d.nq, d.nk, last_row);
      bool masked = int64_t(j0) >= last.end || int64_t(j0 + bc) <= first.begin;
      if (!masked && (p.has_mask() || !p.mask_mod.empty())) {  // hidden from every row there
        masked = true;
        for (uint32_t i = i0; masked && i <= last_row; ++i)
          for (uint32_t j = j0; masked && j < std::min(d.nk, j0 + bc); ++j)
            masked = !std::isfinite(model.heat_s()[size_t(i) * d.nk + j]);
      }
      if (masked) dl->AddRectFilled(a, b, IM_COL32(0, 0, 0, 150));
      dl->AddRect(a, b, IM_COL32(255, 255, 255, 60));
      bool current = model.row >= i0 && model.row < i0 + br && uint32_t(model.cursor) >= j0 &&
                     uint32_t(model.cursor) < j0 + bc;
      if (current) dl->AddRect(a, b, kCursor, 0, 0, 2.5f);
      if (ImGui::IsItemClicked() && ImGui::IsMouseHoveringRect(a, b))
        model.cursor = int(std::min(d.nk, j0 + bc)) - 1;
    }
  }
  float ry = p0.y + (float(model.row) + 0.5f) * sy;
  dl->AddLine(ImVec2(p0.x, ry), ImVec2(p0.x + extent.x, ry), IM_COL32(255, 220, 0, 220));
}

// The step's score as the kernels form it: scale * q.k, then the modifiers the inputs use.
void write_score(const Model& model, const char* name, int i) {
  const Modifiers& p = model.inputs().params.mods;
  std::string formula = score_formula(p, std::to_string(i));
  wrapped("%s_%d = %s = %.6g", name, i, formula.c_str(), model.scores()[size_t(i)]);
  if (!model.raw_scores().empty())
    wrapped("     before the cap (c = %g): %.6g", double(p.softcap), model.raw_scores()[size_t(i)]);
}

void derivation_flash(const Model& model, int i, const reference::RowTrace& r, bool lazy) {
  const auto& s = model.scores();
  // Before the first key: nothing, or an attention sink's logit with l = 1.
  double sink = reference::row_sink(model.inputs().params, model.head);
  double m_prev = i > 0 ? r.m[size_t(i - 1)] : sink;
  double l_prev = i > 0 ? r.l[size_t(i - 1)] : (std::isfinite(sink) ? 1.0 : 0.0);
  double m = r.m[size_t(i)], l = r.l[size_t(i)];
  double resc = std::isfinite(m_prev) ? std::exp(m_prev - m) : 0.0;
  write_score(model, "x", i);
  wrapped("m_%d = max(m_%d, x_%d) = max(%.6g, %.6g) = %.6g", i, i - 1, i, m_prev, s[size_t(i)], m);
  wrapped("d'_%d = d'_%d e^(m_%d - m_%d) + e^(x_%d - m_%d)", i, i - 1, i - 1, i, i, i);
  wrapped("     = %.6g * %.6g + %.6g = %.6g", l_prev, resc,
          std::isfinite(s[size_t(i)]) ? std::exp(s[size_t(i)] - m) : 0.0, l);
  if (lazy) {
    wrapped("o'_%d = o'_%d e^(m_%d - m_%d) + v_%d e^(x_%d - m_%d)", i, i - 1, i - 1, i, i, i, i);
    wrapped("     factor on o' = %.6g, on v = %.6g; divide by d'_N once at the end", resc,
            std::isfinite(s[size_t(i)]) ? std::exp(s[size_t(i)] - m) : 0.0);
  } else {
    wrapped("o'_%d = o'_%d d'_%d e^(m_%d - m_%d) / d'_%d + v_%d e^(x_%d - m_%d) / d'_%d", i, i - 1,
            i - 1, i - 1, i, i, i, i, i, i);
    wrapped("     factor on o' = %.6g, on v = %.6g", l > 0 ? l_prev * resc / l : 0.0,
            r.w[size_t(i)]);
  }
  if (resc > 0 && resc < 1)
    colored_wrapped(IM_COL32(255, 100, 100, 255),
                    "m rose: earlier state rescaled by e^(m_prev - m_new) = %.6g", resc);
}

void derivation_flashd(const Model& model, int i, const reference::RowTrace& r, bool literal) {
  const auto& s = model.scores();
  // Before the first key L is -inf, or an attention sink's logit (the state FLASH-D starts from).
  double L_prev =
      i > 0 ? r.lse[size_t(i - 1)] : reference::row_sink(model.inputs().params, model.head);
  write_score(model, "s", i);
  wrapped("w_%d = sigma(s_%d - s_%d + ln w_%d) = sigma(s_%d - L_%d)", i, i, i - 1, i - 1, i, i - 1);
  wrapped("     = sigma(%.6g - %.6g) = %.6g", s[size_t(i)], L_prev, r.w[size_t(i)]);
  if (literal)  // the same step as the seed writes it, in fp32
    colored_wrapped(
        kLiteral, "paper form, in fp32: w_%d = %.6g%s", i, model.literal_flashd().w[size_t(i)],
        model.literal_flashd().w[size_t(i)] == 0.0 ? " (ln w = -inf from here on)" : "");
  wrapped("L_%d = L_%d + ln(1 + e^(s_%d - L_%d)) = %.6g", i, i - 1, i, i - 1, r.lse[size_t(i)]);
  wrapped("o_%d = o_%d (1 - w_%d) + v_%d w_%d", i, i - 1, i, i, i);
  disabled_wrapped("Carrying L = s - ln w keeps ln w from underflowing (docs/algorithms.md).");
}

void draw_derivation(const Model& model, const UiState& ui) {
  int i = model.cursor;
  if (model.steps() == 0) return;
  Variant v = model.selected.empty() ? Variant::flash1 : model.selected[0];
  wrapped("Step %d of %d, %s (the first selected variant)", i, model.steps() - 1, variant_name(v));
  ImGui::Separator();
  if (!std::isfinite(model.scores()[size_t(i)])) {
    wrapped("key %d is masked: s = -inf, w = 0, the state is unchanged", i);
  } else if (v == Variant::flashd) {
    derivation_flashd(model, i, model.ref_of(Variant::flashd), ui.literal_flashd);
  } else if (v == Variant::naive || v == Variant::online) {
    const auto& d = model.direct();
    wrapped("a_%d = e^(x_%d - m_N) / d_N = %.6g", i, i, d.w[size_t(i)]);
    wrapped("o_%d = o_%d + a_%d v_%d", i, i - 1, i, i);
    disabled_wrapped(v == Variant::naive ? "m_N and d_N come from the first two passes over S."
                                         : "m_N and d'_N come from the first (online) pass.");
  } else {
    derivation_flash(model, i,
                     model.ref_of(v == Variant::flash1 ? Variant::flash1 : Variant::flash2),
                     v != Variant::flash1);
  }
  ImGui::Separator();
  wrapped("What ties the variants together at this step (float64):");
  const auto& fa1 = model.ref_of(Variant::flash1);
  const auto& fa2 = model.ref_of(Variant::flash2);
  const auto& fd = model.ref_of(Variant::flashd);
  size_t k = size_t(i);
  if (fa2.l[k] > 0) {
    double diff = 0;
    for (size_t c = 0; c < fa1.o[k].size(); ++c)
      diff = std::max(diff, std::abs(fa2.o[k][c] / fa2.l[k] - fa1.o[k][c]));
    wrapped("FA2 o/l = FA1 o: max |diff| = %.2e", diff);
    wrapped("FLASH-D w = e^(s-m)/l: %.9g = %.9g", fd.w[k],
            std::exp(model.scores()[k] - fa1.m[k]) / fa1.l[k]);
    wrapped("FLASH-D L = m + ln l: %.9g = %.9g", fd.lse[k], fa1.m[k] + std::log(fa1.l[k]));
  } else {
    wrapped("no key visible yet");
  }
  ImGui::Separator();
  wrapped("GPU state at this step (per variant):");
  for (const auto& t : model.traces()) {
    const auto& st = t.gpu.steps;
    ImU32 color = variant_color(t.variant);
    if (t.variant == Variant::flashd)  // FLASH-D keeps no max and no denominator, only L
      colored_wrapped(color, "%-8s L=%.5g  w=%.5g  err=%.1e", variant_name(t.variant), st.lse[k],
                      st.w[k], t.error[k]);
    else
      colored_wrapped(color, "%-8s m=%.5g  l=%.5g  w=%.5g  err=%.1e", variant_name(t.variant),
                      st.m[k], st.l[k], st.w[k], t.error[k]);
  }
}

// The whole output vector each variant's state stands for at the cursor, over its components,
// with the same variant's float64 state in white.
void output_vector_plot(const Model& model) {
  std::vector<Series> series;
  size_t k = size_t(model.cursor);
  for (const auto& t : model.traces()) {
    if (k >= t.o_norm.size()) continue;
    series.push_back({variant_name(t.variant), variant_color(t.variant), t.o_norm[k]});
    std::vector<double> ref = t.ref.o[k];
    if (t.variant == Variant::flash2 || t.variant == Variant::splitkv)
      for (double& x : ref) x = t.ref.l[k] > 0 ? x / t.ref.l[k] : 0.0;
    series.push_back({std::string(variant_name(t.variant)) + " (float64)", kReference, ref, true});
  }
  ImVec2 avail = ImGui::GetContentRegionAvail();
  plot("output vector at the step",
       "The whole output vector each variant's state stands for at the step, by component, "
       "with that variant's float64 state in white.",
       series, int(model.dims().dv), -1, false, ImVec2(avail.x, std::min(160.0f, avail.y * 0.4f)),
       {}, NAN, "component");
}

void draw_output(const Model& model) {
  output_vector_plot(model);
  const auto& d = model.direct();
  wrapped("Final output of row %u vs float64 softmax(s) v   (LSE %.6g)", model.row, d.final_lse);
  for (const auto& t : model.traces()) {
    double err = 0;
    for (size_t c = 0; c < d.out.size(); ++c)
      err = std::max(err, std::abs(double(t.gpu.out[c]) - d.out[c]));
    colored_wrapped(variant_color(t.variant), "%-8s max |o - o_ref| = %.2e  LSE %.6g",
                    variant_name(t.variant), err, t.gpu.lse);
  }
  const Storage& st = model.inputs().storage;
  if (model.storage_cost() > 0 || st.k != DType::f32) {
    ImGui::Separator();
    char fp16[96] = ".";
    if (st.k != DType::f16)
      std::snprintf(fp16, sizeof fp16, "; fp16 storage would move it by %.2e.", model.fp16_cost());
    wrapped(
        "o_ref is float64 on the values stored (%s). Storing them moved the float64 output "
        "by %.2e from the inputs as given%s",
        cli::storage_text(st).c_str(), model.storage_cost(), fp16);
  }
  for (const auto& t : model.traces()) {
    if (t.variant != Variant::splitkv) continue;
    ImGui::Separator();
    wrapped("splitkv: %zu chunks merged with log-sum-exp", t.gpu.splits.size());
    wrapped("%-12s %-11s %-11s %-11s", "keys", "m_c", "d'_c", "o'_c[0]");
    for (const auto& s : t.gpu.splits)
      wrapped("[%5u,%5u) %-11.5g %-11.5g %-11.5g%s", s.begin, s.end, s.m, s.l,
              s.o.empty() ? 0.0f : s.o[0], std::isfinite(s.m) ? "" : "  (empty)");
    wrapped("merged: m_N = max m_c, d'_N = sum d'_c e^(m_c - m_N)");
    wrapped("o[0] = %.6g (float64: %.6g)", t.gpu.out.empty() ? 0.0f : t.gpu.out[0],
            d.out.empty() ? 0.0 : d.out[0]);
  }
}

}  // namespace

const char* const* panel_names(int* count) {
  *count = IM_ARRAYSIZE(kPanels);
  return kPanels;
}

bool panel_rect(int index, float rect[4]) {
  auto it = g_panel_rects.find(index);
  if (it == g_panel_rects.end()) return false;
  rect[0] = it->second.x, rect[1] = it->second.y, rect[2] = it->second.z, rect[3] = it->second.w;
  return true;
}

const std::vector<std::string>& layout_overflows() {
  return g_overflows;
}

void step_keys(Model& model, UiState& ui, bool left, bool right, bool space) {
  int last = std::max(0, model.steps() - 1);
  if (left || right) ui.playing = false;
  if (left) model.cursor = std::max(0, model.cursor - 1);
  if (right) model.cursor = std::min(last, model.cursor + 1);
  if (space) ui.playing = !ui.playing && model.cursor < last;
}

void advance_playback(Model& model, UiState& ui, double dt) {
  if (!ui.playing) return;
  int last = std::max(0, model.steps() - 1);
  ui.play_clock += dt * ui.speed;
  int advance = int(ui.play_clock);
  ui.play_clock -= advance;
  model.cursor = std::min(last, model.cursor + advance);
  if (model.cursor == last) ui.playing = false;
}

bool step_button_rect(int index, float rect[4]) {
  if (index < 0 || index >= int(g_step_buttons.size())) return false;
  const ImRect& r = g_step_buttons[size_t(index)];
  rect[0] = r.Min.x, rect[1] = r.Min.y, rect[2] = r.GetWidth(), rect[3] = r.GetHeight();
  return r.GetWidth() > 0;
}

void show_whole_row(UiState& ui, int steps) {
  ui.view_lo = 0;
  ui.view_span = steps;
}

void open_at_step(Model& model, int step) {
  if (step >= 0) model.cursor = std::clamp(step, 0, std::max(0, model.steps() - 1));
}

void draw_ui(Model& model, UiState& ui, double dt) {
  g_overflows.clear();
  try {
    if (model.poll()) ui.status = model.last_error;
  } catch (const Error& e) {
    ui.status = e.what();
  }
  refresh_lesson(model, ui);
  model.literal_flashd_shown = ui.literal_flashd;
  const ImGuiIO& io = ImGui::GetIO();
  if (!io.WantTextInput)  // not while a text field has the keyboard
    step_keys(model, ui, ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_LeftArrow)),
              ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_RightArrow)),
              ImGui::IsKeyPressed(ImGui::GetKeyIndex(ImGuiKey_Space), false));
  advance_playback(model, ui, dt);  // before any panel: the slider and the legend agree
  ImVec2 size = ImGui::GetIO().DisplaySize;
  // 360 | plots | 470 at 1600 wide; the side panels narrow to 300 and 376 at 1280.
  float left = std::clamp(size.x * 0.225f, 300.0f, 420.0f);
  float right = std::clamp(size.x * 0.29375f, 376.0f, 560.0f);
  if (size.x < 1280) left = size.x * 300 / 1280, right = size.x * 376 / 1280;  // scaled down
  float mid = size.x - left - right, top = size.y * 0.62f;
  if (begin_panel(1, 0, 0, left, size.y)) draw_controls(model, ui);
  end_panel(1);
  if (begin_panel(2, left, 0, mid, top)) draw_plots(model, ui);
  end_panel(2);
  if (begin_panel(3, left, top, mid, size.y - top)) draw_heatmap(model, ui);
  end_panel(3);
  if (begin_panel(4, left + mid, 0, right, size.y * 0.55f)) draw_derivation(model, ui);
  end_panel(4);
  if (begin_panel(5, left + mid, size.y * 0.55f, right, size.y * 0.45f)) draw_output(model);
  end_panel(5);
}

float plot_pixels(float width) {
  float left = std::clamp(width * 0.225f, 300.0f, 420.0f);
  float right = std::clamp(width * 0.29375f, 376.0f, 560.0f);
  if (width < 1280) left = width * 300 / 1280, right = width * 376 / 1280;
  float content = width - left - right - 2 * 8.0f;  // ImGui's default window padding
  return (content - 8) / 2 - 8;  // two plots a row, each inset by 4 on both sides
}

KeyWindow key_window(int steps, int cursor, float plot_px, const UiState& ui) {
  if (steps <= 0) return {};
  int fit = std::max(1, int(plot_px / kKeyPixels));
  int span =
      ui.view_span > 0 ? std::clamp(ui.view_span, std::min(steps, 8), steps) : std::min(steps, fit);
  int lo = ui.view_span > 0 ? ui.view_lo : cursor - span / 2;
  bool moved = cursor != ui.view_cursor;
  if (ui.view_span > 0 && moved && (cursor < lo || cursor >= lo + span)) lo = cursor - span / 2;
  lo = std::clamp(lo, 0, steps - span);
  return {lo, lo + span};
}

}  // namespace flashvk::viewer
