// Exercise 8.1's two ways to sum products into one element, with one mistake by MISTAKE:
// 1 `+=` where atomicAdd belongs (threads of many blocks add into one element),
// 2 the tree starts at s = THREADS (reads partial[128..255] of a 128-element array),
// 3 the tree adds partial[tid + 1] (one past the end for the last thread).
#define THREADS 128
__global__ void sum_atomic(const float* x, float* out, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
#if MISTAKE == 1
    out[i % 4] += x[i];
#else
    atomicAdd(&out[i % 4], x[i]);
#endif
}
__global__ void sum_tree(const float* x, float* out, int n)
{
    __shared__ float partial[THREADS];
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += THREADS) sum += x[blockIdx.x * n + t];
    partial[threadIdx.x] = sum;
    __syncthreads();
#if MISTAKE == 2
    for (int s = THREADS; s > 0; s /= 2) {
#else
    for (int s = THREADS / 2; s > 0; s /= 2) {
#endif
        if (threadIdx.x < s)
#if MISTAKE == 3
            partial[threadIdx.x] += partial[threadIdx.x + 1];
#else
            partial[threadIdx.x] += partial[threadIdx.x + s];
#endif
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}
