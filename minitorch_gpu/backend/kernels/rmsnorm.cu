// RMS normalization over the last dim of a row-major (N, C) array (Llama's RMSNorm),
// forward and backward, in the layout of layernorm.cu.
//
//   forward:  rstd = 1 / sqrt(sum(x^2) / C + eps),   y = x * rstd * weight
//   backward: x_hat = x * rstd,  g_hat = dy * weight                  (dL/dx_hat)
//             dx = rstd * (g_hat - x_hat * mean(g_hat * x_hat))
//             dweight = sum over rows of dy * x_hat
//
// No mean is subtracted, so there is one statistic per row: the forward saves rstd (N
// floats) and the backward recomputes x_hat from it. Without a weight the launcher passes
// ones (and skips dweight). Offsets are 64-bit: N * C may exceed 2^31.
//
// Storage. x, y and dy are stored as INPUT_DTYPE (0: float32, 1: bfloat16; one module per
// dtype, as attention.cu's) and widened to float32 as they are loaded: every sum and
// product is float32 whatever the storage. y is rounded once to the storage type (bf16:
// to nearest, ties to even, as dtypes.float32_to_bfloat16); weight, rstd, dx and the
// dweight partials are float32. bf16 is handled on its 16 bits (NVRTC sees no headers).
//
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes.

#ifndef INPUT_DTYPE
#define INPUT_DTYPE 0
#endif

struct bf16_bits { unsigned short bits; };  // bfloat16: the top 16 bits of a float32

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_bits x) {
    return __uint_as_float((unsigned int)x.bits << 16);
}
__device__ __forceinline__ void store(float* out, float x) { *out = x; }
__device__ __forceinline__ void store(bf16_bits* out, float x) {
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: the quiet NaN with its sign
        out->bits = (unsigned short)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    else
        out->bits = (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// the storage type of x, y and dy
#if INPUT_DTYPE == 0
typedef float input_t;
#elif INPUT_DTYPE == 1
typedef bf16_bits input_t;
#else
#error "rmsnorm.cu: INPUT_DTYPE must be 0 (float32) or 1 (bfloat16)"
#endif

#define WARP 32
#define WARPS_PER_BLOCK 8                  // rows per block in the row kernels
#define COLUMN_THREADS 256                 // threads per block in the column kernel
#define FULL_MASK 0xffffffffu

// The sum of v over the 32 lanes of a warp, in every lane (butterfly of xor shuffles:
// offsets 16, 8, 4, 2, 1, so lane 0 ends with ((v0 + v16) + (v8 + v24)) + ...).
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// Parallel decomposition: one warp per row. Lane l reads columns l, l + 32, ... (so a
// warp's loads are coalesced) and sums their squares in order; warp_sum combines the 32
// partial sums. The row is read twice (sum of squares, output); the second read mostly
// hits L1/L2.
// grid: ceil(N / WARPS_PER_BLOCK) blocks of WARPS_PER_BLOCK * 32 threads.
// x, y: (N, C); weight: (C,); rstd: (N,) output.
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * WARP)
rms_norm_forward(const input_t* __restrict__ x, const float* __restrict__ weight,
                 input_t* __restrict__ y, float* __restrict__ rstd, long long N, int C,
                 float eps)
{
    const long long row = (long long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row >= N) return;  // the whole warp leaves together; no block-wide sync follows

    const input_t* x_row = x + row * C;
    float squares = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        const float xc = to_float(x_row[c]);
        squares += xc * xc;
    }
    const float row_rstd = 1.0f / sqrtf(warp_sum(squares) / C + eps);

    input_t* y_row = y + row * C;
    for (int c = lane; c < C; c += WARP)
        store(&y_row[c], to_float(x_row[c]) * row_rstd * weight[c]);
    if (lane == 0) rstd[row] = row_rstd;
}

// dx. Parallel decomposition: one warp per row, lanes strided over the columns as in the
// forward. Pass 1 sums g_hat * x_hat over the row; pass 2 writes dx (float32).
// grid: ceil(N / WARPS_PER_BLOCK) blocks of WARPS_PER_BLOCK * 32 threads.
// dy, x: (N, C); weight: (C,); rstd: (N,) from the forward; dx: (N, C) output.
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * WARP)
rms_norm_backward_dx(const input_t* __restrict__ dy, const input_t* __restrict__ x,
                     const float* __restrict__ weight, const float* __restrict__ rstd,
                     float* __restrict__ dx, long long N, int C)
{
    const long long row = (long long)blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row >= N) return;

    const long long offset = row * C;
    const float row_rstd = rstd[row];
    float sum_gx = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        const float x_hat = to_float(x[offset + c]) * row_rstd;
        const float g_hat = to_float(dy[offset + c]) * weight[c];
        sum_gx += g_hat * x_hat;
    }
    const float mean_gx = warp_sum(sum_gx) / C;
    for (int c = lane; c < C; c += WARP) {
        const float x_hat = to_float(x[offset + c]) * row_rstd;
        const float g_hat = to_float(dy[offset + c]) * weight[c];
        dx[offset + c] = row_rstd * (g_hat - x_hat * mean_gx);
    }
}

// dweight, stage 1 of 2: column sums over one chunk of rows. Stage 2 (the caller) sums
// the (chunks, C) partials over chunks, so the result is deterministic (no atomics) and
// there is enough parallelism even when C is small.
// Parallel decomposition: thread (c, chunk) sums rows [chunk * rows_per_chunk, ...) of
// column c in order; neighbouring threads read neighbouring columns of a row (coalesced).
// grid: (ceil(C / COLUMN_THREADS), chunks) blocks of COLUMN_THREADS threads.
// dy, x: (N, C); rstd: (N,); dweight_partial: (chunks, C) output.
extern "C" __global__ void __launch_bounds__(COLUMN_THREADS)
rms_norm_backward_dweight(const input_t* __restrict__ dy, const input_t* __restrict__ x,
                          const float* __restrict__ rstd, float* __restrict__ dweight_partial,
                          long long N, int C, long long rows_per_chunk)
{
    const int c = blockIdx.x * COLUMN_THREADS + threadIdx.x;
    if (c >= C) return;
    const long long first = blockIdx.y * rows_per_chunk;
    const long long last = min(N, first + rows_per_chunk);
    float dweight = 0.0f;
    for (long long row = first; row < last; ++row) {
        const long long at = row * C + c;
        dweight += to_float(dy[at]) * (to_float(x[at]) * rstd[row]);
    }
    dweight_partial[(long long)blockIdx.y * C + c] = dweight;
}
