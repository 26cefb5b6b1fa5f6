// Faults: ldmatrix and cp.async used wrongly (tests/test_tensor_core.py). One block of 64 threads
// unless a test says otherwise; thread t copies x[4t .. 4t+3] and reads thread 63-t's chunk.
#include "09_general/tensor_core.cuh"

__global__ void missing_wait(const float* x, float* y) {
    __shared__ __align__(16) float s[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t], x + 4 * t);
    cp_async_commit();
    __syncthreads();
    y[t] = s[4 * (63 - t)];
}

__global__ void missing_barrier(const float* x, float* y) {
    __shared__ __align__(16) float s[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t], x + 4 * t);
    cp_async_commit();
    cp_async_wait<0>();
    y[t] = s[4 * (63 - t)];
}

// two groups; wait<1> lets the second stay in flight
__global__ void wait_group_one(const float* x, float* y, int read_second) {
    __shared__ __align__(16) float s0[64 * 4];
    __shared__ __align__(16) float s1[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s0[4 * t], x + 4 * t);
    cp_async_commit();
    cp_async_16(&s1[4 * t], x + 4 * (64 + t));
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    y[t] = read_second ? s1[4 * (63 - t)] : s0[4 * (63 - t)];
}

// a copy never committed to a group: no wait covers it
__global__ void never_committed(const float* x, float* y) {
    __shared__ __align__(16) float s[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t], x + 4 * t);
    cp_async_wait<0>();
    __syncthreads();
    y[t] = s[4 * (63 - t)];
}

__global__ void overwrite_in_flight(const float* x, float* y) {
    __shared__ __align__(16) float s[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t], x + 4 * t);
    cp_async_commit();
    s[4 * t] = 0.0f;
    cp_async_wait<0>();
    __syncthreads();
    y[t] = s[4 * (63 - t)];
}

// offset: elements added to the shared (dst) or global (src) address
__global__ void misaligned(const float* x, float* y, int dst_offset, int src_offset) {
    __shared__ __align__(16) float s[64 * 4 + 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t + dst_offset], x + 4 * t + src_offset);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    y[t] = s[4 * (63 - t)];
}

__global__ void source_past_end(const float* x, float* y) {
    __shared__ __align__(16) float s[64 * 4];
    int t = threadIdx.x;
    cp_async_16(&s[4 * t], x + 4 * t + 4);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    y[t] = s[4 * (63 - t)];
}

__global__ void destination_global(const float* x, float* y) {
    int t = threadIdx.x;
    cp_async_16(y + 4 * t, x + 4 * t);
    cp_async_commit();
    cp_async_wait<0>();
}

// ldmatrix: mistake 0 a global address, 1 a misaligned row, 2 a row past the array's end,
// 3 rows still in flight (cp.async without a wait), 4 rows another warp writes without a barrier
__global__ void ldmatrix_mistake(const unsigned short* x, unsigned* out, int mistake) {
    __shared__ __align__(16) unsigned short s[32][8];
    int l = threadIdx.x % 32, w = threadIdx.x / 32;
    if (mistake == 3) {
        if (w == 0) cp_async_16(&s[l][0], x + 8 * l);
    } else if (mistake != 4 || w == 1) {
        for (int c = 0; c < 8; c++) s[l][c] = x[8 * l + c];
    }
    if (mistake != 4) __syncthreads();
    const unsigned short* row = &s[l][0];
    if (mistake == 0) row = x + 8 * l;
    if (mistake == 1) row = &s[l][4];
    if (mistake == 2) row = &s[0][0] + 8 * (l + 16);
    unsigned r[4];
    ldmatrix_x4(r, row);
    out[threadIdx.x] = r[0];
}

// block of 48 threads: the second warp has 16 lanes
__global__ void mma_partial_warp(float* y) {
    unsigned a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma_16816(d, a, b);
    y[threadIdx.x] = d[0];
}
