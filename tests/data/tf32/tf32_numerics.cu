// Requires sm_90a: wgmma with .tf32 operands
//
// The TF32 probe (scripts/probe_tf32.py runs it on an H100/H200; tests/test_tf32_numerics.py on the
// emulator, against the GPU's outputs in tests/data/tf32_mma_numerics.npz):
//   wgmma_tf32_chain: D = C + A[:, :8 KS] . B[:, :8 KS]^T as KS chained wgmma m64n64k8 .tf32, A and B
//     (64 x 32 floats, K-major, their raw bits: the low 13 bits are whatever the trial put there)
//     in by TMA in the 128-byte swizzle, C and D 64 x 64 floats;
//   mma_tf32_chain: the same for rows 0..15 of A and 0..7 of B (rows of ld floats) with KS chained
//     mma.sync m16n8k8 .tf32 (KS up to ld/8: a long chain's drift too);
//   cvt_rna: out[i] = the 32 bits cvt.rna.tf32.f32 leaves for in[i] (no mask).
#include "12_tf32/tf32.cuh"
#include "12_tf32/wgmma_tf32.cuh"

__global__ void __launch_bounds__(128, 1)
wgmma_tf32_chain(float* D, const float* C, const __grid_constant__ CUtensorMap a_map,
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
        mbar_arrive_expect_tx(&bar[0], 2 * 64 * 32 * 4);
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
    for (int k = 0; k < KS; k++) wgmma_m64n64k8_tf32(acc, da + 2 * k, db + 2 * k);
    wgmma_commit();
    wgmma_wait<0>();
    for (int j = 0; j < 8; j++)
        for (int q = 0; q < 4; q++)
            D[(16 * warp + lane / 4 + 8 * (q / 2)) * 64 + 8 * j + 2 * (lane % 4) + q % 2] = acc[4 * j + q];
}

// one warp: lane l (g = l/4, t = l%4) holds A's rows g, g+8 and B's row g, columns t and t+4 of each step
__global__ void mma_tf32_chain(float* D, const float* C, const float* A, const float* B, int KS, int ld) {
    int l = threadIdx.x, g = l / 4, t = l % 4;
    float d[4] = {C[g * 64 + 2 * t], C[g * 64 + 2 * t + 1], C[(g + 8) * 64 + 2 * t], C[(g + 8) * 64 + 2 * t + 1]};
    for (int k = 0; k < KS; k++) {
        int k0 = 8 * k + t;
        unsigned a[4] = {__float_as_uint(A[g * ld + k0]), __float_as_uint(A[(g + 8) * ld + k0]),
                         __float_as_uint(A[g * ld + k0 + 4]), __float_as_uint(A[(g + 8) * ld + k0 + 4])};
        unsigned b[2] = {__float_as_uint(B[g * ld + k0]), __float_as_uint(B[g * ld + k0 + 4])};
        mma_1688_tf32(d, a, b);
    }
    D[g * 64 + 2 * t] = d[0];
    D[g * 64 + 2 * t + 1] = d[1];
    D[(g + 8) * 64 + 2 * t] = d[2];
    D[(g + 8) * 64 + 2 * t + 1] = d[3];
}

__global__ void cvt_rna(unsigned* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cvt_rna_tf32(in[i]);
}
