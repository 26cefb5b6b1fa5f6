// One warp multiplies a 16x16 half tile by another with tensor-core fragments.
#include <mma.h>
#include <cuda_fp16.h>
using namespace nvcuda;
__global__ void wmma_16x16x16(const half* a, const half* b, const float* c, float* d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(acc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; i++) acc.x[i] *= 2.0f;
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
