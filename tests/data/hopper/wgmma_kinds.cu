// Requires sm_90a
// The tensor cores' sums in fp16 or bf16 (DTYPE, kernels/11_hopper/hopper_elem.cuh), for
// tests/test_hopper_emulator.py and benchmarks/mma_numerics_probe.py:
//   wgmma_kinds: D = C + A[:, :16 KS] . B[:, :16 KS]^T as KS chained wgmma m64n64k16, A and B
//     (64 x 64) by TMA in the 128-byte swizzle; TRANSPOSED = 0: the maps hold A and B (K-major tiles),
//     TRANSPOSED = 1: they hold A^T and B^T (64 K rows x 64), read M- and N-major (WG_TRANS_A | WG_TRANS_B).
//     Both forms compute the same product.
//   mma_kinds: the same for rows 0..15 of A and 0..7 of B with mma.sync m16n8k16 (one warp).
// C and D are 64 x 64 floats.
#include "11_hopper/hopper.cuh"
#include "11_hopper/hopper_elem.cuh"
#include "09_general/tensor_core.cuh"

#ifndef TRANSPOSED
#define TRANSPOSED 0
#endif

__global__ void __launch_bounds__(128, 1)
wgmma_kinds(float* D, const float* C, const __grid_constant__ CUtensorMap a_map,
            const __grid_constant__ CUtensorMap b_map, int KS) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t bar[1];
    constexpr int KIND = WG_TYPE | (TRANSPOSED ? WG_TRANS_A | WG_TRANS_B : 0);
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
    // K-major: desc + 2 is 16 columns on; M/N-major: desc + 128 is 16 K rows (2048 bytes) on
    uint64_t da = TRANSPOSED ? smem_desc_128b_mn(smem, 8192) : smem_desc_128b(smem);
    uint64_t db = TRANSPOSED ? smem_desc_128b_mn(smem + 8192, 8192) : smem_desc_128b(smem + 8192);
    wgmma_fence();
    int step = TRANSPOSED ? 128 : 2;
    for (int k = 0; k < KS; k++) wgmma_k16<64, KIND>(acc, da + step * k, db + step * k);
    wgmma_commit();
    wgmma_wait<0>();
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            D[(16 * warp + lane / 4 + 8 * (q / 2)) * 64 + 8 * j + 2 * (lane % 4) + q % 2] = acc[4 * j + q];
}

// one warp: lane l (g = l/4, c = l%4) holds A's rows g, g+8 and B's row g, columns 2c, 2c+1, 2c+8, 2c+9
__global__ void mma_kinds(float* D, const float* C, const elem* A, const elem* B, int KS) {
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
        if (DTYPE == 1) mma_16816_bf16(d, a, b);
        else mma_16816(d, a, b);
    }
    D[g * 64 + 2 * c] = d[0];
    D[g * 64 + 2 * c + 1] = d[1];
    D[(g + 8) * 64 + 2 * c] = d[2];
    D[(g + 8) * 64 + 2 * c + 1] = d[3];
}
