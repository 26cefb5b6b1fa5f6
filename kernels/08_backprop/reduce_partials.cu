// Chapter 8: the second pass of the dE/dW reductions (conv2d_dw_direct.cu, conv2d_dw_gemm.cu).
//
// The first pass left nparts rows of partial sums, partial[j][i] for j < nparts and i < n (n
// weights). Here out[i] = sum over j of partial[j][i], in a fixed order, so the result has the
// same bits on every run (cuDNN's weight gradients may not: several of its algorithms use atomics).
//
// A block of 32 x PARTS_Y threads takes 32 consecutive weights: threadIdx.x picks the weight, so a
// warp reads 32 consecutive floats of one row (coalesced); threadIdx.y picks every PARTS_Y-th
// row, so PARTS_Y rows are read at once. The PARTS_Y sums of a weight then meet in shared memory
// and one thread adds them, in order. lenet_c1 with 1,024 rows of 196 weights: 7 blocks, 32 loads
// per thread; resnet's 36,864 weights: 1,152 blocks.
//
// Grid: ceil(n / 32) blocks of (32, PARTS_Y) threads.

#ifndef PARTS_Y
#define PARTS_Y 32
#endif

__global__ void reduce_partials(const float* __restrict__ partial, float* __restrict__ out, int nparts, int n)
{
    __shared__ float s[PARTS_Y][33];           // +1: the column reads below hit distinct banks
    const int i = blockIdx.x * 32 + threadIdx.x;
    float v = 0.0f;
    if (i < n)
        for (int j = threadIdx.y; j < nparts; j += PARTS_Y)
            v += partial[j * n + i];
    s[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && i < n) {
        float total = 0.0f;
        for (int k = 0; k < PARTS_Y; ++k) total += s[k][threadIdx.x];
        out[i] = total;
    }
}
