// The matrix units as the cooperative-matrix kernel (flash_cm.comp) uses them, one home for the
// ways a build reaches them (shaders/builds.def, option MAT; DeviceInfo::matrix_api):
//   CM_KHR       GL_KHR_cooperative_matrix (VK_KHR_cooperative_matrix: NVIDIA, AMD RDNA3 and
//                later, Intel Arc)
//   CM_NV        GL_NV_cooperative_matrix (VK_NV_cooperative_matrix, NVIDIA's first extension)
//   CM_NV2       CM_KHR's types with GL_NV_cooperative_matrix2's row operations (CM_ROW_OPS,
//                at the end)
//   CM_EMULATE   the same products in ordinary arithmetic, on any device (MatrixApi::emulated:
//                what lets the tests run this kernel on a CPU; slow); CM_EMULATE_NV2 with the
//                row operations too (MatrixApi::emulated_nv2)
// The shape is the device's (DeviceInfo::matrix_shape, as specialization constants): CM_M x 16
// times 16 x CM_N into CM_M x CM_N, by a group of SUBGROUP = CM_M * CM_N / 8 invocations:
// 16 x 16 by 32 (NVIDIA, AMD RDNA3), 8 x 16 by 16 (Intel Xe2), 8 x 8 by 8 (Intel Arc A). On the
// matrix units a group is a subgroup of that size (the host requires it); emulated, SUBGROUP
// consecutive invocations, whatever the device's subgroups are.
//
// Types: CmA (CM_M x 16 fp16, the left operand), CmBt (16 x CM_N fp16, the right, loaded as the
// transpose of rows; CmB on the matrix units, where they are one type), CmAcc (CM_M x CM_N
// fp32). Arrays are of uvec4 (8 fp16 values, or 4 fp32), so every matrix starts 16-byte aligned;
// offsets and strides count those elements.
// Macros, as GLSL passes arrays by value:
//   cm_zero(c)                     c = 0
//   cm_load_a(a, arr, off, stride) a from a row-major array (fp16)
//   cm_load_bt(b, arr, off, stride) b as the transpose of a row-major array (K^T from K's rows,
//                                  V from V^T's)
//   cm_mul_add(c, a, b)            c += a b
//   cm_store(c, arr, off, stride)  c into a row-major array (fp32)
//   cm_load_acc(c, arr, off, stride) c from a row-major array (fp32)
//   cm_scale(c, f)                 c *= f, element by element (f a CmAcc)
//   cm_blend(c, f, x, g)           c = c * f + x * g, element by element (all CmAcc)
// and CM_LANE, CM_GROUP (this invocation's lane in its group, and the group in the workgroup),
// CM_LPG (the lanes of a group a matrix row has: SUBGROUP / CM_M), cm_sync() (the group's
// shared-memory writes before it are seen by the group after it), cm_xor(x, m) (x of lane
// CM_LANE ^ m, m below SUBGROUP) and cm_any(x) (whether x holds in any lane of the group: the same
// in every lane, so a condition the matrix operations may run under). cm_sync, cm_xor and cm_any
// are workgroup barriers when emulated: the kernel calls them in uniform control flow.
//
// Emulated, a lane holds its row of CmA whole (row CM_LANE / CM_LPG), and of CmAcc the 8 columns
// (CM_LANE % CM_LPG) * 8 .. + 7 of that row (CM_M * CM_N = 8 * SUBGROUP); CmBt stays where it
// was loaded from, CM_B_ARRAY (which the kernel defines), and cm_mul_add reads it there: no lane
// needs another's values. The loops are unrolled (llvmpipe stops an invocation's loops after
// 65535 iterations in all).

#ifdef CM_EMULATE_NV2  // the second extension's kernel, emulated: CM_EMULATE with row operations
#define CM_EMULATE
#endif
#if defined(CM_NV2) || defined(CM_EMULATE_NV2)
#define CM_ROW_OPS
#endif

