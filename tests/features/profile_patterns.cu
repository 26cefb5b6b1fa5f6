// Access patterns whose memory counters are known by hand: the emulator's profiler must give them
// exactly, and ncu on a GPU gives the same (nvcc neither vectorises nor merges these accesses).
// Each kernel has one plain 4-byte access per line, so every access is one instruction, and every
// access indexes a kernel parameter (the emulator counts those; not accesses through a pointer
// copied into a local variable). One difference is nvcc's, not the counting's: a one-line `if` around
// a shared store (broadcast, histogram) becomes a predicated `@!P0 STS` that every warp of the block
// issues, and ncu's instruction count (smsp__inst_executed_op_shared_st) includes the warps whose
// lanes are all off; their wavefronts are the same (tests/test_profile.py reads the SASS for it).

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
