// Fault: an assert() that fails in one thread.
#include <cassert>
__global__ void assert_fails(const float* x, int n) {
    int i = threadIdx.x;
    if (i < n) assert(x[i] >= 0.0f);
}
