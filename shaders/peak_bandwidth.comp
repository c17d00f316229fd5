#version 460
// Calibration for `flashvk bench --peak`: the device's read bandwidth. Invocation t of T reads
// vec4s t, t + T, t + 2T, ... (consecutive invocations read consecutive addresses), pc.nk per
// invocation, four at a time, and stores their sum.
#extension GL_EXT_control_flow_attributes : require

#extension GL_GOOGLE_include_directive : require
#include "spec_constants.glsl"  // the workgroup size
layout(std430, binding = 0) readonly buffer InBuf { vec4 in_buf[]; };
layout(std430, binding = 3) writeonly buffer OBuf { float o_buf[]; };
layout(push_constant) uniform Params {
  uint batch, heads, kv_heads, nq, nk;
}
pc;

void main() {
  uint t = gl_GlobalInvocationID.x;
  uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
  vec4 s0 = vec4(0.0), s1 = vec4(0.0), s2 = vec4(0.0), s3 = vec4(0.0);
  for (uint i = 0u; i < pc.nk; i += 4u) {
    s0 += in_buf[t + (i + 0u) * stride];
    s1 += in_buf[t + (i + 1u) * stride];
    s2 += in_buf[t + (i + 2u) * stride];
    s3 += in_buf[t + (i + 3u) * stride];
  }
  vec4 s = (s0 + s1) + (s2 + s3);
  o_buf[t] = s.x + s.y + s.z + s.w;
}
