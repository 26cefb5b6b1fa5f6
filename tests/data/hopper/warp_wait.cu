// Requires sm_90a
// Lane 0 of the one warp waits for a TMA copy, then __syncwarp() (when `sync`) and every lane reads
// the box with ordinary loads (tests/test_hopper_emulator.py).
#include "11_hopper/hopper.cuh"

__global__ void warp_wait(float* out, const __grid_constant__ CUtensorMap map, int sync) {
    extern __shared__ unsigned char smem_raw[];
    float* box = (float*)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    __shared__ uint64_t bar[1];
    int l = threadIdx.x;
    if (l == 0) {
        mbar_init(&bar[0], 1); fence_mbar_init();
        mbar_arrive_expect_tx(&bar[0], 32 * 4);
        tma_load_2d(box, &map, &bar[0], 0, 0);
        mbar_wait(&bar[0], 0);
    }
    if (sync) __syncwarp();
    out[l] = box[l];                                                // [read]
}
