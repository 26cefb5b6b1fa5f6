// Chapter 9: depthwise convolution, forward (groups == C: each output map reads one input channel,
// M = C * multiplier), the MobileNet / ConvNeXt layer, NCHW. (conv2d_depthwise_nhwc.cu: the same
// layer on channels-last tensors.)
//
// A depthwise layer does Kh*Kw multiply-adds per output (9 for 3x3, 49 for 7x7) where a standard
// layer does C*Kh*Kw: it is bound by memory, not arithmetic. The least traffic is to read x once
// and write y once, so the kernel's work is to keep enough bytes in flight to fill DRAM's
// bandwidth, and to read each input value from DRAM once and from on-chip memory as few times as
// possible:
//  - A block takes a tile of BZ output planes: BX columns x BY*OY rows of each (blockDim =
//    (BX, BY, BZ); BZ > 1 for small planes, 14x14 or 7x7, whose one tile is a warp or two). It
//    loads the input under the tile, halo included, into shared memory once, as float (half is
//    converted here, once), and zeros outside the image: the loops below need no bounds tests.
//  - The tile is loaded 16 bytes at a time (VEC16=1: 4 floats or 8 halves per load, when W is a
//    multiple of that and x is 16-byte aligned: the launcher checks), from the multiple of the
//    vector width at or left of the tile's first column, so every vector is wholly inside the
//    image or wholly outside it. Each thread issues LU loads before it stores any: a load loop
//    that stores each value before the next load has one load in flight per thread, too few
//    bytes to cover DRAM's latency (and half, one 2-byte load at a time, a quarter of that).
//  - Each thread computes OY outputs down one column. Per mask column kx it reads the input
//    column under its OY outputs, (OY-1)*SH + (KH-1)*DH + 1 values, into registers and uses each
//    for every (output row, ky) that touches it: 3x3 with OY=4, 18 shared loads for 36 FMAs
//    (one thread per output: 9 for 9). A strip down a column, not along a row: the lanes of a warp
//    are consecutive columns, so each shared load reads consecutive words (no bank conflicts at
//    stride 1) and each store writes consecutive outputs (coalesced).
//  - KH, KW, SH, SW, DH, DW, OY and VEC16 are compile-time (the launcher compiles one variant per
//    mask size, stride and dilation), so every loop over taps and rows unrolls and the
//    accumulators, the mask and the input column stay in registers. Padding, the sizes and the
//    block are run-time.
//
// depthwise_f32: float tensors; depthwise_f16: half tensors, float sums (general.cuh).
// Grid: (ceil(Wo/BX), ceil(Ho/(BY*OY)), ceil(planes_here/BZ)) over the planes z0 .. of the B*M,
// block (BX, BY, BZ), dynamic shared memory BZ*IH*IWS floats (IH, IWS below).

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
#define OY 4                                        // output rows per thread
#endif
#ifndef VEC16
#define VEC16 0                                     // 1: 16-byte loads of x (the launcher checks W and alignment)
#endif
#define LU 4                                        // loads each thread has in flight while filling the tile

#define XR ((OY - 1) * SH + (KH - 1) * DH + 1)      // input rows under a thread's OY outputs

extern __shared__ float tile[];                     // [BZ][IH][IWS]: the block's input, zero outside the image

// The V elements of row at i .. i+V-1 (16 bytes, aligned) as floats, or one element when V == 1.
// The last element is indexed first: on the emulator that checks the whole vector lies inside x.
template <class T, int V, class P>
__device__ __forceinline__ void load_vec(P row, int i, float (&v)[V])
{
    if (V == 1) {
        v[0] = to_f(row[i]);
    } else {
        const T* last = &row[i + V - 1];
        union { uint4 u; T e[V]; } p;
        p.u = __ldg(reinterpret_cast<const uint4*>(last - (V - 1)));
#pragma unroll
        for (int e = 0; e < V; ++e) v[e] = to_f(p.e[e]);
    }
}

