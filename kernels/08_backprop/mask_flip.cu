// Chapter 8: the flipped, transposed mask, wt[c][m][K-1-ky][K-1-kx] = w[m][c][ky][kx].
//
// With stride 1, dE/dX is a forward convolution of dE/dY (M channels in, C maps out, padding
// K-1-pad) with this mask: the chapter 5 kernels can compute it as they are (see
// convlab/ops/backprop.py, conv2d_input_grad_forward). The mask is tiny (M*C*K*K floats), so one
// thread per element is all it needs.
//
// Grid: ceil(M*C*K*K / 256) blocks of 256 threads.

__global__ void mask_flip_transpose(const float* __restrict__ w, float* __restrict__ wt, int M, int C, int K)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;     // index into wt (C, M, K, K)
    if (i >= M * C * K * K) return;
    const int kx = i % K, ky = (i / K) % K, m = (i / (K * K)) % M, c = i / (K * K * M);
    wt[i] = w[((m * C + c) * K + (K - 1 - ky)) * K + (K - 1 - kx)];
}