const uint CM_LPG = SUBGROUP / CM_M;
#ifdef CM_EMULATE
#define CM_LANE (gl_LocalInvocationID.x % SUBGROUP)
#define CM_GROUP (gl_LocalInvocationID.x / SUBGROUP)
#else
#define CM_LANE gl_SubgroupInvocationID
#define CM_GROUP gl_SubgroupID
#endif

#if defined(CM_KHR) || defined(CM_NV2)
#extension GL_KHR_cooperative_matrix : require
#ifdef CM_NV2
#extension GL_NV_cooperative_matrix2 : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#define CmA coopmat<float16_t, gl_ScopeSubgroup, CM_M, 16, gl_MatrixUseA>
#define CmB coopmat<float16_t, gl_ScopeSubgroup, 16, CM_N, gl_MatrixUseB>
#define CmBt CmB
#define CmAcc coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>
#define cm_zero(c) c = CmAcc(0.0)
#define cm_load_a(a, arr, off, stride) \
  coopMatLoad(a, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define cm_load_bt(b, arr, off, stride) \
  coopMatLoad(b, arr, off, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define cm_mul_add(c, a, b) c = coopMatMulAdd(a, b, c)
#define cm_store(c, arr, off, stride) \
  coopMatStore(c, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define cm_load_acc(c, arr, off, stride) \
  coopMatLoad(c, arr, off, stride, gl_CooperativeMatrixLayoutRowMajor)
#define cm_scale(c, f) c = c * (f)
#define cm_blend(c, f, x, g) c = c * (f) + (x) * (g)

#elif defined(CM_NV)
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#define CmA fcoopmatNV<16, gl_ScopeSubgroup, CM_M, 16>
#define CmB fcoopmatNV<16, gl_ScopeSubgroup, 16, CM_N>
#define CmBt CmB
#define CmAcc fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>
#define cm_zero(c) c = CmAcc(0.0)
#define cm_load_a(a, arr, off, stride) coopMatLoadNV(a, arr, off, stride, false)
#define cm_load_bt(b, arr, off, stride) coopMatLoadNV(b, arr, off, stride, true)
#define cm_mul_add(c, a, b) c = coopMatMulAddNV(a, b, c)
#define cm_store(c, arr, off, stride) coopMatStoreNV(c, arr, off, stride, false)
#define cm_load_acc(c, arr, off, stride) coopMatLoadNV(c, arr, off, stride, false)
// Element by element through each invocation's own elements (the first extension has no
// product of two matrices); matrices of one type share the element layout.
#define cm_scale(c, f) \
  for (int cm_i = 0; cm_i < c.length(); ++cm_i) c[cm_i] *= (f)[cm_i]
#define cm_blend(c, f, x, g)                       \
  for (int cm_i = 0; cm_i < c.length(); ++cm_i) \
    c[cm_i] = c[cm_i] * (f)[cm_i] + (x)[cm_i] * (g)[cm_i]

#elif defined(CM_EMULATE)
struct CmA {
  float v[16];  // row CM_LANE / CM_LPG, whole
};
struct CmBt {
  uint off, stride;  // where in CM_B_ARRAY its transpose's rows are, in uvec4 elements
};
struct CmAcc {
  float v[8];  // row CM_LANE / CM_LPG, columns (CM_LANE % CM_LPG) * 8 .. + 7
};
// The 8 fp16 values of a uvec4, into v[at] ..
#define cm_unpack8(v, at, w)                                 \
  [[unroll]] for (uint cm_i = 0u; cm_i < 4u; ++cm_i) {       \
    vec2 cm_x = unpackHalf2x16((w)[cm_i]);                   \
    v[(at) + cm_i * 2u] = cm_x.x;                            \
    v[(at) + cm_i * 2u + 1u] = cm_x.y;                       \
  }
#define cm_zero(c) \
  [[unroll]] for (uint cm_i = 0u; cm_i < 8u; ++cm_i) c.v[cm_i] = 0.0
#define cm_load_a(a, arr, off, stride)                                  \
  [[unroll]] for (uint cm_h = 0u; cm_h < 2u; ++cm_h) {                  \
    cm_unpack8(a.v, cm_h * 8u, arr[(off) + (CM_LANE / CM_LPG) * (stride) + cm_h]) \
  }
#define cm_load_bt(b, arr, off, stride) b = CmBt(off, stride)
// c += a b, b the transpose of rows in memory: column i of b is two uvec4 of a row.
void cm_emu_mul_add(inout CmAcc c, CmA a, CmBt b) {
  [[unroll]] for (uint i = 0u; i < 8u; ++i) {
    uint at = b.off + ((CM_LANE % CM_LPG) * 8u + i) * b.stride;
    float col[16];
    cm_unpack8(col, 0u, CM_B_ARRAY[at])
    cm_unpack8(col, 8u, CM_B_ARRAY[at + 1u])
    float sum = c.v[i];
    [[unroll]] for (uint k = 0u; k < 16u; ++k) sum += a.v[k] * col[k];
    c.v[i] = sum;
  }
}
#define cm_mul_add(c, a, b) cm_emu_mul_add(c, a, b)
#define cm_store(c, arr, off, stride)                                                   \
  [[unroll]] for (uint cm_h = 0u; cm_h < 2u; ++cm_h)                                    \
    arr[(off) + (CM_LANE / CM_LPG) * (stride) + (CM_LANE % CM_LPG) * 2u + cm_h] =       \
        floatBitsToUint(vec4(c.v[cm_h * 4u], c.v[cm_h * 4u + 1u], c.v[cm_h * 4u + 2u],  \
                             c.v[cm_h * 4u + 3u]))
#define cm_load_acc(c, arr, off, stride)                                              \
  [[unroll]] for (uint cm_h = 0u; cm_h < 2u; ++cm_h) {                                \
    uint cm_at = (off) + (CM_LANE / CM_LPG) * (stride) + (CM_LANE % CM_LPG) * 2u + cm_h; \
    vec4 cm_x = uintBitsToFloat(arr[cm_at]);                                          \
    [[unroll]] for (uint cm_i = 0u; cm_i < 4u; ++cm_i) c.v[cm_h * 4u + cm_i] = cm_x[cm_i]; \
  }
#define cm_scale(c, f) \
  [[unroll]] for (uint cm_i = 0u; cm_i < 8u; ++cm_i) c.v[cm_i] *= (f).v[cm_i]
#define cm_blend(c, f, x, g)                          \
  [[unroll]] for (uint cm_i = 0u; cm_i < 8u; ++cm_i) \
    c.v[cm_i] = c.v[cm_i] * (f).v[cm_i] + (x).v[cm_i] * (g).v[cm_i]

#else
#error "coopmat.glsl: build with CM_KHR, CM_NV, CM_NV2, CM_EMULATE or CM_EMULATE_NV2 (builds.def, MAT)"
#endif

#ifdef CM_EMULATE
shared float cm_pair[gl_WorkGroupSize.x];  // cm_xor's exchange
void cm_sync() {
  memoryBarrierShared();
  barrier();
}
float cm_xor(float x, uint m) {
  cm_pair[gl_LocalInvocationID.x] = x;
  cm_sync();
  float y = cm_pair[gl_LocalInvocationID.x ^ m];
  barrier();  // read before the next exchange writes
  return y;
}
bool cm_any(bool x) {
  cm_pair[gl_LocalInvocationID.x] = x ? 1.0 : 0.0;
  cm_sync();
  uint first = gl_LocalInvocationID.x - CM_LANE;
  float any = 0.0;
  [[unroll]] for (uint l = 0u; l < SUBGROUP; ++l) any = max(any, cm_pair[first + l]);
  barrier();  // read before the next exchange writes
  return any != 0.0;
}
#else
void cm_sync() {
  subgroupMemoryBarrierShared();
  subgroupBarrier();
}
float cm_xor(float x, uint m) {
  return subgroupShuffleXor(x, m);
}
bool cm_any(bool x) { return subgroupAny(x); }
#endif

// Row operations (CM_ROW_OPS: VK_NV_cooperative_matrix2, or emulated), for a kernel that keeps
// the softmax in accumulator matrices. Only at CM_N = 16, where an accumulator's row is a left
// operand's (cm_to_a).
//   cm_len(c), CM_EL(c, i)      this invocation's elements of c; matrices of one type share the
//                               element layout, so element i of each is in the same row
//   cm_row_max(r, c), cm_row_sum(r, c)  every element of r: the max or sum of its row of c
//   cm_each(r, c, fn, a, b)     r = fn(row, column, c's element, a, b) element by element (a, b:
//                               uint; fn's parameters const in)
//   cm_to_a(a, c)               an accumulator as a left operand (fp16)
#if defined(CM_NV2)
float cm_max_op(const in float x, const in float y) { return max(x, y); }
float cm_sum_op(const in float x, const in float y) { return x + y; }
#define cm_len(c) (c).length()
#define CM_EL(c, i) c[i]
#define cm_row_max(r, c) coopMatReduceNV(r, c, gl_CooperativeMatrixReduceRowNV, cm_max_op)
#define cm_row_sum(r, c) coopMatReduceNV(r, c, gl_CooperativeMatrixReduceRowNV, cm_sum_op)
#define cm_each(r, c, fn, a, b) coopMatPerElementNV(r, c, fn, a, b)
#define cm_to_a(a, c) a = CmA(c)
#elif defined(CM_EMULATE_NV2)
// Element i of a lane's: row CM_LANE / CM_LPG, column (CM_LANE % CM_LPG) * 8 + i (see above).
#define cm_len(c) 8
#define CM_EL(c, i) c.v[i]
// The max (or the sum) of the row: the lane's 8 elements, then its row's CM_LPG lanes'.
float cm_emu_combine(float x, float y, bool sum) { return sum ? x + y : max(x, y); }
void cm_emu_row(out CmAcc r, CmAcc c, bool sum) {
  float x = c.v[0];
  [[unroll]] for (uint i = 1u; i < 8u; ++i) x = cm_emu_combine(x, c.v[i], sum);
  [[unroll]] for (uint m = 1u; m < CM_LPG; m *= 2u) x = cm_emu_combine(x, cm_xor(x, m), sum);
  [[unroll]] for (uint i = 0u; i < 8u; ++i) r.v[i] = x;
}
#define cm_row_max(r, c) cm_emu_row(r, c, false)
#define cm_row_sum(r, c) cm_emu_row(r, c, true)
#define cm_each(r, c, fn, a, b)                                                   \
  [[unroll]] for (uint cm_i = 0u; cm_i < 8u; ++cm_i)                              \
    r.v[cm_i] = fn(CM_LANE / CM_LPG, (CM_LANE % CM_LPG) * 8u + cm_i, (c).v[cm_i], a, b)
// The row's CM_LPG lanes' elements through shared memory, rounded to fp16 as the conversion does.
shared float cm_rows_x[gl_WorkGroupSize.x * 8u];
void cm_to_a(out CmA a, CmAcc c) {
  uint me = gl_LocalInvocationID.x, first = me - CM_LANE % CM_LPG;
  [[unroll]] for (uint i = 0u; i < 8u; ++i) cm_rows_x[me * 8u + i] = c.v[i];
  cm_sync();
  [[unroll]] for (uint l = 0u; l < CM_LPG; ++l)
    [[unroll]] for (uint i = 0u; i < 8u; ++i)
      a.v[l * 8u + i] = unpackHalf2x16(packHalf2x16(vec2(cm_rows_x[(first + l) * 8u + i], 0.0))).x;
  barrier();  // read before the next conversion writes
}
#endif
