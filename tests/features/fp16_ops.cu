// half and half2 arithmetic, element by element, to compare with numpy.float16 bit for bit.
#include <cuda_fp16.h>
__global__ void to_half(const float* x, half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}
__global__ void to_float(const half* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]);
}
// op: 0 add, 1 sub, 2 mul, 3 div, 4 fma(a, b, a)
__global__ void half_ops(const half* a, const half* b, half* y, int n, int op) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    half u = a[i], v = b[i];
    y[i] = op == 0 ? __hadd(u, v) : op == 1 ? __hsub(u, v) : op == 2 ? __hmul(u, v)
         : op == 3 ? __hdiv(u, v) : __hfma(u, v, u);
}
__global__ void half2_ops(const half2* a, const half2* b, half2* y, int n2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n2) y[i] = __hfma2(a[i], b[i], __hmul2(a[i], a[i]));
}
