#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace flashvk::cli {

/// `flashvk pipelines`: the pipelines a call builds and the driver's statistics of each.
int cmd_pipelines(const std::vector<std::string>& argv);

/// What a kernel's disassembly (ACO's "Assembly", RADV) is made of: its VALU instructions and,
/// among them, fused multiply-adds (v_fma*, v_fmac*, v_pk_fma*, v_dot2*, v_mac*), over the
/// whole kernel and over its largest loop (the key loop).
struct IsaMix {
  uint64_t valu = 0, fma = 0, loop_valu = 0, loop_fma = 0;
};
IsaMix isa_mix(const std::string& assembly);

}  // namespace flashvk::cli
