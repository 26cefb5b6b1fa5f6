// Fault: a grid-stride loop that never advances.
__global__ void never_returns(float* y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += 0)
        y[i] = 1.0f;
}
