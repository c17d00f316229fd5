#pragma once
#include <string>

#include "ui.hpp"

namespace flashvk::viewer {

/// The interactive viewer in a GLFW window. Returns the exit status.
int run_window(int device, Inputs inputs, UiState ui, const std::vector<Variant>& variants);

/// True when GLFW can open a window here (a display is reachable).
bool display_available();

}  // namespace flashvk::viewer
