// Chapter 10: a convolution layer with its epilogue fused into the output write:
//
//     y = pool2x2( act( conv(x, w) + bias ) )
//
// Done as three kernels (a convolution, then bias + activation, then pooling), the conv's output
// makes two extra round trips through global memory: written, read and written again by bias +
// activation, read once more by the pooling, whose output is four times smaller. Fused, every
// thread computes the 2x2 window of conv outputs that one pooled output needs, adds the bias,
// applies the activation and pools in registers, and writes one value: the conv output is never
// stored (unless WRITE_ACT asks for the activations, which training needs for its backward pass).
//
//  - One thread per pooled output position (b, ph, pw), computing MG maps (default: all M_OUT;
//    blockIdx.y picks the group): every input value it loads feeds up to MG * 4 multiply-adds from
//    registers. Fewer maps per thread: fewer registers and more threads per SM, but the input is
//    read once per group. Its window of input is
//    (KSIZE+1) x (KSIZE+1) per channel; it walks it row by row, loading each input row once into
//    registers and using it for both conv rows whose masks cover it: each input value of the
//    window is read from memory exactly once per thread.
//  - The mask and the bias are in __constant__ memory (c_mask, c_bias): every thread of a warp
//    reads the same mask element at the same time, the broadcast the constant cache serves.
//  - M_OUT, C_IN, KSIZE, the activation and the pooling are compile-time constants; the row loop
//    is unrolled by UNROLL (KSIZE + 1: fully; 1: not at all). The inner loops are fully unrolled.
//  - Consecutive threads take consecutive pooled columns: loads and stores are coalesced.
//
// ACT: 0 none, 1 ReLU, 2 tanh. POOL: 0 none (each thread writes its 2x2 outputs), 1 max, 2 average.
// Layout: x (B, C_IN, H, W), mask (M_OUT, C_IN, K, K) in c_mask, bias (M_OUT) in c_bias;
// conv output Ho x Wo = H + 2 pad - K + 1 (stride 1); y (B, M_OUT, Ho/2, Wo/2) when pooling (the
// last row or column of an odd size is dropped, like torch's pooling), else (B, M_OUT, Ho, Wo);
// act (B, M_OUT, Ho, Wo), the activations before pooling, written when WRITE_ACT is 1.
// Grid: (ceil(B * ceil(Ho/2) * ceil(Wo/2) / BLOCK), M_OUT / MG) blocks of BLOCK threads.

#ifndef M_OUT
#define M_OUT 4
#endif
#ifndef C_IN
#define C_IN 1
#endif
#ifndef KSIZE
#define KSIZE 7
#endif
#ifndef ACT
#define ACT 1
#endif
#ifndef POOL
#define POOL 1
#endif
#ifndef WRITE_ACT
#define WRITE_ACT 0
#endif
#ifndef UNROLL
#define UNROLL (KSIZE + 1)
#endif
#ifndef BLOCK
#define BLOCK 128
#endif
#ifndef MG
#define MG M_OUT             // maps per thread; divides M_OUT
#endif
static_assert(M_OUT % MG == 0, "MG must divide M_OUT");

__constant__ float c_mask[M_OUT * C_IN * KSIZE * KSIZE];
__constant__ float c_bias[M_OUT];

__device__ __forceinline__ float activate(float v)
{
#if ACT == 1
    return fmaxf(v, 0.0f);
#elif ACT == 2
    return tanhf(v);
#else
    return v;
#endif
}

__global__ void conv2d_bias_act_pool(const float* __restrict__ x, float* __restrict__ y, float* __restrict__ act,
                                     int B, int H, int W, int pad)
{
    constexpr int kUnroll = UNROLL;
    const int Ho = H + 2 * pad - KSIZE + 1, Wo = W + 2 * pad - KSIZE + 1;
    const int Hq = (Ho + 1) / 2, Wq = (Wo + 1) / 2;       // 2x2 windows, the last one partial when odd
    const int t = blockIdx.x * BLOCK + threadIdx.x;
    if (t >= B * Hq * Wq) return;
    const int pw = t % Wq, ph = (t / Wq) % Hq, b = t / (Wq * Hq);
    const int oy0 = 2 * ph, ox0 = 2 * pw;                // top-left conv output of the window
    const int m0 = MG == M_OUT ? 0 : blockIdx.y * MG;    // this thread's first map (0: a constant, when all)

    float acc[MG][2][2];
#pragma unroll
    for (int m = 0; m < MG; ++m) {
        acc[m][0][0] = acc[m][0][1] = acc[m][1][0] = acc[m][1][1] = 0.0f;
    }

#pragma unroll
    for (int c = 0; c < C_IN; ++c) {
        const float* xc = x + (size_t)(b * C_IN + c) * H * W;
        // Input row r of the window feeds conv row 0 with mask row r and conv row 1 with mask row r - 1.
#pragma unroll (kUnroll)
        for (int r = 0; r < KSIZE + 1; ++r) {
            const int iy = oy0 + r - pad;
            const bool row_in = iy >= 0 && iy < H;
            float v[KSIZE + 1];
#pragma unroll
            for (int j = 0; j < KSIZE + 1; ++j) {
                const int ix = ox0 + j - pad;
                v[j] = (row_in && ix >= 0 && ix < W) ? __ldg(&xc[iy * W + ix]) : 0.0f;
            }
#pragma unroll
            for (int dr = 0; dr < 2; ++dr) {
                const int ky = r - dr;
                if (ky < 0 || ky >= KSIZE) continue;
#pragma unroll
                for (int kx = 0; kx < KSIZE; ++kx) {
#pragma unroll
                    for (int m = 0; m < MG; ++m) {
                        const float wv = c_mask[(((m0 + m) * C_IN + c) * KSIZE + ky) * KSIZE + kx];
                        acc[m][dr][0] += wv * v[kx];
                        acc[m][dr][1] += wv * v[kx + 1];
                    }
                }
            }
        }
    }

    const bool in_y1 = oy0 + 1 < Ho, in_x1 = ox0 + 1 < Wo;     // the window's far row and column exist  // listing: epilogue
#pragma unroll
    for (int m = 0; m < MG; ++m) {
        float a[2][2];
#pragma unroll
        for (int dr = 0; dr < 2; ++dr)
#pragma unroll
            for (int dc = 0; dc < 2; ++dc) a[dr][dc] = activate(acc[m][dr][dc] + c_bias[m0 + m]);
        const size_t plane = (size_t)(b * M_OUT + m0 + m);
#if WRITE_ACT || POOL == 0
#if POOL == 0
        float* out = y;
#else
        float* out = act;
#endif
        float* o = out + plane * Ho * Wo + (size_t)oy0 * Wo + ox0;
        o[0] = a[0][0];
        if (in_x1) o[1] = a[0][1];
        if (in_y1) {
            o[Wo] = a[1][0];
            if (in_x1) o[Wo + 1] = a[1][1];
        }
#endif
#if POOL != 0
        if (in_y1 && in_x1) {          // a whole window: a pooled output (odd edges are dropped)
#if POOL == 1
            const float p = fmaxf(fmaxf(a[0][0], a[0][1]), fmaxf(a[1][0], a[1][1]));
#else
            const float p = 0.25f * (a[0][0] + a[0][1] + a[1][0] + a[1][1]);
#endif
            y[plane * (Ho / 2) * (Wo / 2) + ph * (Wo / 2) + pw] = p;
        }
#endif
    }  // end listing: epilogue
}
