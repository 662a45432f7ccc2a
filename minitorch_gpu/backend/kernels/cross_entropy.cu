// Softmax + cross-entropy over rows of a (M, C) float32 logit matrix (the classifier of a
// GPT: M = B * T positions, C = vocabulary), fused as llm.c does, written afresh here.
//
//   forward:  lse = log(sum_c exp(z_c))            (one pass, online max and sum)
//             loss = (1 - ls) * (lse - z_target) + ls * (lse - mean_c z_c)
//             (ls = label smoothing; loss = 0 where target == ignore_index)
//   backward: dz_c = (exp(z_c - lse) - ls / C - (c == target) * (1 - ls)) * dloss
//             (dz = 0 on ignored rows)
//
// The forward saves only lse (M floats); the backward recomputes each probability from the
// logits and lse while it writes the gradient. So the (M, C) probability matrix is never
// written at all: each pass reads the logits once, and the backward writes dz once.
// Offsets are 64-bit (M * C is often above 2^31 for GPT-2's vocabulary).
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes.

#define WARP 32
#define CE_THREADS 256                      // threads per block: one block per row
#define CE_WARPS (CE_THREADS / WARP)
#define FULL_MASK 0xffffffffu
#define NEG_INF (-__int_as_float(0x7f800000))

// exp(a - b), and 0 when a is -inf (so -inf - -inf never makes a nan).
__device__ __forceinline__ float exp_diff(float a, float b) {
    return a == NEG_INF ? 0.0f : expf(a - b);
}

// Merge two partial (max, sum of exp(z - max)) pairs into (m, s): the sum rescaled to the
// larger max. The identity is (-inf, 0).
__device__ __forceinline__ void merge(float& m, float& s, float other_m, float other_s) {
    const float merged = fmaxf(m, other_m);
    s = s * exp_diff(m, merged) + other_s * exp_diff(other_m, merged);
    m = merged;
}

// Parallel decomposition: one block of CE_THREADS threads per row. Thread t walks columns
// t, t + CE_THREADS, ... keeping an online (max m, sum s of exp(z - m)) and a plain sum of
// z (for label smoothing). Then each warp merges its 32 pairs with a shuffle-down tree
// (offsets 16, 8, 4, 2, 1: lane 0 ends with the warp's pair), lane 0 of each warp puts it
// in shared memory, and warp 0 merges the CE_WARPS pairs by the same tree.
// grid: M blocks of CE_THREADS threads.
// logits: (M, C); targets: (M,) int64; loss, lse: (M,) outputs.
extern "C" __global__ void __launch_bounds__(CE_THREADS)
cross_entropy_forward(const float* __restrict__ logits, const long long* __restrict__ targets,
                      float* __restrict__ loss, float* __restrict__ lse, int C,
                      long long ignore_index, float label_smoothing)
{
    __shared__ float warp_m[CE_WARPS], warp_s[CE_WARPS], warp_z[CE_WARPS];
    const int row = blockIdx.x;
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const float* z = logits + (long long)row * C;

    float m = NEG_INF, s = 0.0f, z_sum = 0.0f;
    for (int c = threadIdx.x; c < C; c += CE_THREADS) {
        merge(m, s, z[c], 1.0f);  // one more term exp(z_c - z_c) = 1 at max z_c
        z_sum += z[c];
    }
    for (int offset = WARP / 2; offset > 0; offset /= 2) {  // lane i merges lane i + offset
        const float other_m = __shfl_down_sync(FULL_MASK, m, offset);
        const float other_s = __shfl_down_sync(FULL_MASK, s, offset);
        z_sum += __shfl_down_sync(FULL_MASK, z_sum, offset);
        merge(m, s, other_m, other_s);
    }
    if (lane == 0) {
        warp_m[warp] = m;
        warp_s[warp] = s;
        warp_z[warp] = z_sum;
    }
    __syncthreads();
    if (warp != 0) return;
    m = lane < CE_WARPS ? warp_m[lane] : NEG_INF;
    s = lane < CE_WARPS ? warp_s[lane] : 0.0f;
    z_sum = lane < CE_WARPS ? warp_z[lane] : 0.0f;
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        const float other_m = __shfl_down_sync(FULL_MASK, m, offset);
        const float other_s = __shfl_down_sync(FULL_MASK, s, offset);
        z_sum += __shfl_down_sync(FULL_MASK, z_sum, offset);
        merge(m, s, other_m, other_s);
    }
    if (lane != 0) return;
    const float row_lse = m + logf(s);
    const long long target = targets[row];
    float row_loss = 0.0f;
    if (target != ignore_index && (target < 0 || target >= C)) {
        // never read outside the row: the loss is NaN, and the op's range check (read at
        // the next log point) names the target
        row_loss = __int_as_float(0x7fc00000);
    } else if (target != ignore_index) {
        row_loss = (1.0f - label_smoothing) * (row_lse - z[target]);
        if (label_smoothing != 0.0f) row_loss += label_smoothing * (row_lse - z_sum / C);
    }
    loss[row] = row_loss;
    lse[row] = row_lse;
}

// Parallel decomposition: one block per row, thread t writes columns t, t + CE_THREADS, ...
// (coalesced); each probability is recomputed as exp(z - lse), never stored.
// grid: M blocks of CE_THREADS threads.
// logits, dlogits: (M, C); targets, lse, dloss: (M,); dloss is dL/dloss of each row (the
// reduction's scale: 1/count for a mean, the incoming gradient for 'none').
extern "C" __global__ void __launch_bounds__(CE_THREADS)
cross_entropy_backward(const float* __restrict__ logits, const long long* __restrict__ targets,
                       const float* __restrict__ lse, const float* __restrict__ dloss,
                       float* __restrict__ dlogits, int C, long long ignore_index,
                       float label_smoothing)
{
    const int row = blockIdx.x;
    const long long offset = (long long)row * C;
    const long long target = targets[row];
    if (target == ignore_index) {  // an ignored position gets no gradient
        for (int c = threadIdx.x; c < C; c += CE_THREADS) dlogits[offset + c] = 0.0f;
        return;
    }
    const float row_lse = lse[row], row_dloss = dloss[row];
    const float smooth = label_smoothing / C;
    for (int c = threadIdx.x; c < C; c += CE_THREADS) {
        float g = expf(logits[offset + c] - row_lse) - smooth;  // softmax - smoothing
        if (c == target) g -= 1.0f - label_smoothing;           // - one-hot
        dlogits[offset + c] = g * row_dloss;
    }
}
