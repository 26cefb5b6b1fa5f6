// Requires sm_90a
// Each warpgroup writes its 128 elements, syncs with its own named barrier (id 1 + warpgroup) when
// `sync`, then reads its neighbour's (tests/test_hopper_emulator.py).
#include "11_hopper/hopper.cuh"

__global__ void neighbours(float* out, int sync, int count) {
    __shared__ float s[256];
    int t = threadIdx.x, g = t / 128;
    s[t] = 2.f * t;                                                  // [write]
    if (sync) named_barrier_sync(1 + g, count);                      // [nbar]
    out[t] = s[128 * g + (t + 1) % 128];                             // [read]
}
