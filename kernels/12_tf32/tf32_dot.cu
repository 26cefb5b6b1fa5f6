// Requires sm_80 or newer: mma.sync m16n8k8 with .tf32 operands
//
// Chapter 12's measuring kernel: one warp computes D (16 x 8) = A (16 x K) . B (8 x K)^T, the long
// reduction of a convolution's output, in one of the ways the chapter compares:
//   products 0   fp32 on the CUDA cores: each lane's 4 outputs by fmaf, one term at a time;
//   products 1   TF32: each operand rounded (cvt.rna), one mma.sync m16n8k8 a step of 8;
//   products 3   3xTF32: each operand split, three mma.sync a step, the small products first.
// promote 0 chains every step through the tensor core's accumulator (d += A.B with d as the MMA's
// C); promote 1 sums each step's products into a fresh zero and adds that to d in fp32, as the
// chapter's convolution kernels do. Lane l (g = l/4, t = l%4) holds A[g][t], A[g+8][t],
// A[g][t+4], A[g+8][t+4] and B[g][t], B[g][t+4] of each step, and D[g][2t..2t+1], D[g+8][2t..2t+1].
// Launch: one block of 32 threads.
#include "tf32.cuh"

__global__ void tf32_dot(const float* A, const float* B, float* D, int K, int products, int promote) {
    const int l = threadIdx.x, g = l / 4, t = l % 4;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    if (products == 0) {
        for (int k = 0; k < K; k++)
            for (int i = 0; i < 4; i++) d[i] = fmaf(A[(g + 8 * (i / 2)) * K + k], B[(2 * t + i % 2) * K + k], d[i]);
    } else {
        for (int k = t; k < K; k += 8) {
            const float a[4] = {A[g * K + k], A[(g + 8) * K + k], A[g * K + k + 4], A[(g + 8) * K + k + 4]};
            const float b[2] = {B[g * K + k], B[g * K + k + 4]};
            unsigned ah[4], al[4], bh[2], bl[2];
            for (int i = 0; i < 4; i++) {
                float hi, lo;
                tf32_split(a[i], hi, lo);
                ah[i] = __float_as_uint(hi);
                al[i] = __float_as_uint(lo);
            }
            for (int i = 0; i < 2; i++) {
                float hi, lo;
                tf32_split(b[i], hi, lo);
                bh[i] = __float_as_uint(hi);
                bl[i] = __float_as_uint(lo);
            }
            float part[4] = {0.f, 0.f, 0.f, 0.f};
            float (&into)[4] = promote ? part : d;
            if (products == 3) {
                mma_1688_tf32(into, al, bh);
                mma_1688_tf32(into, ah, bl);
            }
            mma_1688_tf32(into, ah, bh);
            if (promote)
                for (int i = 0; i < 4; i++) d[i] += part[i];
        }
    }
    D[g * 8 + 2 * t] = d[0];
    D[g * 8 + 2 * t + 1] = d[1];
    D[(g + 8) * 8 + 2 * t] = d[2];
    D[(g + 8) * 8 + 2 * t + 1] = d[3];
}
