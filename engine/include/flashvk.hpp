#pragma once
// flashvk: FlashAttention-family attention as Vulkan compute shaders. This is the engine, all an
// application needs (the library flashvk::flashvk). Beside it, each a library of its own: the
// float64 reference (flashvk/reference.hpp, flashvk::reference), traces of the real kernels
// (flashvk/trace.hpp, flashvk::trace) and the device's measured peaks (flashvk/tools/peak.hpp,
// flashvk::peak).
#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "flashvk/error.hpp"
#include "flashvk/modifiers.hpp"
#include "flashvk/pipelines.hpp"
#include "flashvk/tensor.hpp"
