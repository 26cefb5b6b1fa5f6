// Requires sm_80 or newer: mma.sync m16n8k16 and cp.async
//
// What each lane of a warp holds after ldmatrix and mma.sync (tensor_core.cuh): one warp per
// launch (block = 32), each lane's registers written out as they are, so a test (or a reader)
// can lay them beside the PTX ISA's fragment figures; and a whole 16x8x16 product, loaded from
// shared memory with ldmatrix, and a cp.async copy with zero-fill.
#include <cuda_fp16.h>
#include "tensor_core.cuh"

// ldmatrix: the 32 rows of 8 halves of `rows` go to shared memory; lane l passes row order[l].
// variant: 0..2 ldmatrix_x1, _x2, _x4; 3..5 the same with .trans. out[l][i] = lane l's r[i]
// (registers an xN variant does not write are left as they were).
__global__ void ldmatrix_lanes(const unsigned short* rows, const int* order, unsigned* out, int variant) {
    __shared__ __align__(16) unsigned short s[32][8];
    int l = threadIdx.x;
    for (int c = 0; c < 8; c++) s[l][c] = rows[l * 8 + c];
    __syncthreads();
    const unsigned short* row = &s[order[l]][0];
    unsigned r[4], r2[2];
    int n = 1 << (variant % 3);
    switch (variant) {
    case 0: ldmatrix_x1(r[0], row); break;
    case 1: ldmatrix_x2(r2, row); r[0] = r2[0]; r[1] = r2[1]; break;
    case 2: ldmatrix_x4(r, row); break;
    case 3: ldmatrix_x1_trans(r[0], row); break;
    case 4: ldmatrix_x2_trans(r2, row); r[0] = r2[0]; r[1] = r2[1]; break;
    default: ldmatrix_x4_trans(r, row); break;
    }
    for (int i = 0; i < n; i++) out[l * 4 + i] = r[i];
}

// mma.sync on registers given per lane: a[l][0..3], b[l][0..1], c[l][0..3] -> d[l][0..3].
__global__ void mma_lanes(const unsigned* a, const unsigned* b, const float* c, float* d, int bf16) {
    int l = threadIdx.x;
    unsigned ra[4] = {a[l * 4], a[l * 4 + 1], a[l * 4 + 2], a[l * 4 + 3]};
    unsigned rb[2] = {b[l * 2], b[l * 2 + 1]};
    float rd[4] = {c[l * 4], c[l * 4 + 1], c[l * 4 + 2], c[l * 4 + 3]};
    if (bf16) mma_16816_bf16(rd, ra, rb);
    else mma_16816(rd, ra, rb);
    for (int i = 0; i < 4; i++) d[l * 4 + i] = rd[i];
}

// D (16x8, fp32, row-major) = A (16x16 fp16 or bf16 bits, row-major) * B (16x8, row-major: k, n).
// A comes in with ldmatrix_x4: lane l passes row l % 16, column 8 * (l / 16); B, stored k-major,
// with ldmatrix_x2_trans: lane l (< 16) passes row (k) l.
__global__ void mma_tile(const unsigned short* A, const unsigned short* B, float* D, int bf16) {
    __shared__ __align__(16) unsigned short sa[16][16];
    __shared__ __align__(16) unsigned short sb[16][8];
    int l = threadIdx.x;
    for (int i = l; i < 256; i += 32) sa[i / 16][i % 16] = A[i];
    for (int i = l; i < 128; i += 32) sb[i / 8][i % 8] = B[i];
    __syncthreads();
    unsigned a[4], b[2];
    ldmatrix_x4(a, &sa[l % 16][8 * (l / 16)]);
    ldmatrix_x2_trans(b, &sb[l % 16][0]);
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    if (bf16) mma_16816_bf16(d, a, b);
    else mma_16816(d, a, b);
    int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; i++) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

// cp.async into shared memory, then each thread writes out another thread's chunk (blockDim.x
// <= 128): thread t copies x[4t .. 4t+3] with cp_async_16 and x4[t] with cp_async_4, in two
// groups, each zero-filled where it would pass the end of its input (n, n4 elements: the source
// is not read then); y[0 .. 4 * blockDim.x) and y[4 * blockDim.x ..) get them in reverse thread order.
__global__ void cp_async_reverse(const float* x, const float* x4, float* y, int n, int n4) {
    __shared__ __align__(16) float s[128 * 4];
    __shared__ float s4[128];
    int t = threadIdx.x, nt = blockDim.x;
    cp_async_16(&s[4 * t], x + 4 * t, 4 * t + 4 <= n);
    cp_async_commit();
    cp_async_4(&s4[t], x4 + t, t < n4);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    int u = nt - 1 - t;
    for (int i = 0; i < 4; i++) y[4 * t + i] = s[4 * u + i];
    y[4 * nt + t] = s4[u];
}
