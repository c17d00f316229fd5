#version 460
// Calibration for `flashvk bench --peak` on devices with cooperative matrices: the matrix units'
// fp16-in, fp32-accumulate throughput through the API the attention kernel uses (coopmat.glsl:
// VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix), the same products in the same shape
// (CM_M x 16 times 16 x CM_N) flash_cm.comp runs. Every subgroup runs 8 independent chains of
// multiply-adds on registers, pc.nk times, and stores its sum. FLOPs per subgroup:
// pc.nk * 8 * 2 * CM_M * CM_N * 16.
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_EXT_control_flow_attributes : require

#extension GL_GOOGLE_include_directive : require
#include "spec_constants.glsl"  // the workgroup size
#include "coopmat.glsl"
layout(std430, binding = 3) writeonly buffer OBuf { float o_buf[]; };
layout(push_constant) uniform Params {
  uint batch, heads, kv_heads, nq, nk;
  float scale;
}
pc;

void main() {
  CmA a = CmA(float16_t(pc.scale));  // from the host, so nothing folds
  CmB b = CmB(float16_t(1.0 - pc.scale));
  CmAcc acc[8];
  [[unroll]] for (uint c = 0u; c < 8u; ++c) acc[c] = CmAcc(float(c) * 1e-3);
  for (uint i = 0u; i < pc.nk; ++i)
    [[unroll]] for (uint c = 0u; c < 8u; ++c) cm_mul_add(acc[c], a, b);
  CmAcc sum = acc[0];
  [[unroll]] for (uint c = 1u; c < 8u; ++c) sum = sum + acc[c];
  uint subgroup = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
  cm_store(sum, o_buf, subgroup * CM_M * CM_N, CM_N);
}
