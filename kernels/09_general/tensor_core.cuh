// tensor_core.cuh — tensor cores below WMMA: each function is one PTX instruction.
//
//   ldmatrix_x1/x2/x4[_trans](r, row)    sm_75+  ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16
//       Lanes 8i..8i+7 pass the shared-memory addresses of the 8 rows (8 halves, 16 bytes, 16-byte
//       aligned) of matrix i; r[i] of lane l gets row l/4, columns 2(l%4) and 2(l%4)+1 of matrix i
//       (.trans: column l/4, rows 2(l%4) and 2(l%4)+1), the lower column in the low 16 bits.
//   mma_16816(d, a, b)                   sm_80+  mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
//   mma_16816_bf16(d, a, b)              sm_80+  the same with bf16 inputs
//       d (16x8 fp32) += A (16x16, row-major fragment) * B (16x8, column-major fragment). Lane l,
//       g = l/4, t = l%4: a[0] A[g][2t..2t+1], a[1] A[g+8][2t..2t+1], a[2] A[g][2t+8..2t+9],
//       a[3] A[g+8][2t+8..2t+9]; b[0] B[2t..2t+1][g], b[1] B[2t+8..2t+9][g];
//       d[0..1] D[g][2t..2t+1], d[2..3] D[g+8][2t..2t+1].
//   cp_async_16(dst, src, full = true)   sm_80+  cp.async.cg.shared.global, 16 bytes
//   cp_async_4(dst, src, full = true)    sm_80+  cp.async.ca.shared.global, 4 bytes
//       Copies global src to shared dst (both aligned to the size) without holding the thread;
//       full = false writes zeros instead and reads nothing (src-size 0: a chunk off the input).
//   cp_async_commit()                    sm_80+  cp.async.commit_group: the copies issued since the last commit form a group
//   cp_async_wait<N>()                   sm_80+  cp.async.wait_group N: all but the N most recent groups have landed
//       The destination is undefined until a wait covers it; other threads see it after a
//       __syncthreads() that follows their wait.
//
// A kernel that calls an sm_80 function says so in its header comment (// Requires sm_80 or
// newer: ...); compiled for an older GPU, such a call is a compile error. On convlab's CPU
// emulator the same names come from clemu_tensor_core.h: an exact model of the fragments that
// checks every address and catches a destination read before its copy has landed.
#pragma once

#ifdef CONVLAB_EMULATOR
#include "clemu_tensor_core.h"
#else

__device__ __forceinline__ unsigned tc_smem(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x1(unsigned& r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(tc_smem(row)));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(tc_smem(row)));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem(row)));
}
__device__ __forceinline__ void ldmatrix_x1_trans(unsigned& r, const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r) : "r"(tc_smem(row)));
}
__device__ __forceinline__ void ldmatrix_x2_trans(unsigned (&r)[2], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(tc_smem(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tc_smem(row)));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
// Older GPUs have none of these instructions: templates whose body fails only where one is called.
#define TC_NEEDS_SM80(what) static_assert(N != N, what " needs sm_80 or newer: put '// Requires sm_80 or newer: " \
                                          "mma.sync m16n8k16 and cp.async' in the kernel file's header comment")
template <int N = 0> __device__ void mma_16816(float (&)[4], const unsigned (&)[4], const unsigned (&)[2]) {
    TC_NEEDS_SM80("mma_16816"); }
template <int N = 0> __device__ void mma_16816_bf16(float (&)[4], const unsigned (&)[4], const unsigned (&)[2]) {
    TC_NEEDS_SM80("mma_16816_bf16"); }
template <int N = 0> __device__ void cp_async_16(void*, const void*, bool = true) { TC_NEEDS_SM80("cp_async_16"); }
template <int N = 0> __device__ void cp_async_4(void*, const void*, bool = true) { TC_NEEDS_SM80("cp_async_4"); }
template <int N = 0> __device__ void cp_async_commit() { TC_NEEDS_SM80("cp_async_commit"); }
template <int N> __device__ void cp_async_wait() { TC_NEEDS_SM80("cp_async_wait"); }
#undef TC_NEEDS_SM80
#else

__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_16816_bf16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool full = true) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(tc_smem(smem_dst)), "l"(__cvta_generic_to_global(gmem_src)), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(void* smem_dst, const void* gmem_src, bool full = true) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 :: "r"(tc_smem(smem_dst)), "l"(__cvta_generic_to_global(gmem_src)), "r"(full ? 4 : 0));
}
// "memory": the compiler must not move shared-memory loads above the wait, nor stores below the commit
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    static_assert(N >= 0, "cp_async_wait<N>: N is how many of the most recent groups may stay in flight (0: none)");
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}
#endif
#endif
