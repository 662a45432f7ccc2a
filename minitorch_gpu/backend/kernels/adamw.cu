// AdamW (torch.optim.AdamW's update), in place over n float32 values of one parameter:
//
//   param *= 1 - lr * weight_decay                               (decoupled decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   param -= step_size * m / (sqrt(v) / sqrt_bias_correction2 + eps)
//
// with step_size = lr / (1 - beta1^t) and sqrt_bias_correction2 = sqrt(1 - beta2^t)
// computed by the caller in double precision (as optim/adamw.py's adamw_update_ does) and
// passed in as float. One pass reads g, m, v, param once and writes m, v, param once: the
// NumPy version's chain of a dozen in-place ops in one kernel.
// Parallel decomposition: a grid-stride loop, one element per thread per step;
// grid: chosen by the caller, blocks of 256 threads.
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes.

#define ADAMW_THREADS 256

// param, grad, exp_avg, exp_avg_sq: (n,); decay = 1 - lr * weight_decay.
extern "C" __global__ void __launch_bounds__(ADAMW_THREADS)
adamw_update(float* __restrict__ param, const float* __restrict__ grad,
             float* __restrict__ exp_avg, float* __restrict__ exp_avg_sq, long long n,
             float decay, float beta1, float beta2, float eps, float step_size,
             float sqrt_bias_correction2)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = grad[i];
        const float m = beta1 * exp_avg[i] + (1.0f - beta1) * g;
        const float v = beta2 * exp_avg_sq[i] + (1.0f - beta2) * (g * g);
        exp_avg[i] = m;
        exp_avg_sq[i] = v;
        const float denominator = sqrtf(v) / sqrt_bias_correction2 + eps;
        param[i] = param[i] * decay - step_size * (m / denominator);
    }
}
