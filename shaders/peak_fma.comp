#version 460
// Calibration for `flashvk bench --peak`: the device's fp32 FMA throughput. Every invocation runs
// 32 independent chains of fused multiply-adds on registers (enough to hide FMA latency on a CPU
// or a GPU), pc.nk times over an unrolled body, and stores one value so nothing is dropped.
// FLOPs per invocation: pc.nk * 8 steps * 8 vec4 * 4 lanes * 2.
#extension GL_EXT_control_flow_attributes : require

#extension GL_GOOGLE_include_directive : require
#include "spec_constants.glsl"  // the workgroup size
layout(std430, binding = 3) writeonly buffer OBuf { float o_buf[]; };
layout(push_constant) uniform Params {
  uint batch, heads, kv_heads, nq, nk;
  float scale;
}
pc;

void main() {
  vec4 a = vec4(pc.scale);  // from the host, so the compiler cannot fold the chains
  vec4 b = vec4(1.0 - pc.scale);
  vec4 x0 = vec4(gl_GlobalInvocationID.x) * 1e-6;
  vec4 x1 = x0 + 0.1, x2 = x0 + 0.2, x3 = x0 + 0.3, x4 = x0 + 0.4, x5 = x0 + 0.5,
       x6 = x0 + 0.6, x7 = x0 + 0.7;
  for (uint i = 0u; i < pc.nk; ++i) {
    [[unroll]] for (uint u = 0u; u < 8u; ++u) {
      x0 = fma(x0, a, b);
      x1 = fma(x1, a, b);
      x2 = fma(x2, a, b);
      x3 = fma(x3, a, b);
      x4 = fma(x4, a, b);
      x5 = fma(x5, a, b);
      x6 = fma(x6, a, b);
      x7 = fma(x7, a, b);
    }
  }
  vec4 s = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
  o_buf[gl_GlobalInvocationID.x] = s.x + s.y + s.z + s.w;
}
