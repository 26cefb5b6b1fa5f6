// Fault: the two halves of the block wait at two different barriers.
__global__ void divergent_barrier(float* y) {
    if (threadIdx.x < 32) {
        y[threadIdx.x] = 1.0f;
        __syncthreads();
    } else {
        y[threadIdx.x] = 2.0f;
        __syncthreads();
    }
}
