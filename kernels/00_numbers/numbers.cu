// Predict, then measure: the small kernels behind the numbers a kernel designer reasons from
// (book/gpu_numbers.ipynb; benchmarks/gpu_numbers.py times them). Each one does a little work
// many times over, so that one resource sets its time: DRAM or L2 bandwidth, L1 or shared-memory
// bandwidth, the latency of one load, the FMA pipes, a launch. Each leaves a result the host can
// predict, so the emulator checks every one of them without a GPU.
#include <cuda_fp16.h>

// ---- (a) bandwidth ---------------------------------------------------------------------------

// A grid-stride copy of n4 float4, `reps` times over. __ldcg loads through L2 only, never L1:
// over an array much larger than L2 this measures DRAM; over one that fits in L2, repeated, it
// measures L2 (L1 cannot serve the repeats). Each thread issues its UNROLL loads before any
// store: the bytes in flight, not one load's latency, then set the rate (Little's law).
#define UNROLL 4
__global__ void copy_float4(const float4* src, float4* dst, long long n4, int reps)
{
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (int r = 0; r < reps; r++)
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += UNROLL * stride) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (i + u * stride < n4)
                    v[u] = __ldcg(src + i + u * stride);
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (i + u * stride < n4)
                    dst[i + u * stride] = v[u];
        }
}

// Each thread reads `iters` int4 of a small window (mask + 1 int4, a power of two, the same for
// every block) through L1 (__ldg): after the first pass every load hits L1. Consecutive threads
// read consecutive int4, so a warp's load is 512 contiguous bytes. The sums (unsigned, wrapping)
// keep the loads alive and give the host a value to check.
__global__ void l1_read(const int4* src, int mask, unsigned int* out, int iters)
{
    unsigned int a = 0, b = 0, c = 0, d = 0;
    for (int k = 0; k < iters; k++) {
        const int4 v = __ldg(src + ((threadIdx.x + k) & mask));
        a += (unsigned int)v.x; b += (unsigned int)v.y; c += (unsigned int)v.z; d += (unsigned int)v.w;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

// The same reads from shared memory: the block fills SMEM_VEC int4 with (i, 2i, 3i, 4i), then
// each thread reads `iters` of them, consecutive threads consecutive int4 (no bank conflicts).
#define SMEM_VEC 1024   // int4: 16 KB
__global__ void shared_read(unsigned int* out, int iters)
{
    __shared__ int4 s[SMEM_VEC];
    for (int i = threadIdx.x; i < SMEM_VEC; i += blockDim.x)
        s[i] = make_int4(i, 2 * i, 3 * i, 4 * i);
    __syncthreads();
    unsigned int a = 0, b = 0, c = 0, d = 0;
    for (int k = 0; k < iters; k++) {
        const int4 v = s[(threadIdx.x + k) & (SMEM_VEC - 1)];
        a += (unsigned int)v.x; b += (unsigned int)v.y; c += (unsigned int)v.z; d += (unsigned int)v.w;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = a + b + c + d;
}

// ---- (b) latency: one thread chasing pointers --------------------------------------------------
// next[] holds a random cycle: each load's address is the value the load before it returned, so
// no two loads overlap and each step costs one full latency. Launch with one thread.
// end[0] is where the chase stops; cycles[0] the SM clock cycles the loop took (clock64).

// Through L1 (__ldg): a cycle that fits in L1 measures an L1 hit.
__global__ void chase_l1(const int* next, int start, int steps, int* end, long long* cycles)
{
    int j = start;
    const long long t0 = clock64();
    for (int s = 0; s < steps; s++)
        j = __ldg(next + j);
    cycles[0] = clock64() - t0;
    end[0] = j;
}

// Through L2 only (__ldcg): a cycle that fits in L2 measures an L2 hit; one much larger, a DRAM access.  // listing: l2_chase
__global__ void chase_l2(const int* next, int start, int steps, int* end, long long* cycles)
{
    int j = start;
    const long long t0 = clock64();
    for (int s = 0; s < steps; s++)
        j = __ldcg(next + j);
    cycles[0] = clock64() - t0;
    end[0] = j;
}  // end listing: l2_chase

// In shared memory: the block copies next[0..n) in (n <= CHASE_SHARED), then thread 0 chases.
#define CHASE_SHARED 8192   // ints: 32 KB
__global__ void chase_shared(const int* next, int n, int start, int steps, int* end, long long* cycles)
{
    __shared__ int s[CHASE_SHARED];
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        s[i] = next[i];
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    int j = start;
    const long long t0 = clock64();
    for (int k = 0; k < steps; k++)
        j = s[j];
    cycles[0] = clock64() - t0;
    end[0] = j;
}

// ---- (c) arithmetic throughput ------------------------------------------------------------------
// CHAINS independent chains x = x*a + b per thread: an FMA's result is needed only CHAINS
// instructions later, so with enough warps the pipes, not the latency, set the time. a and b
// are parameters, so the compiler cannot fold the chains away; out[] is each thread's sum.
#define CHAINS 8

__global__ void fma_chains(float* out, float a, float b, int iters)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    float x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; c++)
        x[c] = (float)((t + c) & 15);
#pragma unroll 4
    for (int k = 0; k < iters; k++) {
#pragma unroll
        for (int c = 0; c < CHAINS; c++)
            x[c] = fmaf(x[c], a, b);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; c++)
        sum += x[c];
    out[t] = sum;
}

// The same in half2: one HFMA2 does two fp16 FMAs.
__global__ void hfma2_chains(float* out, float a, float b, int iters)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const half2 a2 = __float2half2_rn(a), b2 = __float2half2_rn(b);
    half2 x[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; c++)
        x[c] = __floats2half2_rn((float)((t + c) & 15), (float)((t + c + 1) & 15));
#pragma unroll 4
    for (int k = 0; k < iters; k++) {
#pragma unroll
        for (int c = 0; c < CHAINS; c++)
            x[c] = __hfma2(x[c], a2, b2);
    }
    float sum = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; c++)
        sum += __low2float(x[c]) + __high2float(x[c]);
    out[t] = sum;
}

// ---- (d) a launch ------------------------------------------------------------------------------
// Nothing to do: its time is what launching any kernel costs.
__global__ void empty_kernel() {}
