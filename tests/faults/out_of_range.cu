// Faults: an off-by-one bound (reads x[n]) and a halo read above the image (x[-W..-1]).
__global__ void past_end(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i < n ? i : 0] = 2.0f * x[i];
}
__global__ void before_start(const float* x, float* y, int H, int W) {
    int r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < H && c < W) y[r * W + c] = x[(r - 1) * W + c] + x[r * W + c];   // no check for r - 1 < 0
}
// Fault: the launch's shared= is one element too small for the tile the kernel loads.
__global__ void shared_too_small(const float* x, float* y, int n) {
    extern __shared__ float tile[];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    y[threadIdx.x] = tile[blockDim.x - 1 - threadIdx.x];
}
