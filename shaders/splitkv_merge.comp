#version 460
#extension GL_GOOGLE_include_directive : require
// Flash-Decoding's reduction as a dispatch of its own (chunk_merge.glsl), after splitkv.comp's
// chunks: BC invocations a row, one on CPU drivers (its elements in unrolled loops), 32 on GPUs,
// so that the merge reads the chunks' outputs in wide, contiguous requests.
#include "common.glsl"
#include "lse_merge.glsl"
#define MERGE_LANES BC
#include "chunk_merge.glsl"

void main() {
  uint per_group = gl_WorkGroupSize.x / BC;
  uint group_index = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
  uint row = group_index * per_group + gl_LocalInvocationID.x / BC;
  if (row >= pc.batch * pc.heads * pc.nq) return;
  merge_chunks(row, gl_LocalInvocationID.x % BC);
}