template <class T, class In, class Out>
__device__ __forceinline__ void depthwise_body(In x, In w, In bias, Out y, int C, int H, int W, int M,
                                               int Ho, int Wo, int ph, int pw, int has_bias, int z0, int planes)
{
    constexpr int V = VEC16 ? 16 / sizeof(T) : 1;   // elements per load
    const int BX = blockDim.x, BY = blockDim.y;
    const int IW = (BX - 1) * SW + (KW - 1) * DW + 1;
    const int IH = (BY * OY - 1) * SH + (KH - 1) * DH + 1;
    const int IWV = (IW + 2 * (V - 1)) / V;         // vectors per tile row, whatever the row's offset
    const int IWS = IWV * V;                        // the tile's row stride
    const int plane = z0 + blockIdx.z * blockDim.z + threadIdx.z;    // b * M + m
    const bool live = plane < planes;               // the last block's BZ may run past the planes
    const int m = plane % M, b = plane / M;
    const int c = m / (M / C);                      // the channel map m reads
    const int ox0 = blockIdx.x * BX, oy0 = blockIdx.y * BY * OY;
    const int ix0 = ox0 * SW - pw, iy0 = oy0 * SH - ph;
    const int gx0 = ix0 - ((ix0 % V) + V) % V;     // the multiple of V at or left of ix0
    const auto xc = x + ((long long)b * C + c) * H * W;

    const int t0 = threadIdx.z * IH * IWS;          // this plane's tile
    const int n = IH * IWV, nt = BX * BY;
    for (int i0 = threadIdx.y * BX + threadIdx.x; live && i0 < n; i0 += LU * nt) {
        float v[LU][V];
#pragma unroll
        for (int u = 0; u < LU; ++u) {              // LU loads issued before any is used
            const int i = i0 + u * nt, iy = iy0 + i / IWV, gx = gx0 + i % IWV * V;
            if (i < n && iy >= 0 && iy < H && gx >= 0 && gx < W)
                load_vec<T>(xc, iy * W + gx, v[u]);
            else
#pragma unroll
                for (int e = 0; e < V; ++e) v[u][e] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < LU; ++u) {
            const int i = i0 + u * nt, at = t0 + i / IWV * IWS + i % IWV * V;
            if (i >= n) break;
            if (V == 4) {                           // one 16-byte shared store: no bank conflicts
                *reinterpret_cast<float4*>(&tile[at]) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
            } else if (V == 8) {
                *reinterpret_cast<float4*>(&tile[at]) = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
                *reinterpret_cast<float4*>(&tile[at + 4]) = make_float4(v[u][4], v[u][5], v[u][6], v[u][7]);
            } else {
#pragma unroll
                for (int e = 0; e < V; ++e) tile[at + e] = v[u][e];
            }
        }
    }
    float k[KH * KW];
#pragma unroll
    for (int t = 0; t < KH * KW; ++t) k[t] = live ? to_f(w[m * KH * KW + t]) : 0.0f;
    const float b0 = live && has_bias ? to_f(bias[m]) : 0.0f;
    __syncthreads();                                // the only barrier: threads may leave after it

    const int ox = ox0 + threadIdx.x, oy = oy0 + threadIdx.y * OY;
    if (!live || ox >= Wo || oy >= Ho) return;
    float acc[OY];
#pragma unroll
    for (int j = 0; j < OY; ++j) acc[j] = b0;
    const int base = t0 + threadIdx.y * OY * SH * IWS + (ix0 - gx0) + threadIdx.x * SW;
#pragma unroll
    for (int kx = 0; kx < KW; ++kx) {
        float col[XR];
#pragma unroll
        for (int r = 0; r < XR; ++r) col[r] = tile[base + r * IWS + kx * DW];
#pragma unroll
        for (int j = 0; j < OY; ++j)
#pragma unroll
            for (int ky = 0; ky < KH; ++ky) acc[j] += col[j * SH + ky * DH] * k[ky * KW + kx];
    }
    const auto yp = y + (long long)plane * Ho * Wo;
#pragma unroll
    for (int j = 0; j < OY; ++j)
        if (oy + j < Ho) put(yp[(oy + j) * Wo + ox], acc[j]);
}

__global__ void depthwise_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
                              float* __restrict__ y, int C, int H, int W, int M, int Ho, int Wo, int ph, int pw,
                              int has_bias, int z0, int planes)
{
    depthwise_body<float>(x, w, bias, y, C, H, W, M, Ho, Wo, ph, pw, has_bias, z0, planes);
}

__global__ void depthwise_f16(const half* __restrict__ x, const half* __restrict__ w, const half* __restrict__ bias,
                              half* __restrict__ y, int C, int H, int W, int M, int Ho, int Wo, int ph, int pw,
                              int has_bias, int z0, int planes)
{
    depthwise_body<half>(x, w, bias, y, C, H, W, M, Ho, Wo, ph, pw, has_bias, z0, planes);
}
