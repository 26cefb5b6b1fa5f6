// Fault: a shared-memory tree reduction missing the barrier inside its loop, so a thread can
// read its partner's partial sum before the partner wrote it.
__global__ void racy_reduction(const float* x, float* out) {
    __shared__ float s[128];
    s[threadIdx.x] = x[blockIdx.x * 128 + threadIdx.x];
    __syncthreads();
    for (int stride = 64; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        // missing: __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
__global__ void good_reduction(const float* x, float* out) {
    __shared__ float s[128];
    s[threadIdx.x] = x[blockIdx.x * 128 + threadIdx.x];
    __syncthreads();
    for (int stride = 64; stride > 0; stride /= 2) {
        if (threadIdx.x < stride) s[threadIdx.x] += s[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}
