// Small kernels that each do one thing the emulated GPU must get right or catch
// (tests/test_cuda_emulation.py). Macros pick the broken variants.

#define FULL_MASK 0xffffffffu

// out[block] = the sum of the block's x, through shared memory and one barrier.
extern "C" __global__ void __launch_bounds__(256)
block_sum(const float* x, float* out, int n)
{
    __shared__ float s[256];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;
#ifndef SKIP_BARRIER
    __syncthreads();
#endif
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < (int)blockDim.x; ++t) total += s[t];
        out[blockIdx.x] = total;
    }
}

// out[t] = x[t] + x[n - 1 - t] through shared memory; RACE leaves out the barrier between
// reading the mirror slot and overwriting one's own.
extern "C" __global__ void __launch_bounds__(256)
mirror_add(const float* x, float* out)
{
    __shared__ float s[256];
    const int t = threadIdx.x, n = blockDim.x;
    s[t] = x[t];
    __syncthreads();
    const float mirror = s[n - 1 - t];
#ifndef RACE
    __syncthreads();
#endif
    s[t] = s[t] + mirror;
    __syncthreads();
    out[t] = s[t];
}

// y[i] = 1 for i <= n (ROW_LOOP_LE) or i < n: the first writes one past y's end.
extern "C" __global__ void __launch_bounds__(256)
fill_ones(float* y, int n)
{
    for (int i = threadIdx.x;
#ifdef ROW_LOOP_LE
         i <= n;
#else
         i < n;
#endif
         i += blockDim.x)
        y[i] = 1.0f;
}

// The four shuffles of each thread's value, over `width` lanes: out is (4, threads).
extern "C" __global__ void __launch_bounds__(1024)
shuffles(const float* x, float* out, int operand, int width)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x, n = gridDim.x * blockDim.x;
    const float v = x[t];
    out[t] = __shfl_sync(FULL_MASK, v, operand, width);
    out[n + t] = __shfl_up_sync(FULL_MASK, v, operand, width);
    out[2 * n + t] = __shfl_down_sync(FULL_MASK, v, operand, width);
    out[3 * n + t] = __shfl_xor_sync(FULL_MASK, v, operand, width);
}

// A warp sum whose upper half-warp leaves first (EXIT_EARLY), or names only the lower half
// in its mask while every lane shuffles (HALF_MASK), or waits at a barrier while the lower
// half shuffles (BARRIER_SPLIT).
extern "C" __global__ void __launch_bounds__(1024)
broken_warp_sum(const float* x, float* out)
{
    float v = x[threadIdx.x];
#ifdef EXIT_EARLY
    if (threadIdx.x % 32 >= 16) return;
#endif
#ifdef BARRIER_SPLIT
    if (threadIdx.x % 32 >= 16) { __syncthreads(); return; }
#endif
#ifdef HALF_MASK
    const unsigned mask = 0x0000ffffu;
#else
    const unsigned mask = FULL_MASK;
#endif
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset);
    out[threadIdx.x] = v;
}

// x * scale in float32 arithmetic: a subnormal x or product becomes 0 under -ftz=true.
extern "C" __global__ void __launch_bounds__(256)
scaled(const float* x, float* y, long long n, float scale)
{
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * scale;
}

// A warp shuffle in a 2-D block: lanes are numbered by the linear thread index
// (x + y * blockDim.x), not by threadIdx.x; out[t] = the value of lane (lane + 1) % 32.
extern "C" __global__ void __launch_bounds__(1024)
rotate_2d(const float* x, float* out)
{
    const int t = threadIdx.x + threadIdx.y * blockDim.x;
    out[t] = __shfl_sync(FULL_MASK, x[t], (t % 32 + 1) % 32);
}

// Sums of 16-lane segments in a block of 48: the partial second warp names only its 16
// lanes in its mask.
extern "C" __global__ void __launch_bounds__(1024)
partial_warp_sums(const float* x, float* out)
{
    const unsigned mask = threadIdx.x >= 32 ? 0x0000ffffu : FULL_MASK;
    float v = x[threadIdx.x];
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(mask, v, offset, 16);
    out[threadIdx.x] = v;
}

// out[t] = 100 / d[t] in integers: a zero divisor traps on the CPU (garbage on a GPU).
extern "C" __global__ void __launch_bounds__(256)
divide(const int* d, int* out)
{
    out[threadIdx.x] = 100 / d[threadIdx.x];
}

// A local array read one past its end (OFF_BY_ONE): -fsanitize=bounds traps it.
extern "C" __global__ void __launch_bounds__(256)
local_sum(const float* x, float* out, int n)
{
    float part[4];
    for (int i = 0; i < 4; ++i) part[i] = x[threadIdx.x * 4 + i];
    float total = 0.0f;
#ifdef OFF_BY_ONE
    for (int i = 0; i <= n; ++i) total += part[i];
#else
    for (int i = 0; i < n; ++i) total += part[i];
#endif
    out[threadIdx.x] = total;
}

// Each block writes its own element and, with SPILL, zeroes its right neighbour's too: an
// error that a fixed block order hides when the neighbour runs later.
extern "C" __global__ void __launch_bounds__(32)
own_and_neighbour(float* out)
{
    if (threadIdx.x == 0) {
        out[blockIdx.x] = (float)blockIdx.x;
#ifdef SPILL
        if (blockIdx.x + 1 < gridDim.x) out[blockIdx.x + 1] = 0.0f;
#endif
    }
}
