#pragma once
// flashvk: FlashAttention-family attention as Vulkan compute shaders.
#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "flashvk/error.hpp"
#include "flashvk/reference.hpp"
#include "flashvk/tensor.hpp"
#include "flashvk/trace.hpp"
// Benchmark and test tooling: flashvk/tools/peak.hpp, flashvk/tools/testing.hpp.
