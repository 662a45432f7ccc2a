// Layer normalization over the last dim of a row-major (N, C) float32 array, forward and
// backward, as llm.c does it (written afresh here).
//
//   forward:  mean = sum(x) / C,  var = sum((x - mean)^2) / C,  rstd = 1 / sqrt(var + eps)
//             y = (x - mean) * rstd * weight + bias
//   backward: x_hat = (x - mean) * rstd,  g_hat = dy * weight            (dL/dx_hat)
//             dx = rstd * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat))
//             dweight = sum over rows of dy * x_hat,  dbias = sum over rows of dy
//
// The forward saves mean and rstd per row (N floats each); the backward recomputes x_hat
// from them. Statistics are two-pass (the mean first, then squared deviations), as the
// NumPy reference computes them. Offsets are 64-bit: N * C may exceed 2^31.
//
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes.

#define WARP 32
#define WARPS_PER_BLOCK 8                  // rows per block in the row kernels
#define COLUMN_THREADS 256                 // threads per block in the column kernel
#define FULL_MASK 0xffffffffu

// The sum of v over the 32 lanes of a warp, in every lane (butterfly of xor shuffles).
__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// Parallel decomposition: one warp per row. Lane l reads columns l, l + 32, ... (so a
// warp's loads are coalesced), keeps partial sums, and warp_sum combines them. The row is
// read three times (mean, variance, output); the later reads mostly hit L1/L2.
// grid: ceil(N / WARPS_PER_BLOCK) blocks of WARPS_PER_BLOCK * 32 threads.
// x, y: (N, C); weight, bias: (C,); mean, rstd: (N,) outputs.
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * WARP)
layernorm_forward(const float* __restrict__ x, const float* __restrict__ weight,
                  const float* __restrict__ bias, float* __restrict__ y,
                  float* __restrict__ mean, float* __restrict__ rstd,
                  int N, int C, float eps)
{
    const int row = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row >= N) return;  // the whole warp leaves together; no block-wide sync follows

    const float* x_row = x + (long long)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += WARP) sum += x_row[c];
    const float row_mean = warp_sum(sum) / C;

    float squares = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        const float centered = x_row[c] - row_mean;
        squares += centered * centered;
    }
    const float row_rstd = 1.0f / sqrtf(warp_sum(squares) / C + eps);

    float* y_row = y + (long long)row * C;
    for (int c = lane; c < C; c += WARP)
        y_row[c] = (x_row[c] - row_mean) * row_rstd * weight[c] + bias[c];
    if (lane == 0) {
        mean[row] = row_mean;
        rstd[row] = row_rstd;
    }
}

// dx. Parallel decomposition: one warp per row, lanes strided over the columns as in the
// forward. Pass 1 sums g_hat and g_hat * x_hat over the row; pass 2 writes dx.
// grid: ceil(N / WARPS_PER_BLOCK) blocks of WARPS_PER_BLOCK * 32 threads.
// dy, x, dx: (N, C); weight: (C,); mean, rstd: (N,) from the forward.
extern "C" __global__ void __launch_bounds__(WARPS_PER_BLOCK * WARP)
layernorm_backward_dx(const float* __restrict__ dy, const float* __restrict__ x,
                      const float* __restrict__ weight, const float* __restrict__ mean,
                      const float* __restrict__ rstd, float* __restrict__ dx, int N, int C)
{
    const int row = blockIdx.x * WARPS_PER_BLOCK + threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    if (row >= N) return;

    const long long offset = (long long)row * C;
    const float row_mean = mean[row], row_rstd = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane; c < C; c += WARP) {
        const float x_hat = (x[offset + c] - row_mean) * row_rstd;
        const float g_hat = dy[offset + c] * weight[c];
        sum_g += g_hat;
        sum_gx += g_hat * x_hat;
    }
    const float mean_g = warp_sum(sum_g) / C;
    const float mean_gx = warp_sum(sum_gx) / C;
    for (int c = lane; c < C; c += WARP) {
        const float x_hat = (x[offset + c] - row_mean) * row_rstd;
        const float g_hat = dy[offset + c] * weight[c];
        dx[offset + c] = row_rstd * (g_hat - mean_g - x_hat * mean_gx);
    }
}

// dweight and dbias, stage 1 of 2: column sums over one chunk of rows. Stage 2 (the
// caller) sums the (chunks, C) partials over chunks, so the result is deterministic (no
// atomics) and there is enough parallelism even when C is small.
// Parallel decomposition: thread (c, chunk) sums rows [chunk * rows_per_chunk, ...) of
// column c; neighbouring threads read neighbouring columns of a row (coalesced).
// grid: (ceil(C / COLUMN_THREADS), chunks) blocks of COLUMN_THREADS threads.
// dy, x: (N, C); mean, rstd: (N,); dweight_partial, dbias_partial: (chunks, C) outputs.
extern "C" __global__ void __launch_bounds__(COLUMN_THREADS)
layernorm_backward_dweight_dbias(const float* __restrict__ dy, const float* __restrict__ x,
                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                 float* __restrict__ dweight_partial,
                                 float* __restrict__ dbias_partial,
                                 int N, int C, int rows_per_chunk)
{
    const int c = blockIdx.x * COLUMN_THREADS + threadIdx.x;
    if (c >= C) return;
    const int first = blockIdx.y * rows_per_chunk;
    const int last = min(N, first + rows_per_chunk);
    float dweight = 0.0f, dbias = 0.0f;
    for (int row = first; row < last; ++row) {
        const long long at = (long long)row * C + c;
        const float x_hat = (x[at] - mean[row]) * rstd[row];
        dweight += dy[at] * x_hat;
        dbias += dy[at];
    }
    dweight_partial[(long long)blockIdx.y * C + c] = dweight;
    dbias_partial[(long long)blockIdx.y * C + c] = dbias;
}
