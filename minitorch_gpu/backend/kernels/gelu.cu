// GELU, x * Phi(x), forward and backward, elementwise over n float32 values.
//
//   tanh form (GPT-2):  y = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//                       dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
//   exact (erf) form:   y = 0.5 x (1 + erf(x / sqrt(2)))
//                       dy/dx = Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi)
//
// The backward recomputes tanh/erf from x (only x is saved), as the NumPy op does.
// Parallel decomposition: a grid-stride loop, one element per thread per step;
// grid: min(ceil(n / 256), a few per SM) blocks of 256 threads (chosen by the caller).
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes.

#define GELU_THREADS 256
#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define GELU_CUBIC 0.044715f

// x, y: (n,); approximate_tanh: 1 for the tanh form, 0 for the exact erf form.
extern "C" __global__ void __launch_bounds__(GELU_THREADS)
gelu_forward(const float* __restrict__ x, float* __restrict__ y, long long n,
             int approximate_tanh)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float xi = x[i];
        if (approximate_tanh) {
            const float u = SQRT_2_OVER_PI * (xi + GELU_CUBIC * xi * xi * xi);
            y[i] = 0.5f * xi * (1.0f + tanhf(u));
        } else {
            y[i] = 0.5f * xi * (1.0f + erff(xi * INV_SQRT_2));
        }
    }
}

// x, dy, dx: (n,): dx = dy * gelu'(x).
extern "C" __global__ void __launch_bounds__(GELU_THREADS)
gelu_backward(const float* __restrict__ x, const float* __restrict__ dy,
              float* __restrict__ dx, long long n, int approximate_tanh)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float xi = x[i];
        float slope;
        if (approximate_tanh) {
            const float x2 = xi * xi;
            const float t = tanhf(SQRT_2_OVER_PI * xi * (1.0f + GELU_CUBIC * x2));
            const float du_dx = SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_CUBIC * x2);
            slope = 0.5f * (1.0f + t) + 0.5f * xi * (1.0f - t * t) * du_dx;
        } else {
            const float cdf = 0.5f * (1.0f + erff(xi * INV_SQRT_2));
            slope = cdf + xi * INV_SQRT_2PI * expf(-0.5f * xi * xi);
        }
        dx[i] = dy[i] * slope;
    }
}
