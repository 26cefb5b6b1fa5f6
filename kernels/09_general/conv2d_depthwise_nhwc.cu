// Chapter 9: depthwise convolution, forward, on channels-last tensors (NHWC: x (B, H, W, C),
// y (B, Ho, Wo, C)), one map per channel (M == C), the layout torch's channels_last runs
// MobileNet / ConvNeXt layers in. (conv2d_depthwise.cu: the same layer, NCHW.)
//
// In NHWC a pixel's channels are contiguous, so the lanes of a warp take consecutive channels of
// one pixel: every load and store of x and y is a run of whole vectors (VEC channels per lane,
// 4 x 4 = 16 bytes a lane for float, 4 x 2 = 8 for half: the launcher picks VEC), coalesced with
// no tile, no halo bookkeeping and no transposes. Each channel's mask is its own, so the block
// stages its channels' masks once in shared memory, tap-major: a lane reads its VEC channels' value
// of a tap as one vector.
//  - A thread computes an OY x OX patch of outputs (OY rows, OX consecutive columns) for its VEC
//    channels, and reads the input under it one row at a time into registers,
//    (OX-1)*SW + (KW-1)*DW + 1 vectors a row, using each for every (output row, ky) and
//    (output column, kx) that touches it: 3x3 with OY=2, OX=4, 24 loads for 8 outputs (one
//    thread per output: 9 for 1). What the neighbouring patches read again (the halo) comes from
//    L1 or L2: the threads of a block take consecutive patches of a row of patches.
//  - KH, KW, SH, SW, DH, DW, OY, OX and VEC are compile-time, so every loop unrolls and the
//    accumulators and the row stay in registers. Sizes, padding and the block are run-time.
//
// depthwise_nhwc_f32: float tensors; depthwise_nhwc_f16: half tensors, float sums (general.cuh).
// Grid: (ceil(B*ceil(Ho/OY)*ceil(Wo/OX) / PB), ceil(C/VEC / CB)); block CB*PB threads: CB lanes of
// VEC channels each, times PB patches; dynamic shared memory KH*KW*CB*VEC floats.

#include "general.cuh"

#ifndef KH
#define KH 3
#endif
#ifndef KW
#define KW 3
#endif
#ifndef SH
#define SH 1
#endif
#ifndef SW
#define SW 1
#endif
#ifndef DH
#define DH 1
#endif
#ifndef DW
#define DW 1
#endif
#ifndef OY
#define OY 2                                        // output rows per thread
#endif
#ifndef OX
#define OX 4                                        // output columns per thread
#endif
#ifndef VEC
#define VEC 4                                       // channels per thread: one load of VEC elements
#endif

#define XR ((OY - 1) * SH + (KH - 1) * DH + 1)      // input rows under a thread's patch
#define XC ((OX - 1) * SW + (KW - 1) * DW + 1)      // input columns under it

extern __shared__ float wsh[];                      // [KH*KW][CB*VEC]: the block's channels' masks

template <int N> struct Bytes;                      // an unsigned type of N bytes: one load or store
template <> struct Bytes<2> { typedef unsigned short t; };
template <> struct Bytes<1> { typedef unsigned char t; };
template <> struct Bytes<4> { typedef unsigned t; };
template <> struct Bytes<8> { typedef uint2 t; };
template <> struct Bytes<16> { typedef uint4 t; };

// VEC elements of p at i .. i+VEC-1 (aligned: the launcher checks C and the pointers) as floats,
// in loads of up to 16 bytes (VEC=8 floats: two). The last element is indexed first: on the
// emulator that checks the whole vector lies inside the tensor.
#define VBYTES(T) (VEC * sizeof(T) < 16 ? VEC * sizeof(T) : 16)       // bytes per load
template <class T> union Pack {
    typename Bytes<VBYTES(T)>::t u[VEC * sizeof(T) / VBYTES(T)];
    T e[VEC];
};

template <class T, class P>
__device__ __forceinline__ void load_vec(P p, long long i, float (&v)[VEC])
{
    typedef typename Bytes<VBYTES(T)>::t U;
    const U* src = reinterpret_cast<const U*>(&p[i + VEC - 1] - (VEC - 1));
    Pack<T> pk;
#pragma unroll
    for (int k = 0; k < VEC * (int)sizeof(T) / VBYTES(T); ++k) pk.u[k] = __ldg(src + k);
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[e] = to_f(pk.e[e]);
}

