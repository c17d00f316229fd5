#version 460
#extension GL_GOOGLE_include_directive : require
// Naive attention, step 2 of 3: the 3-pass safe softmax (docs/algorithms.md, variants, naive) on one materialised row of S,
// written back in place as P. A workgroup owns one row; its invocations stride over the keys.
//   pass 1: m_N = max_j x_j      pass 2: d_N = sum_j e^(x_j - m_N)      pass 3: a_j = e^(x_j - m_N) / d_N
#include "common.glsl"

shared float partial[gl_WorkGroupSize.x];

// Tree reduction over the workgroup; op 0 = max, 1 = sum.
float reduce(float v, uint op) {
  uint lid = gl_LocalInvocationID.x;
  partial[lid] = v;
  barrier();
  for (uint width = gl_WorkGroupSize.x / 2u; width > 0u; width /= 2u) {
    if (lid < width) {
      float other = partial[lid + width];
      partial[lid] = op == 0u ? max(partial[lid], other) : partial[lid] + other;
    }
    barrier();
  }
  float result = partial[0];
  barrier();
  return result;
}

void main() {
  uint i = gl_WorkGroupID.x;
  uint bh = pc.bh0 + gl_WorkGroupID.y;
  uint base = (gl_WorkGroupID.y * pc.nq + i) * kv_len();
  uint lid = gl_LocalInvocationID.x;
  uint step = gl_WorkGroupSize.x;

  // An attention sink (MOD_SINKS) counts in m and d as a key of zero value.
  float sink = NEG_INF;
  if ((MODS & MOD_SINKS) != 0u) sink = head_buf[bh].y;
  float m = NEG_INF;
  for (uint j = lid; j < kv_len(); j += step) m = max(m, scratch1[base + j]);
  m = max(reduce(m, 0u), sink);
  float e_sink = sink == NEG_INF ? 0.0 : exp(sink - m);

  float d = 0.0;
  if (m != NEG_INF)
    for (uint j = lid; j < kv_len(); j += step) {
      float x = scratch1[base + j];
      d += x == NEG_INF ? 0.0 : exp(x - m);
    }
  d = reduce(d, 1u) + e_sink;

  // The seed's three loops, run serially for the traced row before S is overwritten: per key the
  // score, the running max (pass 1), the running denominator against the final max (pass 2) and
  // the weight a_j (pass 3).
  if (lid == 0u && is_traced(make_row(bh / pc.heads, bh % pc.heads, i, true))) {
    float run_m = sink;
    float run_d = e_sink;
    for (uint j = 0u; j < kv_len(); ++j) {
      float x = scratch1[base + j];
      float e = x == NEG_INF ? 0.0 : exp(x - m);
      run_m = max(run_m, x);
      run_d += e;
      trace_put(j, 0u, x);
      trace_put(j, 1u, run_m);
      trace_put(j, 2u, run_d);
      trace_put(j, 3u, d > 0.0 ? e / d : 0.0);
    }
  }
  barrier();  // S is read above before any invocation overwrites it with P

  float inv = d > 0.0 ? 1.0 / d : 0.0;
  for (uint j = lid; j < kv_len(); j += step) {
    float x = scratch1[base + j];
    scratch1[base + j] = x == NEG_INF ? 0.0 : exp(x - m) * inv;
  }
  if (lid == 0u && (pc.flags & FLAG_LSE) != 0u)
    lse_buf[bh * pc.nq + i] = d > 0.0 ? m + log(d) : NEG_INF;

}
