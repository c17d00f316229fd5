#include "ui.hpp"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>

#include "npy.hpp"

namespace flashvk::viewer {
namespace {

const char* kPanels[] = {"Whole window", "Controls", "Plots", "Heatmap", "Derivation", "Output"};
std::map<int, ImVec4> g_panel_rects;

ImU32 variant_color(Variant v) {
  switch (v) {
    case Variant::naive:
      return IM_COL32(170, 170, 170, 255);
    case Variant::online:
      return IM_COL32(255, 150, 40, 255);
    case Variant::flash1:
      return IM_COL32(80, 150, 255, 255);
    case Variant::flash2:
      return IM_COL32(90, 210, 90, 255);
    case Variant::flashd:
      return IM_COL32(230, 90, 230, 255);
    case Variant::splitkv:
      return IM_COL32(60, 220, 220, 255);
  }
  return IM_COL32_WHITE;
}
const ImU32 kReference = IM_COL32(255, 255, 255, 200);
const ImU32 kCursor = IM_COL32(255, 220, 0, 255);

void help_marker(const char* text) {
  ImGui::SameLine();
  ImGui::TextDisabled("(?)");
  if (ImGui::IsItemHovered()) {
    ImGui::BeginTooltip();
    ImGui::PushTextWrapPos(ImGui::GetFontSize() * 30.0f);
    ImGui::TextUnformatted(text);
    ImGui::PopTextWrapPos();
    ImGui::EndTooltip();
  }
}

bool begin_panel(int index, float x, float y, float w, float h) {
  ImGui::SetNextWindowPos(ImVec2(x, y), ImGuiCond_Always);
  ImGui::SetNextWindowSize(ImVec2(w, h), ImGuiCond_Always);
  g_panel_rects[index] = ImVec4(x, y, w, h);
  return ImGui::Begin(
      kPanels[index], nullptr,
      ImGuiWindowFlags_NoMove | ImGuiWindowFlags_NoResize | ImGuiWindowFlags_NoCollapse);
}

struct Series {
  std::string label;
  ImU32 color;
  std::vector<double> y;
  bool thin = false;
};

// A line plot over the key index with the cursor marked. NaN and infinities leave gaps.
void plot(const char* title, const std::vector<Series>& series, int steps, int cursor, bool log_y,
          ImVec2 size, const std::vector<int>& markers = {}, double hline = NAN,
          const char* x_label = "key") {
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos();
  ImGui::InvisibleButton(title, size);
  ImVec2 p1(p0.x + size.x, p0.y + size.y);
  dl->AddRectFilled(p0, p1, IM_COL32(25, 27, 33, 255));
  dl->AddRect(p0, p1, IM_COL32(80, 80, 90, 255));
  auto tr = [&](double v) { return log_y ? (v > 0 ? std::log10(v) : NAN) : v; };
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series)
    for (double v : s.y)
      if (std::isfinite(tr(v))) lo = std::min(lo, tr(v)), hi = std::max(hi, tr(v));
  if (std::isfinite(hline)) lo = std::min(lo, tr(hline)), hi = std::max(hi, tr(hline));
  if (!(lo <= hi)) lo = 0, hi = 1;
  if (hi - lo < 1e-12) lo -= 0.5, hi += 0.5;
  float pad = 18.0f;
  float x0 = p0.x + 4, x1 = p1.x - 4, y0 = p0.y + pad, y1 = p1.y - 4;
  auto X = [&](double i) { return float(x0 + (x1 - x0) * (steps > 1 ? i / (steps - 1) : 0.5)); };
  auto Y = [&](double v) { return float(y1 - (y1 - y0) * (tr(v) - lo) / (hi - lo)); };
  char label[128];
  std::snprintf(label, sizeof label, "%s   [%s%.3g, %s%.3g]", title, log_y ? "1e" : "", lo,
                log_y ? "1e" : "", hi);
  dl->AddText(ImVec2(p0.x + 4, p0.y + 2), IM_COL32(220, 220, 220, 255), label);
  if (std::isfinite(hline))
    dl->AddLine(ImVec2(x0, Y(hline)), ImVec2(x1, Y(hline)), IM_COL32(255, 80, 80, 160));
  int stride = std::max(1, steps / int(std::max(1.0f, x1 - x0)));
  for (const auto& s : series) {
    bool have = false;
    ImVec2 prev;
    for (int i = 0; i < int(s.y.size()); i += stride) {
      double v = s.y[size_t(i)];
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
    dl->AddTriangleFilled(ImVec2(X(m), y0 + 8), ImVec2(X(m) - 4, y0), ImVec2(X(m) + 4, y0),
                          IM_COL32(255, 90, 90, 255));
  if (cursor >= 0) dl->AddLine(ImVec2(X(cursor), y0), ImVec2(X(cursor), y1), kCursor, 1.5f);
  if (ImGui::IsItemHovered() && steps > 0) {
    int i = std::clamp(
        int(std::lround((ImGui::GetIO().MousePos.x - x0) / (x1 - x0) * float(steps - 1))), 0,
        steps - 1);
    ImGui::BeginTooltip();
    ImGui::Text("%s %d", x_label, i);
    for (const auto& s : series)
      if (size_t(i) < s.y.size()) ImGui::Text("%s: %.6g", s.label.c_str(), s.y[size_t(i)]);
    ImGui::EndTooltip();
  }
}

std::vector<double> as_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

void retrace(Model& model, UiState& ui) {
  model.retrace();
  ui.status = model.last_error;
}

void load(Model& model, UiState& ui, Inputs in) {
  try {
    model.load(std::move(in));
    ui.status = model.last_error;
  } catch (const Error& e) {
    ui.status = e.what();
  }
}

void controls_inputs(Model& model, UiState& ui) {
  const auto& names = preset_names();
  std::vector<const char*> items;
  for (const auto& n : names) items.push_back(n.c_str());
  if (ImGui::Combo("preset", &ui.preset, items.data(), int(items.size()))) {
    try {
      load(model, ui, make_preset(names[size_t(ui.preset)], ui.assets));
    } catch (const Error& e) {
      ui.status = e.what();
    }
  }
  help_marker("Cases that break naive code. The sample is the one in assets/sample.");
  ImGui::TextWrapped("%s", preset_description(names[size_t(ui.preset)]).c_str());
  if (ImGui::CollapsingHeader("Random input")) {
    RandomSpec& r = ui.random;
    ImGui::SliderInt("heads", &r.heads, 1, 8);
    ImGui::SliderInt("queries", &r.nq, 1, 256);
    ImGui::SliderInt("keys", &r.nk, 1, 2048);
    ImGui::SliderInt("head dim", &r.d, 1, 256);
    ImGui::InputFloat("scale (0 = 1/sqrt d)", &r.scale);
    ImGui::Checkbox("causal##random", &r.causal);
    ImGui::InputInt("seed", &r.seed);
    if (ImGui::Button("Generate")) load(model, ui, make_random(r));
  }
  if (ImGui::CollapsingHeader("Load .npy")) {
    ImGui::InputText("Q", ui.q_path, sizeof ui.q_path);
    ImGui::InputText("K", ui.k_path, sizeof ui.k_path);
    ImGui::InputText("V", ui.v_path, sizeof ui.v_path);
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
  }
}

void controls_selection(Model& model, UiState& ui) {
  ImGui::Separator();
  ImGui::Text("Variants");
  help_marker(
      "Each selected variant is traced on the GPU for the chosen row and stepped in lockstep.");
  bool changed = false;
  for (Variant v : all_variants()) {
    bool on = std::find(model.selected.begin(), model.selected.end(), v) != model.selected.end();
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::ColorConvertU32ToFloat4(variant_color(v)));
    if (ImGui::Checkbox(variant_name(v), &on)) {
      changed = true;
      if (on)
        model.selected.push_back(v);
      else
        model.selected.erase(std::remove(model.selected.begin(), model.selected.end(), v),
                             model.selected.end());
    }
    ImGui::PopStyleColor();
    if (v != Variant::flash1 && v != Variant::splitkv) ImGui::SameLine();
  }
  const Dims& d = model.dims();
  int b = int(model.batch), h = int(model.head), r = int(model.row);
  if (ImGui::SliderInt("batch", &b, 0, int(d.batch) - 1)) model.batch = uint32_t(b), changed = true;
  if (ImGui::SliderInt("head", &h, 0, int(d.heads) - 1)) model.head = uint32_t(h), changed = true;
  if (ImGui::SliderInt("query row", &r, 0, int(d.nq) - 1)) model.row = uint32_t(r), changed = true;
  bool causal = model.inputs().params.causal;
  if (ImGui::Checkbox("causal", &causal))
    model.mutable_inputs().params.causal = causal, changed = true;
  ImGui::SameLine();
  int f16 = model.inputs().dtype == DType::f16;
  if (ImGui::RadioButton("fp32", f16 == 0))
    model.mutable_inputs().dtype = DType::f32, changed = true;
  ImGui::SameLine();
  if (ImGui::RadioButton("fp16", f16 == 1))
    model.mutable_inputs().dtype = DType::f16, changed = true;
  if (changed) retrace(model, ui);
}

void controls_stepping(Model& model, UiState& ui, double dt) {
  ImGui::Separator();
  int last = std::max(0, model.steps() - 1);
  ImGui::SliderInt("step", &model.cursor, 0, last);
  if (ImGui::Button("|<")) model.cursor = 0;
  ImGui::SameLine();
  if (ImGui::Button("<")) model.cursor = std::max(0, model.cursor - 1);
  ImGui::SameLine();
  if (ImGui::Button(ui.playing ? "Pause" : "Play")) ui.playing = !ui.playing;
  ImGui::SameLine();
  if (ImGui::Button(">")) model.cursor = std::min(last, model.cursor + 1);
  ImGui::SameLine();
  if (ImGui::Button(">|")) model.cursor = last;
  ImGui::SliderFloat("steps/s", &ui.speed, 1.0f, 500.0f, "%.0f", ImGuiSliderFlags_Logarithmic);
  ImGui::SameLine();
  ImGui::Checkbox("log l", &ui.log_l);
  if (ui.playing) {
    ui.play_clock += dt * ui.speed;
    int advance = int(ui.play_clock);
    ui.play_clock -= advance;
    model.cursor = std::min(last, model.cursor + advance);
    if (model.cursor == last) ui.playing = false;
  }
  ImGui::Text("Run to the next:");
  struct JumpButton {
    const char* label;
    Jump jump;
  } jumps[] = {{"tile", Jump::tile},
               {"rescale of m", Jump::rescale},
               {"NaN/Inf", Jump::nonfinite},
               {"underflow", Jump::underflow},
               {"error", Jump::error}};
  for (const auto& j : jumps) {
    if (ImGui::Button(j.label)) {
      int to = model.find(j.jump, +1);
      if (to >= 0)
        model.cursor = to;
      else
        ui.status = std::string("no further ") + j.label;
    }
    if (j.jump != Jump::rescale && j.jump != Jump::error) ImGui::SameLine();
  }
  float thr = float(model.error_threshold);
  if (ImGui::InputFloat("error threshold", &thr, 0, 0, "%.1e")) model.error_threshold = thr;
  help_marker(
      "underflow: a step where the GPU's weight is 0 but the float64 weight is above 1e-30.");
}

void controls_export(Model& model, UiState& ui) {
  ImGui::Separator();
  ImGui::InputText("CSV", ui.csv_path, sizeof ui.csv_path);
  ImGui::SameLine();
  if (ImGui::Button("Save CSV")) {
    std::ofstream(ui.csv_path) << model.csv();
    ui.status = std::string("wrote ") + ui.csv_path;
  }
  ImGui::InputText("PNG", ui.png_path, sizeof ui.png_path);
  ImGui::SameLine();
  if (ImGui::Button("Save PNG")) ui.png_requested = true;
  ImGui::Combo("panel", &ui.png_panel, kPanels, IM_ARRAYSIZE(kPanels));
}

void draw_controls(Model& model, UiState& ui, double dt) {
  ImGui::Text("flashvk viewer");
  ImGui::TextDisabled("%s", model.context().device().name.c_str());
  const Dims& d = model.dims();
  ImGui::Text("%s: B=%u H=%u Hkv=%u Nq=%u Nk=%u d=%u dv=%u", model.inputs().name.c_str(), d.batch,
              d.heads, d.kv_heads, d.nq, d.nk, d.d, d.dv);
  controls_inputs(model, ui);
  controls_selection(model, ui);
  controls_stepping(model, ui, dt);
  controls_export(model, ui);
  if (!ui.status.empty()) {
    ImGui::Separator();
    ImGui::TextWrapped("%s", ui.status.c_str());
  }
}

void legend(const Model& model) {
  for (const auto& t : model.traces()) {
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(variant_color(t.variant)), "-- %s",
                       variant_name(t.variant));
    ImGui::SameLine();
  }
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kReference), "-- float64 reference");
  ImGui::SameLine();
  ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(kCursor), "| step %d", model.cursor);
  ImGui::SameLine();
  ImGui::TextDisabled("(lines that agree lie on top of each other)");
}

