// Fault: a typo the compiler reports on line 5.
__global__ void compile_error(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = undeclared_value * 2.0f;
}
