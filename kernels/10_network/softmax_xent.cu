// Chapter 10: softmax and cross-entropy, forward and gradient, one thread per row (an image's
// logits: 10 classes, so a row fits in the thread's registers and loops).
//
//  softmax:      p[i, :] = exp(z[i, :] - max) / sum exp(z[i, :] - max)   (shifted: no overflow)
//  softmax_xent: loss[i] = log sum exp(z[i, :]) - z[i, label[i]]  and
//                dz[i, :] = (p[i, :] - onehot(label[i])) * scale  (scale = 1/N: the mean's gradient)
// z (N, K) row-major.

// The row's largest value mx and sum of exp(z - mx): subtracting mx keeps every exp at most 1.
__device__ float sum_exp_below_max(const float* zi, int K, float& mx)
{
    mx = zi[0];
    for (int k = 1; k < K; ++k) mx = fmaxf(mx, zi[k]);
    float s = 0.0f;
    for (int k = 0; k < K; ++k) s += expf(zi[k] - mx);
    return s;
}

__global__ void softmax(const float* __restrict__ z, float* __restrict__ p, int N, int K)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float* zi = z + (size_t)i * K;
    float mx;
    const float s = sum_exp_below_max(zi, K, mx);
    const float inv = 1.0f / s;
    for (int k = 0; k < K; ++k) p[(size_t)i * K + k] = expf(zi[k] - mx) * inv;
}

__global__ void softmax_xent(const float* __restrict__ z, const long long* __restrict__ label,
                             float* __restrict__ loss, float* __restrict__ dz, int N, int K, float scale)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float* zi = z + (size_t)i * K;
    float mx;
    const float s = sum_exp_below_max(zi, K, mx);
    const int y = (int)label[i];
    loss[i] = logf(s) + mx - zi[y];
    const float inv = 1.0f / s;
    for (int k = 0; k < K; ++k)
        dz[(size_t)i * K + k] = (expf(zi[k] - mx) * inv - (k == y ? 1.0f : 0.0f)) * scale;
}
