// Requires sm_90a
// One TMA load of the box at (c0, c1, c2) into shared memory, copied out word for word
// (tests/test_hopper_emulator.py checks the zero fill and the swizzle against a direct computation).
#include "11_hopper/hopper.cuh"

__global__ void tma_box(unsigned* out, const __grid_constant__ CUtensorMap map, int c0, int c1, int c2, int bytes) {
    extern __shared__ unsigned char smem_raw[];
    unsigned char* smem = (unsigned char*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t bar[1];
    if (threadIdx.x == 0) {
        mbar_init(&bar[0], 1);
        fence_mbar_init();
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mbar_arrive_expect_tx(&bar[0], bytes);
        tma_load_3d(smem, &map, &bar[0], c0, c1, c2);
    }
    mbar_wait(&bar[0], 0);
    for (int i = threadIdx.x; i < bytes / 4; i += blockDim.x) out[i] = ((const unsigned*)smem)[i];
}
