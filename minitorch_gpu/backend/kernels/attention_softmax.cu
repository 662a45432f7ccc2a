// The work between attention's two matrix products, fused: scale, causal mask, softmax
// and dropout in one pass per row forward, and their backward in one pass per row.
//
// On a GPU the products run on tensor cores as cuBLAS GEMMs (bf16 in, float32 out):
//   S = Q K^T                       (..., L, S) float32, from cuBLAS
//   P = softmax(S * scale [causal])  this file, written in the probability type
//   A = P * keep / (1 - p)           this file, the same pass (dropout)
//   O = A V                          cuBLAS
// and backward
//   dA = dO V^T                      (..., L, S) float32, from cuBLAS
//   dP = dA * keep / (1 - p)
//   dS = scale * P * (dP - rowsum(dP * P))   this file, in the probability type
//   dQ = dS K,  dK = dS^T Q,  dV = A^T dO    cuBLAS
// The float32 scores are read once and P (and A) written once, where the vectorised form
// takes a pass per step. The dropout mask is never stored: keep is a hash of (seed, the
// element's index in S), recomputed by the backward, so P is all it saves besides A.
//
// Probabilities are bf16 (PROB_BF16 = 1, as the GEMMs take them under autocast) or
// float32. bf16 is handled on the bits, so no header is needed (NVRTC compiles this at
// run time): a load widens exactly (bits << 16); a store rounds to nearest, ties to even,
// the same as dtypes.float32_to_bfloat16 and ml_dtypes.
// Offsets are 64-bit: rows * S passes 2^31 for GPT-2 at batch 16.

#define WARP 32
#define SOFTMAX_THREADS 256                 // threads per block: one block per row
#define SOFTMAX_WARPS (SOFTMAX_THREADS / WARP)
#define FULL_MASK 0xffffffffu
#define NEG_INF (-__int_as_float(0x7f800000))

#ifndef PROB_BF16
#define PROB_BF16 0
#endif

#if PROB_BF16
typedef unsigned short prob_t;
__device__ __forceinline__ float load_prob(prob_t x) {
    return __uint_as_float(((unsigned int)x) << 16);
}
__device__ __forceinline__ prob_t store_prob(float x) {
    const unsigned int bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u)  // NaN: the quiet NaN with its sign
        return (prob_t)(((bits >> 16) & 0x8000u) | 0x7fc0u);
    return (prob_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}
#else
typedef float prob_t;
__device__ __forceinline__ float load_prob(prob_t x) { return x; }
__device__ __forceinline__ prob_t store_prob(float x) { return x; }
#endif

// Dropout's keep test for element `index` of S: splitmix64 of seed + (index + 1) * golden
// ratio, whose top 24 bits are uniform; kept when they reach `threshold` = round(p 2^24).
// tests/kernel_twins.py computes the same bits in NumPy.
__device__ __forceinline__ bool kept(unsigned long long seed, long long index,
                                     unsigned int threshold) {
    unsigned long long z = seed + (unsigned long long)(index + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (unsigned int)(z >> 40) >= threshold;
}

// The block's maximum (op 0) or sum (op 1) of each thread's `value`: a shuffle-down tree
// in each warp, the warps' results through shared memory, then the same tree in warp 0;
// every thread gets the result.
__device__ __forceinline__ float block_reduce(float value, int op, float* shared) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    for (int offset = WARP / 2; offset > 0; offset /= 2) {
        const float other = __shfl_down_sync(FULL_MASK, value, offset);
        value = op == 0 ? fmaxf(value, other) : value + other;
    }
    __syncthreads();  // `shared` may still be read by the previous reduction
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = lane < SOFTMAX_WARPS ? shared[lane] : (op == 0 ? NEG_INF : 0.0f);
        for (int offset = WARP / 2; offset > 0; offset /= 2) {
            const float other = __shfl_down_sync(FULL_MASK, value, offset);
            value = op == 0 ? fmaxf(value, other) : value + other;
        }
        if (lane == 0) shared[SOFTMAX_WARPS] = value;
    }
    __syncthreads();
    return shared[SOFTMAX_WARPS];
}

// Forward. grid: one block of SOFTMAX_THREADS per row (row = query i of one head; rows =
// batch * heads * L); thread t walks the keys t, t + SOFTMAX_THREADS, ...
// Causal attention is top-left aligned, as PyTorch's is_causal: query i sees keys 0..i.
// scores: (rows, S) float32. probs: (rows, S), P. attended: (rows, S), A; written only
// when dropout is on (threshold > 0), else the caller uses P for A.
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
attention_softmax_forward(const float* __restrict__ scores, prob_t* __restrict__ probs,
                          prob_t* __restrict__ attended, int L, int S, float scale,
                          int causal, unsigned int threshold, float keep_scale,
                          const unsigned long long* __restrict__ seed)
{
    __shared__ float shared[SOFTMAX_WARPS + 1];
    const long long row = blockIdx.x;
    const int query = (int)(row % L);
    const int visible = causal ? min(S, query + 1) : S;  // keys 0 .. visible - 1
    const long long first = row * S;
    const float* s = scores + first;

    float m = NEG_INF;
    for (int j = threadIdx.x; j < visible; j += SOFTMAX_THREADS) m = fmaxf(m, s[j] * scale);
    m = block_reduce(m, 0, shared);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < visible; j += SOFTMAX_THREADS) sum += expf(s[j] * scale - m);
    const float inverse = 1.0f / block_reduce(sum, 1, shared);

    const unsigned long long key = threshold ? seed[0] : 0ull;
    for (int j = threadIdx.x; j < S; j += SOFTMAX_THREADS) {
        const float p = j < visible ? expf(s[j] * scale - m) * inverse : 0.0f;
        probs[first + j] = store_prob(p);
        if (threshold)
            attended[first + j] = store_prob(kept(key, first + j, threshold) ? p * keep_scale
                                                                             : 0.0f);
    }
}

// Backward. The same grid. d_attended: (rows, S) float32, dA = dO V^T. probs: the forward's
// P. d_scores: (rows, S), dS, the gradient of the scores before scaling (so dQ = dS K).
// Keys a query could not see have P = 0, so their dS is 0 without a test.
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
attention_softmax_backward(const float* __restrict__ d_attended,
                           const prob_t* __restrict__ probs, prob_t* __restrict__ d_scores,
                           int S, float scale, unsigned int threshold, float keep_scale,
                           const unsigned long long* __restrict__ seed)
{
    __shared__ float shared[SOFTMAX_WARPS + 1];
    const long long first = (long long)blockIdx.x * S;
    const unsigned long long key = threshold ? seed[0] : 0ull;

    float dot = 0.0f;  // rowsum(dP * P)
    for (int j = threadIdx.x; j < S; j += SOFTMAX_THREADS) {
        float dp = d_attended[first + j];
        if (threshold) dp = kept(key, first + j, threshold) ? dp * keep_scale : 0.0f;
        dot += dp * load_prob(probs[first + j]);
    }
    dot = block_reduce(dot, 1, shared);
    for (int j = threadIdx.x; j < S; j += SOFTMAX_THREADS) {
        float dp = d_attended[first + j];
        if (threshold) dp = kept(key, first + j, threshold) ? dp * keep_scale : 0.0f;
        d_scores[first + j] = store_prob(scale * load_prob(probs[first + j]) * (dp - dot));
    }
}
