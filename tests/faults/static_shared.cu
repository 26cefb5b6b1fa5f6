// Static __shared__ arrays as the emulator gives them: poisoned for each block, checked per dimension.
__global__ void leftovers(float* y, int* yi)
{
    __shared__ float f[4][8];
    __shared__ volatile int v[32];
    const int t = threadIdx.x;
    y[blockIdx.x * 32 + t] = f[t / 8][t % 8];         // never written: NaN in every block
    yi[blockIdx.x * 32 + t] = v[t];                     // never written: -1 in every block
    f[t / 8][t % 8] = 1.0f;                             // the next block must not see these
    v[t] = 7;
}
__global__ void through_pointers(const float* x, float* y)
{
    __shared__ float s[2][32];
    float* row = s[1];                                  // a row decays to a pointer, as in C
    row[threadIdx.x] = 2.0f * x[threadIdx.x];
    __syncthreads();
    const float* all = &s[0][0];
    y[threadIdx.x] = all[32 + (31 - threadIdx.x)];
}
__global__ void halo_rows_missing(const float* x, float* y, int H, int W)
{
    __shared__ float tile[10][10];                      // an 8x8 output tile and its 3x3 halo
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int i = ty * 8 + tx; i < 8 * 10; i += 64)      // loads 8 of the 10 rows
        tile[i / 10][i % 10] = x[(i / 10) * W + i % 10];
    __syncthreads();
    float acc = 0.0f;
    for (int p = 0; p < 3; ++p)
        for (int q = 0; q < 3; ++q) acc += tile[ty + p][tx + q];
    y[ty * 8 + tx] = acc;
}
__global__ void row_past_the_end(float* y)
{
    __shared__ float t[8][9];
    t[threadIdx.y][threadIdx.x] = 1.0f;
    __syncthreads();
    y[threadIdx.y * 8 + threadIdx.x] = t[threadIdx.x][threadIdx.y + 2];
}
__global__ void shuffle_with_gone_lanes(float* y)
{
    float v = threadIdx.x;
    if (threadIdx.x >= 16) return;
    v += __shfl_down_sync(0xffffffff, v, 1);
    y[threadIdx.x] = v;
}
