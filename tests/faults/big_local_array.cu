// Fault: a per-thread array far larger than any GPU thread could hold in registers or local memory.
__global__ void big_local_array(float* y, int n) {
    float scratch[200000];
    for (int i = 0; i < n; i++) scratch[i] = (float)i;
    y[threadIdx.x] = scratch[n - 1];
}
