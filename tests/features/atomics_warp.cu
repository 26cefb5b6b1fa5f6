// Atomics, warp shuffles, ballot and the reducing barriers.
__global__ void atomics(const int* v, int* sum, int* mx, int* mn, float* fsum, unsigned* cas_count, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, v[i]);
    atomicMax(mx, v[i]);
    atomicMin(mn, v[i]);
    atomicAdd(fsum, (float)v[i]);
    unsigned old = *cas_count, seen;
    do { seen = old; old = atomicCAS(cas_count, seen, seen + 1u); } while (old != seen);
}
__global__ void warp_ops(const float* x, float* sums, float* bcast, unsigned* ballots, float* xors) {
    int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    float v = x[i], s = v;
    for (int o = 16; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
    if (lane == 0) sums[i / 32] = s;
    bcast[i] = __shfl_sync(0xffffffffu, v, 7);
    xors[i] = __shfl_xor_sync(0xffffffffu, v, 1);
    unsigned b = __ballot_sync(0xffffffffu, v > 0.0f);
    if (lane == 0) ballots[i / 32] = b;
}
__global__ void barrier_reduce(const float* x, int* out) {
    float v = x[blockIdx.x * blockDim.x + threadIdx.x];
    int c = __syncthreads_count(v > 0.0f);
    int a = __syncthreads_and(v > -100.0f);
    int o = __syncthreads_or(v > 100.0f);
    if (threadIdx.x == 0) { out[3 * blockIdx.x] = c; out[3 * blockIdx.x + 1] = a; out[3 * blockIdx.x + 2] = o; }
}
__constant__ float c_scale[4];
__global__ void scale_by_constant(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * c_scale[i % 4];
}
__global__ void say_hello(int n) {
    if (threadIdx.x < n) printf("hello from thread %d of block %d\n", (int)threadIdx.x, (int)blockIdx.x);
}
__global__ void dynamic_shared_reverse(const float* x, float* y, int n) {
    extern __shared__ float buf[];
    int t = threadIdx.x;
    buf[t] = x[blockIdx.x * blockDim.x + t];
    __syncthreads();
    y[blockIdx.x * blockDim.x + t] = buf[blockDim.x - 1 - t];
}
