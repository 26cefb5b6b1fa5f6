// tf32.cuh — fp32 on the tensor cores: the TF32 operand format, the 3xTF32 split and mma.sync
// with .tf32 operands. Each function is one PTX instruction, or a few around one.
//
// TF32 is fp32's sign and 8 exponent bits with 10 of its 23 mantissa bits: the tensor cores read
// the top 19 bits of each 32-bit operand register and ignore the low 13.
//
//   cvt_rna_tf32(x)        sm_80+  cvt.rna.tf32.f32: x rounded to 10 mantissa bits, to nearest with
//                                  ties away from zero (the bits as a 32-bit word)
//   tf32_round(x)          x rounded to TF32, as a float (the low 13 bits zero)
//   tf32_split(x, hi, lo)  hi = tf32_round(x), lo = tf32_round(x - hi): x - hi is exact in fp32,
//                          so |x - hi - lo| <= 2^-22 |x|, and
//                          a*b ~ a_hi*b_hi + a_hi*b_lo + a_lo*b_hi (the 3xTF32 product; a_lo*b_lo,
//                          below 2^-22 |a*b|, is dropped)
//   mma_1688_tf32(d, a, b) sm_80+  mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32
//       d (16x8, fp32) += A (16x8, row) * B (8x8, col). Lane l, g = l/4, t = l%4: a[0] A[g][t],
//       a[1] A[g+8][t], a[2] A[g][t+4], a[3] A[g+8][t+4]; b[0] B[t][g], b[1] B[t+4][g];
//       d[0..1] D[g][2t..2t+1], d[2..3] D[g+8][2t..2t+1]. a and b are fp32 bit patterns.
//       ldmatrix (../09_general/tensor_core.cuh) loads these fragments from shared memory: a row of
//       8 halves is a row of 4 floats, and lane l gets float l%4 of row l/4 of each 8x4 matrix.
//
// On convlab's CPU emulator the same names come from clemu_tensor_core.h: cvt.rna bit for bit,
// and the tensor cores' sums as measured (clemu_mma_numerics.h).
#pragma once
#include "../09_general/tensor_core.cuh"

#ifndef CONVLAB_EMULATOR
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define TF32_NEEDS_SM80(what) static_assert(N != N, what " needs sm_80 or newer: put '// Requires sm_80 or newer: " \
                                            "mma.sync m16n8k8 with .tf32 operands' in the kernel file's header comment")
template <int N = 0> __device__ unsigned cvt_rna_tf32(float) { TF32_NEEDS_SM80("cvt_rna_tf32"); return 0; }
template <int N = 0> __device__ void mma_1688_tf32(float (&)[4], const unsigned (&)[4], const unsigned (&)[2]) {
    TF32_NEEDS_SM80("mma_1688_tf32"); }
#undef TF32_NEEDS_SM80
#else
__device__ __forceinline__ unsigned cvt_rna_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
#endif

// The mask makes the result a float with the low 13 bits zero, whatever the instruction leaves in
// them: x - hi below must subtract the TF32 value itself.
__device__ __forceinline__ float tf32_round(float x) { return __uint_as_float(cvt_rna_tf32(x) & 0xffffe000u); }

__device__ __forceinline__ void tf32_split(float x, float& hi, float& lo) {
    hi = tf32_round(x);
    lo = tf32_round(x - hi);
}
