#pragma once
#include <string>

#include "ui.hpp"

namespace flashvk::viewer {

/// The interactive viewer in a GLFW window, the cursor on `step` (-1: the row's last visible
/// key). Returns the exit status. With `screenshot` set, saves the window as PNG after a few
/// frames and closes.
int run_window(int device, Inputs inputs, UiState ui, const std::vector<Variant>& variants,
               int step = -1, const std::string& screenshot = "");

/// True when GLFW can open a window here (a display is reachable).
bool display_available();

}  // namespace flashvk::viewer
