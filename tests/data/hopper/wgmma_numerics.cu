// Requires sm_90a
// D = C + A[:, :16 KS] . B[:, :16 KS]^T as KS chained wgmma m64n64k16 (tests/test_hopper_emulator.py):
// A and B (64 x 64 halves, K-major) come in by TMA in the 128-byte swizzle, C and D are 64 x 64 floats.
// And the same for rows 0..15 of A, 0..7 of B with mma.sync m16n8k16 (mma_chain).
#include <cuda_fp16.h>
#include "11_hopper/hopper.cuh"
#include "09_general/tensor_core.cuh"

__global__ void __launch_bounds__(128, 1)
wgmma_chain(float* D, const float* C, const __grid_constant__ CUtensorMap a_map,
            const __grid_constant__ CUtensorMap b_map, int KS) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t bar[1];
    int t = threadIdx.x, warp = t / 32, lane = t % 32;
    if (t == 0) {
        mbar_init(&bar[0], 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (t == 0) {
        mbar_arrive_expect_tx(&bar[0], 2 * 64 * 64 * 2);
        tma_load_2d(smem, &a_map, &bar[0], 0, 0);
        tma_load_2d(smem + 8192, &b_map, &bar[0], 0, 0);
    }
    mbar_wait(&bar[0], 0);
    float acc[32];
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            acc[4 * j + q] = C[(16 * warp + lane / 4 + 8 * (q / 2)) * 64 + 8 * j + 2 * (lane % 4) + q % 2];
    uint64_t da = smem_desc_128b(smem), db = smem_desc_128b(smem + 8192);
    wgmma_fence();
    for (int k = 0; k < KS; k++) wgmma_m64n64k16(acc, da + 2 * k, db + 2 * k);
    wgmma_commit();
    wgmma_wait<0>();
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            D[(16 * warp + lane / 4 + 8 * (q / 2)) * 64 + 8 * j + 2 * (lane % 4) + q % 2] = acc[4 * j + q];
}

// one warp: lane l (g = l/4, c = l%4) holds A's rows g, g+8 and B's row g, columns 2c, 2c+1, 2c+8, 2c+9
__global__ void mma_chain(float* D, const float* C, const half* A, const half* B, int KS) {
    int l = threadIdx.x, g = l / 4, c = l % 4;
    float d[4] = {C[g * 64 + 2 * c], C[g * 64 + 2 * c + 1], C[(g + 8) * 64 + 2 * c], C[(g + 8) * 64 + 2 * c + 1]};
    for (int k = 0; k < KS; k++) {
        int k0 = 16 * k + 2 * c;
        unsigned a[4], b[2];
        a[0] = *(const unsigned*)&A[g * 64 + k0];
        a[1] = *(const unsigned*)&A[(g + 8) * 64 + k0];
        a[2] = *(const unsigned*)&A[g * 64 + k0 + 8];
        a[3] = *(const unsigned*)&A[(g + 8) * 64 + k0 + 8];
        b[0] = *(const unsigned*)&B[g * 64 + k0];
        b[1] = *(const unsigned*)&B[g * 64 + k0 + 8];
        mma_16816(d, a, b);
    }
    D[g * 64 + 2 * c] = d[0];
    D[g * 64 + 2 * c + 1] = d[1];
    D[(g + 8) * 64 + 2 * c] = d[2];
    D[(g + 8) * 64 + 2 * c + 1] = d[3];
}