void draw_plots(const Model& model, const UiState& ui) {
  int n = model.steps();
  legend(model);
  ImVec2 avail = ImGui::GetContentRegionAvail();
  ImVec2 size((avail.x - 8) / 2, (avail.y - 16) / 3);
  std::vector<Series> s_series = {{"s", IM_COL32(220, 220, 220, 255), model.scores(), false}};
  std::vector<Series> m_series, l_series, w_series, e_series, o_series;
  std::vector<int> rescales;
  for (const auto& t : model.traces()) {
    ImU32 c = variant_color(t.variant);
    std::string name = variant_name(t.variant);
    if (t.variant != Variant::flashd) {
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
  if (!model.traces().empty()) {
    const auto& m = model.traces()[0].gpu.steps.m;
    for (int i = 1; i < int(m.size()); ++i)
      if (m[size_t(i)] > m[size_t(i - 1)] && std::isfinite(m[size_t(i - 1)])) rescales.push_back(i);
  }
  // In fp16, e^s overflows above ln 65504 = 11.09: the line a max-free fp16 kernel cannot cross.
  double fp16_exp_limit = model.inputs().dtype == DType::f16 ? std::log(65504.0) : NAN;
  plot(std::isfinite(fp16_exp_limit) ? "scores s (red: e^s overflows fp16 above)" : "scores s",
       s_series, n, model.cursor, false, size, {}, fp16_exp_limit);
  ImGui::SameLine();
  plot("running max m (flashd: log-sum-exp L); red = rescale", m_series, n, model.cursor, false,
       size, rescales);
  plot(ui.log_l ? "denominator l (log)" : "denominator l", l_series, n, model.cursor, ui.log_l,
       size);
  ImGui::SameLine();
  plot("weight w of the new key (white: float64)", w_series, n, model.cursor, false, size);
  plot("error vs float64 recurrence (log)", e_series, n, model.cursor, true, size, {},
       model.error_threshold);
  ImGui::SameLine();
  plot("output o[0] (normalised)", o_series, n, model.cursor, false, size);
}

void draw_heatmap(Model& model, UiState& ui) {
  const Dims& d = model.dims();
  ImGui::Checkbox("show P (else S)", &ui.show_p);
  ImGui::SameLine();
  uint32_t br = 64, bc = model.tile_size();
  ImGui::Text(" Br x Bc = %u x %u; yellow: current tile, shaded: masked tiles", br, bc);
  help_marker(
      "Rows are queries, columns keys. Click a tile to move the step cursor to its last key.");
  const auto& heat = ui.show_p ? model.heat_p() : model.heat_s();
  ImDrawList* dl = ImGui::GetWindowDrawList();
  ImVec2 p0 = ImGui::GetCursorScreenPos(), avail = ImGui::GetContentRegionAvail();
  ImGui::InvisibleButton("heatmap", avail);
  if (heat.empty() || d.nq == 0) return;
  int cols = std::min<int>(int(d.nk), int(avail.x)), rows = std::min<int>(int(d.nq), int(avail.y));
  float cw = avail.x / float(cols), ch = avail.y / float(rows);
  double lo = INFINITY, hi = -INFINITY;
  for (double v : heat)
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  if (!(hi > lo)) hi = lo + 1;
  for (int r = 0; r < rows; ++r) {
    size_t i = size_t(r) * d.nq / size_t(rows);
    for (int c = 0; c < cols; ++c) {
      size_t j = size_t(c) * d.nk / size_t(cols);
      double v = heat[i * d.nk + j];
      ImU32 col = IM_COL32(40, 40, 40, 255);
      if (std::isfinite(v)) {
        float t = float((v - lo) / (hi - lo));
        if (ui.show_p) t = std::sqrt(t);  // most of P is tiny: a square root shows its shape
        col = ImGui::ColorConvertFloat4ToU32(ImVec4(t, 0.3f * t + 0.1f, 1.0f - t, 1.0f));
      }
      float fx = float(c), fy = float(r);
      dl->AddRectFilled(ImVec2(p0.x + fx * cw, p0.y + fy * ch),
                        ImVec2(p0.x + (fx + 1) * cw, p0.y + (fy + 1) * ch), col);
    }
  }
  float sx = avail.x / float(d.nk), sy = avail.y / float(d.nq);
  for (uint32_t i0 = 0; bc && i0 < d.nq; i0 += br) {
    for (uint32_t j0 = 0; j0 < d.nk; j0 += bc) {
      ImVec2 a(p0.x + float(j0) * sx, p0.y + float(i0) * sy);
      ImVec2 b(p0.x + float(std::min(d.nk, j0 + bc)) * sx,
               p0.y + float(std::min(d.nq, i0 + br)) * sy);
      int64_t last_row = std::min<int64_t>(d.nq, i0 + br) - 1;
      bool masked =
          model.inputs().params.causal && int64_t(j0) > last_row + int64_t(d.nk) - int64_t(d.nq);
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
  dl->AddLine(ImVec2(p0.x, ry), ImVec2(p0.x + avail.x, ry), IM_COL32(255, 220, 0, 120));
}

void derivation_flash(const Model& model, int i, const reference::RowTrace& r, bool lazy) {
  const auto& s = model.scores();
  double m_prev = i > 0 ? r.m[size_t(i - 1)] : -INFINITY, l_prev = i > 0 ? r.l[size_t(i - 1)] : 0.0;
  double m = r.m[size_t(i)], l = r.l[size_t(i)];
  double resc = std::isfinite(m_prev) ? std::exp(m_prev - m) : 0.0;
  ImGui::Text("x_%d = scale * q.k_%d = %.6g", i, i, s[size_t(i)]);
  ImGui::Text("m_%d = max(m_%d, x_%d) = max(%.6g, %.6g) = %.6g", i, i - 1, i, m_prev, s[size_t(i)],
              m);
  ImGui::Text("d'_%d = d'_%d e^(m_%d - m_%d) + e^(x_%d - m_%d)", i, i - 1, i - 1, i, i, i);
  ImGui::Text("     = %.6g * %.6g + %.6g = %.6g", l_prev, resc,
              std::isfinite(s[size_t(i)]) ? std::exp(s[size_t(i)] - m) : 0.0, l);
  if (lazy) {
    ImGui::Text("o'_%d = o'_%d e^(m_%d - m_%d) + v_%d e^(x_%d - m_%d)", i, i - 1, i - 1, i, i, i,
                i);
    ImGui::Text("     factor on o' = %.6g, on v = %.6g; divide by d'_N once at the end", resc,
                std::isfinite(s[size_t(i)]) ? std::exp(s[size_t(i)] - m) : 0.0);
  } else {
    ImGui::Text("o'_%d = o'_%d d'_%d e^(m_%d - m_%d) / d'_%d + v_%d e^(x_%d - m_%d) / d'_%d", i,
                i - 1, i - 1, i - 1, i, i, i, i, i, i);
    ImGui::Text("     factor on o' = %.6g, on v = %.6g", l > 0 ? l_prev * resc / l : 0.0,
                r.w[size_t(i)]);
  }
  if (resc > 0 && resc < 1)
    ImGui::TextColored(ImVec4(1, 0.4f, 0.4f, 1),
                       "m rose: earlier state rescaled by e^(m_prev - m_new) = %.6g", resc);
}

void derivation_flashd(const Model& model, int i, const reference::RowTrace& r) {
  const auto& s = model.scores();
  double L_prev = i > 0 ? r.lse[size_t(i - 1)] : -INFINITY;
  ImGui::Text("s_%d = %.6g", i, s[size_t(i)]);
  ImGui::Text("w_%d = sigma(s_%d - s_%d + ln w_%d) = sigma(s_%d - L_%d)", i, i, i - 1, i - 1, i,
              i - 1);
  ImGui::Text("     = sigma(%.6g - %.6g) = %.6g", s[size_t(i)], L_prev, r.w[size_t(i)]);
  ImGui::Text("L_%d = L_%d + ln(1 + e^(s_%d - L_%d)) = %.6g", i, i - 1, i, i - 1, r.lse[size_t(i)]);
  ImGui::Text("o_%d = o_%d (1 - w_%d) + v_%d w_%d", i, i - 1, i, i, i);
  ImGui::TextDisabled("carrying L = s - ln w keeps ln w from underflowing (docs/algorithms.md)");
}

void draw_derivation(const Model& model) {
  int i = model.cursor;
  if (model.steps() == 0) return;
  Variant v = model.selected.empty() ? Variant::flash1 : model.selected[0];
  ImGui::Text("Step %d of %d, %s (the first selected variant)", i, model.steps() - 1,
              variant_name(v));
  ImGui::Separator();
  if (!std::isfinite(model.scores()[size_t(i)])) {
    ImGui::Text("key %d is masked: s = -inf, w = 0, the state is unchanged", i);
  } else if (v == Variant::flashd) {
    derivation_flashd(model, i, model.ref_of(Variant::flashd));
  } else if (v == Variant::naive || v == Variant::online) {
    const auto& d = model.direct();
    ImGui::Text("a_%d = e^(x_%d - m_N) / d_N = %.6g", i, i, d.w[size_t(i)]);
    ImGui::Text("o_%d = o_%d + a_%d v_%d", i, i - 1, i, i);
    ImGui::TextDisabled(v == Variant::naive ? "m_N and d_N come from the first two passes over S"
                                            : "m_N and d'_N come from the first (online) pass");
  } else {
    derivation_flash(model, i,
                     model.ref_of(v == Variant::flash1 ? Variant::flash1 : Variant::flash2),
                     v != Variant::flash1);
  }
  ImGui::Separator();
  ImGui::Text("What ties the variants together at this step (float64):");
  const auto& fa1 = model.ref_of(Variant::flash1);
  const auto& fa2 = model.ref_of(Variant::flash2);
  const auto& fd = model.ref_of(Variant::flashd);
  size_t k = size_t(i);
  if (fa2.l[k] > 0) {
    double diff = 0;
    for (size_t c = 0; c < fa1.o[k].size(); ++c)
      diff = std::max(diff, std::abs(fa2.o[k][c] / fa2.l[k] - fa1.o[k][c]));
    ImGui::Text("FA2 o/l = FA1 o            max |diff| = %.2e", diff);
    ImGui::Text("FLASH-D w = e^(s-m)/l      %.9g = %.9g", fd.w[k],
                std::exp(model.scores()[k] - fa1.m[k]) / fa1.l[k]);
    ImGui::Text("FLASH-D L = m + ln l       %.9g = %.9g", fd.lse[k], fa1.m[k] + std::log(fa1.l[k]));
  } else {
    ImGui::Text("no key visible yet");
  }
  ImGui::Separator();
  ImGui::Text("GPU state at this step (per variant):");
  for (const auto& t : model.traces()) {
    const auto& st = t.gpu.steps;
    ImVec4 color = ImGui::ColorConvertU32ToFloat4(variant_color(t.variant));
    if (t.variant == Variant::flashd)  // FLASH-D keeps no max and no denominator, only L
      ImGui::TextColored(color, "%-8s L=%-10.5g            w=%-10.5g err=%.1e",
                         variant_name(t.variant), st.lse[k], st.w[k], t.error[k]);
    else
      ImGui::TextColored(color, "%-8s m=%-10.5g l=%-10.5g w=%-10.5g err=%.1e",
                         variant_name(t.variant), st.m[k], st.l[k], st.w[k], t.error[k]);
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
  plot("output vector at the step, by component", series, int(model.dims().dv), -1, false,
       ImVec2(avail.x, std::min(160.0f, avail.y * 0.4f)), {}, NAN, "component");
}

void draw_output(const Model& model) {
  output_vector_plot(model);
  const auto& d = model.direct();
  ImGui::Text("Final output of row %u vs float64 softmax(s) v   (LSE %.6g)", model.row,
              d.final_lse);
  for (const auto& t : model.traces()) {
    double err = 0;
    for (size_t c = 0; c < d.out.size(); ++c)
      err = std::max(err, std::abs(double(t.gpu.out[c]) - d.out[c]));
    ImGui::TextColored(ImGui::ColorConvertU32ToFloat4(variant_color(t.variant)),
                       "%-8s max |o - o_ref| = %.2e  LSE %.6g", variant_name(t.variant), err,
                       t.gpu.lse);
  }
  for (const auto& t : model.traces()) {
    if (t.variant != Variant::splitkv) continue;
    ImGui::Separator();
    ImGui::Text("splitkv: %zu chunks merged with log-sum-exp", t.gpu.splits.size());
    ImGui::Text("%-12s %-11s %-11s %-11s", "keys", "m_c", "d'_c", "o'_c[0]");
    for (const auto& s : t.gpu.splits)
      ImGui::Text("[%5u,%5u) %-11.5g %-11.5g %-11.5g%s", s.begin, s.end, s.m, s.l,
                  s.o.empty() ? 0.0f : s.o[0], std::isfinite(s.m) ? "" : "  (empty)");
    ImGui::Text("merged: m_N = max m_c, d'_N = sum d'_c e^(m_c - m_N)");
    ImGui::Text("o[0] = %.6g (float64: %.6g)", t.gpu.out.empty() ? 0.0f : t.gpu.out[0],
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

void draw_ui(Model& model, UiState& ui, double dt) {
  ImVec2 size = ImGui::GetIO().DisplaySize;
  float left = 360, right = 470, mid = size.x - left - right, top = size.y * 0.62f;
  if (begin_panel(1, 0, 0, left, size.y)) draw_controls(model, ui, dt);
  ImGui::End();
  if (begin_panel(2, left, 0, mid, top)) draw_plots(model, ui);
  ImGui::End();
  if (begin_panel(3, left, top, mid, size.y - top)) draw_heatmap(model, ui);
  ImGui::End();
  if (begin_panel(4, left + mid, 0, right, size.y * 0.55f)) draw_derivation(model);
  ImGui::End();
  if (begin_panel(5, left + mid, size.y * 0.55f, right, size.y * 0.45f)) draw_output(model);
  ImGui::End();
}

}  // namespace flashvk::viewer
