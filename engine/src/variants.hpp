#pragma once
// The variants' table (attention.hpp's VariantInfo), constexpr so that the kernel builds can be
// checked against it at compile time (kernels.cpp).
#include "flashvk/attention.hpp"

namespace flashvk::detail {

inline constexpr VariantInfo kVariants[] = {
    {Variant::naive, "naive",
     "naive: three passes over the row (max, sum, output); S and P are materialised.", false, 1,
     true, false, false, false, false},
    {Variant::online, "online",
     "online: two passes; the first keeps a running max and a rescaled sum.", true, 2, true, true,
     false, false, false},
    {Variant::flash1, "flash1",
     "flash1 (FlashAttention): one pass, the output normalised at every step.", true, 1, true, true,
     true, false, false},
    {Variant::flash2, "flash2",
     "flash2 (FlashAttention-2): one pass, the division by l deferred to the end.", true, 1, true,
     true, true, false, true},
    {Variant::flashd, "flashd",
     "flashd (FLASH-D): one pass with sigmoid weights; no max, no division.", true, 1, false, true,
     true, false, false},
    {Variant::splitkv, "splitkv",
     "splitkv (Flash-Decoding): chunks of keys in parallel, merged with log-sum-exp.", true, 1,
     true, true, true, true, true},
};

}  // namespace flashvk::detail
