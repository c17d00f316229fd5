#pragma once
// The viewer's panels, one function each, laid out over the whole display.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "lessons.hpp"
#include "model.hpp"

namespace flashvk::viewer {

/// Keys [lo, hi) of the row that the step plots show.
struct KeyWindow {
  int lo = 0, hi = 0;
};

struct UiState {
  std::string assets = "assets";
  int preset = 0;
  RandomSpec random;
  char q_path[256] = "", k_path[256] = "", v_path[256] = "";
  char score_path[256] = "", mask_path[256] = "", table_path[256] = "";  // the user's functions
  char csv_path[256] = "trace.csv", png_path[256] = "viewer.png";
  bool playing = false;
  float speed = 20.0f;  // steps per second
  double play_clock = 0.0;
  bool log_l = true;
  bool log_w = false;          // the weight plot on a log scale (click the plot)
  bool show_p = true;          // heatmap of P (else S)
  int png_panel = 0;           // 0 = whole window, else a panel index
  bool png_requested = false;  // set by the Export button; the frame loop saves the image
  std::string status;
  // The lesson of what is shown, made again when the inputs, batch, head or row change.
  Lesson lesson;
  std::string lesson_of;        // what `lesson` was made for
  int point = -1;               // the point of interest last gone to
  int log_point = -1;           // the step whose point put the weight plot on a log scale
  bool literal_flashd = false;  // draw FLASH-D as the seed writes it (fp32) in the weight plot
  // The step plots' window of keys (key_window): 0 keys = chosen from the plots' width; set by
  // the mouse wheel (zoom) and dragging (pan), kept until the cursor leaves it.
  int view_lo = 0, view_span = 0, view_cursor = -1;
  KeyWindow shown;  // the keys the plots showed in the last frame; the heatmap shows the same
};

/// Seconds between frames while the worker traces and nothing plays: the progress line moves
/// and input is answered, and the trace keeps most of the CPU (lavapipe draws on it too).
constexpr double kBusyFrame = 1.0 / 15.0;

/// Pixels a key needs before the plots show a window around the cursor instead of the whole row.
constexpr float kKeyPixels = 3.0f;
/// The drawing width of a step plot in a display `width` pixels wide (draw_ui's layout).
float plot_pixels(float width);
/// The keys the step plots show with the cursor on `cursor`: the whole row when each key gets at
/// least kKeyPixels, else as many keys as get them, centred on the cursor; once zoomed or
/// panned (ui.view_span), that window, moved only when the cursor has moved out of it.
KeyWindow key_window(int steps, int cursor, float plot_px, const UiState& ui);

/// The y axis of a step plot: the finite values of `series` over the keys shown (`win`; every
/// key when empty) and `hline`; on a log axis the positive ones. Never empty (lo < hi).
struct YRange {
  double lo = 0, hi = 1;
};
YRange y_range(const std::vector<const std::vector<double>*>& series, KeyWindow win, bool log_y,
               double hline = NAN);

/// A variant's colour in every panel (Okabe and Ito's palette).
uint32_t variant_color(Variant v);  // ImGui's ImU32: 0xAABBGGRR

/// Panel names in export order (index 0 is the whole window).
const char* const* panel_names(int* count);

/// Puts the cursor on `step` (--step; clamped to the row), or leaves it on the row's last
/// visible key for -1: as the viewer opens, in a window and headless alike.
void open_at_step(Model& model, int step);
/// The window's first frames, while the worker traces the inputs it opened with: what it
/// traces and how far (Model::progress), centred.
void draw_opening(const Model& model);

/// The keyboard's steps: left and right arrows one key (and stop playing), space plays or pauses.
void step_keys(Model& model, UiState& ui, bool left, bool right, bool space);
/// Playing: the cursor moves speed * dt keys (ui.play_clock keeps the fraction), stopping on the
/// row's last key. draw_ui calls it before any panel draws.
void advance_playback(Model& model, UiState& ui, double dt);
/// A double click on a plot: the plots show every key of the row (until a zoom or pan).
void show_whole_row(UiState& ui, int steps);
/// Where step button `index` (0..4: |< < Play > >|) was drawn last frame: x, y, w, h.
bool step_button_rect(int index, float rect[4]);

/// Draws every panel for this frame. `dt` advances playback.
void draw_ui(Model& model, UiState& ui, double dt);

/// What did not fit in the last frame: each panel whose content is wider than the panel, each
/// plot label wider than its plot. Empty when everything fits.
const std::vector<std::string>& layout_overflows();

/// The rectangle of panel `index` (1-based) from the last frame, in pixels: x, y, w, h.
bool panel_rect(int index, float rect[4]);

}  // namespace flashvk::viewer
