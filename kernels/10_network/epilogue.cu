// Chapter 10: the layers around the convolutions, one small kernel each: what a network runs
// between its convolutions when nothing is fused (and what the fused kernel saves).
//
//  - bias_act:          y = act(x + bias[m]) over (B, M, P) (P = H*W; a linear layer: P = 1)
//  - pool2x2:           2x2 max or average pooling, stride 2 (an odd last row or column dropped)
//  - pool_act_backward: the gradient through pooling and the activation, back to the pre-activation
//  - channel_sum:       db[m] = sum over b and p of dz[b, m, p] (a bias's gradient)
//  - sgd_momentum:      v = mu v + g; p -= lr v (torch.optim.SGD's update, no dampening)
//
// ACT: 0 none, 1 ReLU, 2 tanh. POOL: 1 max, 2 average (run-time arguments: one compiled module
// serves every layer). Elementwise kernels use a grid-stride loop over a flat index.

__device__ __forceinline__ float activate(float v, int act)
{
    return act == 1 ? fmaxf(v, 0.0f) : act == 2 ? tanhf(v) : v;
}

// The activation's derivative, from its output a = act(z): ReLU 1 where a > 0, tanh 1 - a^2.
__device__ __forceinline__ float activate_grad(float a, int act)
{
    return act == 1 ? (a > 0.0f ? 1.0f : 0.0f) : act == 2 ? 1.0f - a * a : 1.0f;
}

__global__ void bias_act(const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ y,  // listing: bias_act_pool
                         int B, int M, int P, int act)
{
    const long long n = (long long)B * M * P;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = activate(x[i] + bias[(i / P) % M], act);
}

// One thread per pooled output; x (planes, H, W), y (planes, H/2, W/2).
__global__ void pool2x2(const float* __restrict__ x, float* __restrict__ y, int planes, int H, int W, int mode)
{
    const int Hp = H / 2, Wp = W / 2;
    const long long n = (long long)planes * Hp * Wp;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int pw = i % Wp, ph = (i / Wp) % Hp;
        const long long plane = i / ((long long)Wp * Hp);
        const float* p = x + plane * H * W + (2 * ph) * W + 2 * pw;
        y[i] = mode == 1 ? fmaxf(fmaxf(p[0], p[1]), fmaxf(p[W], p[W + 1]))
                         : 0.25f * (p[0] + p[1] + p[W] + p[W + 1]);
    }
}  // end listing: bias_act_pool

// dz (planes, H, W) from the activations a (planes, H, W) and dp, the gradient of the pooled
// output (planes, H/2, W/2). Max pooling sends each pooled gradient to the window's first largest
// activation (torch's choice for ties), average pooling a quarter to each; positions in no window
// (an odd last row or column) get 0. mode 0: no pooling (dp has a's shape). One thread per dz element.
__global__ void pool_act_backward(const float* __restrict__ a, const float* __restrict__ dp, float* __restrict__ dz,
                                  int planes, int H, int W, int mode, int act)
{
    const int Hp = H / 2, Wp = W / 2;
    const long long n = (long long)planes * H * W;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        const int w = i % W, h = (i / W) % H;
        const long long plane = i / ((long long)W * H);
        float g;
        if (mode == 0) {
            g = dp[i];
        } else if (h / 2 >= Hp || w / 2 >= Wp) {
            g = 0.0f;
        } else {
            const float d = dp[plane * Hp * Wp + (h / 2) * Wp + w / 2];
            if (mode == 2) {
                g = 0.25f * d;
            } else {
                const float* p = a + plane * H * W + (h & ~1) * W + (w & ~1);
                const float v[4] = {p[0], p[1], p[W], p[W + 1]};
                int best = 0;
                for (int k = 1; k < 4; ++k)
                    if (v[k] > v[best]) best = k;
                g = (best == (h & 1) * 2 + (w & 1)) ? d : 0.0f;
            }
        }
        dz[i] = g * activate_grad(a[i], act);
    }
}

// One block per channel m: its threads stride over the B*P values of that channel, then reduce
// in shared memory. BLOCK threads, a power of two.
#ifndef BLOCK
#define BLOCK 256
#endif
__global__ void channel_sum(const float* __restrict__ dz, float* __restrict__ db, int B, int M, int P)
{
    __shared__ float part[BLOCK];
    const int m = blockIdx.x;
    float s = 0.0f;
    for (long long i = threadIdx.x; i < (long long)B * P; i += BLOCK) {
        const long long b = i / P, p = i % P;
        s += dz[(b * M + m) * P + p];
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (int half = BLOCK / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) db[m] = part[0];
}

__global__ void sgd_momentum(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ v,
                             int n, float lr, float mu)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float vi = mu * v[i] + g[i];
        v[i] = vi;
        p[i] -= lr * vi;
    }
}