template <class T, class P>
__device__ __forceinline__ void store_vec(P p, long long i, const float (&v)[VEC])
{
    typedef typename Bytes<VBYTES(T)>::t U;
    U* dst = reinterpret_cast<U*>(&p[i + VEC - 1] - (VEC - 1));
    Pack<T> pk;
#pragma unroll
    for (int e = 0; e < VEC; ++e) put(pk.e[e], v[e]);
#pragma unroll
    for (int k = 0; k < VEC * (int)sizeof(T) / VBYTES(T); ++k) dst[k] = pk.u[k];
}

template <class T, class In, class Out>
__device__ __forceinline__ void depthwise_nhwc_body(In x, In w, In bias, Out y, int B, int C, int H, int W,
                                                    int Ho, int Wo, int ph, int pw, int has_bias, int CB)
{
    const int lane = threadIdx.x % CB, PB = blockDim.x / CB;
    const int c0 = blockIdx.y * CB * VEC;            // the block's first channel
    const int CBV = CB * VEC;
    for (int i = threadIdx.x; i < KH * KW * CBV; i += blockDim.x) {
        const int ch = i / (KH * KW), t = i % (KH * KW);      // consecutive threads read consecutive taps
        wsh[t * CBV + ch] = c0 + ch < C ? to_f(w[(c0 + ch) * KH * KW + t]) : 0.0f;
    }
    __syncthreads();                                // the only barrier: threads may leave after it

    const int c = c0 + lane * VEC;
    const int NX = (Wo + OX - 1) / OX, NY = (Ho + OY - 1) / OY;
    const long long patch = (long long)blockIdx.x * PB + threadIdx.x / CB;
    if (threadIdx.x >= CB * PB || c >= C || patch >= (long long)B * NY * NX) return;
    const int ox0 = (int)(patch % NX) * OX, oy0 = (int)(patch / NX % NY) * OY, b = (int)(patch / NX / NY);

    float acc[OY][OX][VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
        const float b0 = has_bias ? to_f(bias[c + e]) : 0.0f;
#pragma unroll
        for (int j = 0; j < OY; ++j)
#pragma unroll
            for (int o = 0; o < OX; ++o) acc[j][o][e] = b0;
    }
    const int iy0 = oy0 * SH - ph, ix0 = ox0 * SW - pw;
#pragma unroll
    for (int r = 0; r < XR; ++r) {
        const int iy = iy0 + r;
        if (iy < 0 || iy >= H) continue;            // a row of zeros adds nothing
        float v[XC][VEC];
#pragma unroll
        for (int q = 0; q < XC; ++q) {
            const int ix = ix0 + q;
            if (ix >= 0 && ix < W)
                load_vec<T>(x, (((long long)b * H + iy) * W + ix) * C + c, v[q]);
            else
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[q][e] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < OY; ++j) {
            const int dy = r - j * SH;              // this row is tap ky = dy / DH of output row j
            if (dy < 0 || dy % DH != 0 || dy / DH >= KH) continue;      // compile-time, once unrolled
#pragma unroll
            for (int kx = 0; kx < KW; ++kx) {
                float m[VEC];
                const int at = (dy / DH * KW + kx) * CBV + lane * VEC;
#pragma unroll
                for (int e = 0; e < VEC; ++e) m[e] = wsh[at + e];
#pragma unroll
                for (int o = 0; o < OX; ++o)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[j][o][e] += v[o * SW + kx * DW][e] * m[e];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < OY; ++j)
#pragma unroll
        for (int o = 0; o < OX; ++o)
            if (oy0 + j < Ho && ox0 + o < Wo)
                store_vec<T>(y, (((long long)b * Ho + oy0 + j) * Wo + ox0 + o) * C + c, acc[j][o]);
}

__global__ void depthwise_nhwc_f32(const float* __restrict__ x, const float* __restrict__ w,
                                   const float* __restrict__ bias, float* __restrict__ y, int B, int C, int H, int W,
                                   int Ho, int Wo, int ph, int pw, int has_bias, int CB)
{
    depthwise_nhwc_body<float>(x, w, bias, y, B, C, H, W, Ho, Wo, ph, pw, has_bias, CB);
}

__global__ void depthwise_nhwc_f16(const half* __restrict__ x, const half* __restrict__ w,
                                   const half* __restrict__ bias, half* __restrict__ y, int B, int C, int H, int W,
                                   int Ho, int Wo, int ph, int pw, int has_bias, int CB)
{
    depthwise_nhwc_body<half>(x, w, bias, y, B, C, H, W, Ho, Wo, ph, pw, has_bias, CB);
}
