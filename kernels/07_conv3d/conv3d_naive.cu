// Chapter 7, step 1: 3D convolution, one thread per output.
//
// The LeetGPU 3D challenge: one input volume x (D x H x W), one mask (KD x KH x KW), a "valid"
// cross-correlation (no padding, no flip, stride 1):
//
//     y[z][r][c] = sum_{i,j,k} x[z+i][r+j][c+k] * mask[i][j][k],   Do = D-KD+1, Ho = H-KH+1, Wo = W-KW+1
//
// Chapter 2's kernel with one more loop: each thread computes one output and reads its KD*KH*KW
// input values and mask values from global memory. The mask comes through the pointer as in the
// challenge's signature (the same address in every lane: one broadcast load per tap, cached in
// L1). Neighbouring threads (consecutive c) read neighbouring inputs, so the loads coalesce and
// most hit L1; still, every output costs 2*KD*KH*KW loads for KD*KH*KW FMAs: the loads, not the
// arithmetic, set the speed.
//
// Layout: x (D,H,W), mask (KD,KH,KW), y (Do,Ho,Wo), float32, contiguous.
// Grid: (ceil(Wo/BX), ceil(Ho/BY), ceil(Do/BZ)) with block (BX, BY, BZ). Sizes at run time.

#ifndef BX
#define BX 32                  // a warp along x: coalesced loads and stores
#endif
#ifndef BY
#define BY 4
#endif
#ifndef BZ
#define BZ 2
#endif

__global__ void conv3d_naive(const float* __restrict__ x, const float* __restrict__ mask,
                             float* __restrict__ y, int D, int H, int W, int KD, int KH, int KW)
{
    const int Do = D - KD + 1, Ho = H - KH + 1, Wo = W - KW + 1;
    const int c = blockIdx.x * BX + threadIdx.x;
    const int r = blockIdx.y * BY + threadIdx.y;
    const int z = blockIdx.z * BZ + threadIdx.z;
    if (c >= Wo || r >= Ho || z >= Do) return;

    float acc = 0.0f;
    for (int i = 0; i < KD; ++i)
        for (int j = 0; j < KH; ++j) {
            const float* row = &x[((z + i) * H + (r + j)) * W + c];   // KW consecutive inputs
            const float* m = &mask[(i * KH + j) * KW];
            for (int k = 0; k < KW; ++k)
                acc += row[k] * m[k];
        }
    y[(z * Ho + r) * Wo + c] = acc;
}
