// Fault: a write far outside every buffer, through a plain pointer the emulator cannot check.
__global__ void wild_pointer(float* y, long long offset) {
    float* p = y;                       // a plain float*: no bounds check on this one
    p[offset] = 1.0f;
}
__global__ void divide_by_zero(int* y, int d) {
    y[threadIdx.x] = 100 / (d - (int)threadIdx.x);
}
