// Access patterns whose memory counters are known by hand: the emulator's profiler must give them
// exactly, and ncu on a GPU gives the same (nvcc neither vectorises nor merges these accesses).
// Each kernel has one plain access per line, so every access is one instruction: 4-byte floats,
// 2-byte halves, 4-byte half2s and 16-byte float4s, through kernel parameters, shared arrays and
// local pointers. One difference is nvcc's, not the counting's: a one-line `if` around
// a shared store (broadcast, histogram) becomes a predicated `@!P0 STS` that every warp of the block
// issues, and ncu's instruction count (smsp__inst_executed_op_shared_st) includes the warps whose
// lanes are all off; their wavefronts are the same (tests/test_profile.py reads the SASS for it).
#include <cuda_fp16.h>

// Thread i copies element i: a warp's 32 floats are 128 contiguous bytes, 4 sectors.
__global__ void copy_coalesced(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = v;
    }
}

// Thread i reads element i * stride: stride 2 touches 8 sectors a request, 8 or more 32.
__global__ void copy_strided(const float* x, float* y, int n, int stride) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[(long long)i * stride];
        y[i] = v;
    }
}

// A 32x32 tile transposed through shared memory, block (32, 8): rows are written (no conflict),
// columns read. Without padding a column is one bank (32 wavefronts a request); with PAD=1 the
// column spreads over the 32 banks (1 wavefront).
#ifndef PAD
#define PAD 0
#endif
__global__ void tile_transpose(const float* x, float* y) {
    __shared__ float tile[32][32 + PAD];
    int tx = threadIdx.x, ty = threadIdx.y, base = blockIdx.x * 32 * 32;
    for (int r = ty; r < 32; r += 8) {
        float v = x[base + r * 32 + tx];
        tile[r][tx] = v;
    }
    __syncthreads();
    for (int r = ty; r < 32; r += 8) {
        float v = tile[tx][r];
        y[base + r * 32 + tx] = v;
    }
}

// Every lane reads the same element, from global and from shared memory: one sector, one wavefront.
__global__ void broadcast(const float* x, float* y) {
    __shared__ float s[32];
    int t = threadIdx.x;
    if (t < 32) {
        float v = x[t];
        s[t] = v;
    }
    __syncthreads();
    float a = x[blockIdx.x];
    float b = s[5];
    y[blockIdx.x * blockDim.x + t] = a + b;
}

// A histogram of 8 bins: one shared atomic per thread, one global atomic per bin and block.
__global__ void histogram(const int* v, int* bins, int n) {
    __shared__ int s[8];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    if (t < 8)
        s[t] = 0;
    __syncthreads();
    if (i < n)
        atomicAdd(&s[v[i] & 7], 1);
    __syncthreads();
    if (t < 8)
        atomicAdd(&bins[t], s[t]);
}

// Through local pointers: the same requests as copy_coalesced, from element off on.
__global__ void copy_local_pointer(const float* x, float* y, int n, int off) {
    const float* src = x + off;
    float* dst = y + off;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = src[i];
        dst[i] = v;
    }
}

// Halves: a warp's 32 loads are 64 bytes, 2 sectors; half2s 128 bytes, 4 sectors.
__global__ void copy_half(const half* x, half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        half v = x[i];
        y[i] = v;
    }
}

__global__ void copy_half2(const __half2* x, __half2* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        __half2 v = x[i];
        y[i] = v;
    }
}

// 16-byte loads and stores: 512 bytes a warp, 16 sectors; loaded through a cast of a float pointer.
__global__ void copy_float4(const float* x, float4* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float4 v = *(const float4*)&x[4 * i];
        y[i] = v;
    }
}

// 16-byte shared accesses go in 4 quarter-warp phases of 128 bytes: 64 float4s stored in 2
// requests of 4 wavefronts; lane t loads s[t * stride % 64]: stride 1 is 4 wavefronts, stride 2
// puts 2 float4s on each bank group in every phase (8 wavefronts: 4 conflicts), stride 0 is a
// broadcast, where lane pairs share their data and the 4 phases become 2.
__global__ void shared_float4(const float4* x, float4* y, int stride) {
    __shared__ float4 s[64];
    int t = threadIdx.x;
    float4 a = x[t];
    s[t] = a;
    float4 b = x[t + 32];
    s[t + 32] = b;
    __syncthreads();
    float4 v = s[t * stride % 64];
    y[t] = v;
}

// A branch taken in different iterations by different lanes, as at a tile's edge: lane t < 4
// reads global memory in its first 4 - t iterations and shared row k after. A warp issues
// iteration k's loads for the lanes in it (nvcc predicates both: @!P LDG, @P LDS): 4 shared
// requests of one row each (33 floats a row: no conflict) and 4 global ones (lanes 0-3, 0-2, 0-1,
// 0: one sector each). One warp.
__global__ void branch_in_loop(const float* x, float* y) {
    __shared__ float s[4 * 33];
    int t = threadIdx.x;
    for (int k = 0; k < 4; ++k) {
        float v = x[k * 32 + t];
        s[k * 33 + t] = v;
    }
    __syncthreads();
    float acc = 0.0f;
    for (int k = 0; k < 4; ++k) {
        if (t + k >= 4)
            acc += s[k * 33 + t];
        else
            acc += x[128 + k * 32 + t];
    }
    y[t] = acc;
}
