// Fault: threads past the end return before the barrier the others wait at.
__global__ void partial_barrier(const float* x, float* y, int n) {
    __shared__ float s[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;                 // the bug: these threads never reach __syncthreads()
    s[threadIdx.x] = x[i];
    __syncthreads();
    y[i] = s[threadIdx.x] + s[(threadIdx.x + 1) % blockDim.x];
}
