#pragma once
// flashvk: FlashAttention-family attention as Vulkan compute shaders.
#include "flashvk/attention.hpp"
#include "flashvk/context.hpp"
#include "flashvk/error.hpp"
#include "flashvk/peak.hpp"
#include "flashvk/reference.hpp"
#include "flashvk/tensor.hpp"
#include "flashvk/trace.hpp"
