// Scaled dot-product attention in the flash-attention style, forward and backward, with an
// optional causal mask (query i sees keys j <= i, top-left aligned as PyTorch's is_causal).
// No (L, S) score matrix is ever stored in global memory.
//
// Inputs, read where they are and as they are stored. q (B, H, L, HEAD_DIM), k and v
// (B, H, S, HEAD_DIM) and, in backward, dO like q are each given as a pointer and three
// strides in elements, its batch, head and row strides (x_batch, x_head, x_row); the last
// dim is contiguous. GPT's heads, (B, nh, T, hs) views of the (B, T, 3C) projection with
// batch stride 3TC, head stride hs and row stride 3C, are read where c_attn wrote them. The
// launcher flattens any leading dims into these two (B, H) when their strides allow, and
// copies an input only when they do not. Inputs are stored as INPUT_DTYPE (float32,
// bfloat16 or float16; one module per dtype) and widened to float32 as they are loaded into
// shared memory, so all arithmetic is float32 whatever the storage. The outputs are
// contiguous float32: o (B, H, L, HEAD_DIM) and lse (B, H, L) in the forward; D (B, H, L),
// dq, dk and dv (the shapes of q, k, v) in the backward, which reads o as the forward wrote
// it. The op rounds o and the gradients to the inputs' dtype.
//
// Grouped-query attention (GQA). With group = G > 1, q and dO are (B, H, G, L, HEAD_DIM)
// and k, v (B, H, 1, S, HEAD_DIM): query head (h, g) reads kv head h, for every g, and k
// and v are never repeated. q and dO take a fourth stride, their group stride (q_group,
// dout_group; 0 when G = 1); the kernels' problems are the B H G query heads, numbered
// qbh = (b * H + h) * G + g, which is also their index in o, lse, D and dq. dk and dv are
// (B, H, 1, S, HEAD_DIM): the dkdv block of kv head (b, h) walks the queries of all G heads
// of its group in turn, so each dK_j, dV_j is the sum over the group, still without atomics.
//
// Forward (online softmax). For each query row, walk the keys tile by tile keeping
//   m   the running max of the scores s_j = scale * q . k_j seen so far,
//   l   the running sum of exp(s_j - m),
//   acc the running sum of exp(s_j - m) * v_j            (HEAD_DIM values).
// A new tile with scores s: m_new = max(m, max_j s_j), alpha = exp(m - m_new),
//   p_j = exp(s_j - m_new), l = alpha * l + sum_j p_j, acc = alpha * acc + sum_j p_j v_j.
// At the end o = acc / l, and lse = m + log(l) (the log-sum-exp of the row) is saved.
//
// Backward (recomputation). With P_ij = exp(s_ij - lse_i) rebuilt from the saved lse:
//   D_i   = rowsum(dO_i * O_i)              (= sum_j P_ij dP_ij; the preprocess kernel)
//   dP_ij = dO_i . v_j,   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i  = scale * sum_j dS_ij k_j         (kernel _dq: one block per query tile)
//   dK_j  = scale * sum_i dS_ij q_i,  dV_j = sum_i P_ij dO_i
//                                           (kernel _dkdv: one block per key tile)
// Each gradient is summed by the one block that owns its rows, so there are no atomics
// and the result is deterministic; the price is computing P twice (once per kernel).
//
// Grid. The tiled kernels number their blocks in one flat row, blockIdx.x = bh * tiles +
// tile, where bh is the problem (the query head qbh in forward and dq, the kv head
// b * H + h in dkdv) and tile the block's place among the problem's row tiles.
// gridDim.x takes 2^31 - 1 blocks where y and z stop at 65535, so neither the number of
// problems nor the length is held to 65535 tiles by the grid. A problem's blocks are
// neighbours and share its K/V tiles in L2. Causal: the forward and dq kernels take their
// problem's tiles last first, so that the query tiles that see the most keys start first
// and the lightest fill the last wave (dkdv's heaviest key tiles are its first ones
// already).
//
// Length. Nothing in shared memory or registers grows with L or S: a block holds its own
// rows and one tile of the other side and walks the rest. Offsets into the inputs and
// outputs are 64-bit (row * 3C passes 2^31 elements long before a position does);
// positions are int, so the launcher keeps L, S <= 2^30. What is left of length is time:
// O(L S HEAD_DIM) multiply-adds per problem, on CUDA cores, and twice that in backward.
//
// HEAD_DIM and INPUT_DTYPE are compile-time constants (-DHEAD_DIM=64 -DINPUT_DTYPE=1): the
// loader builds one module per (head size, dtype). The loops over a warp's rows and a
// lane's dims are unrolled, so the accumulators (acc[r][t]) stay in registers rather than
// local memory. Tiles live in static shared memory, under 48 KiB for HEAD_DIM <= 128.
// Compiled by NVRTC (cupy.RawModule) at run time: device code only, no includes. So bf16
// and fp16 are read as their 16 bits (bf16_bits, fp16_bits below), not as cuda_bf16.h's
// types, whose header NVRTC finds only beside a full toolkit: bf16 -> float32 is those bits
// shifted to the top half of a float, fp16 -> float32 one PTX cvt, both exact.

#ifndef HEAD_DIM
#error "attention.cu: compile with -DHEAD_DIM=<head size>, 1 <= HEAD_DIM <= 128"
#endif
static_assert(HEAD_DIM >= 1 && HEAD_DIM <= 128, "attention.cu: HEAD_DIM must be in [1, 128]");

#ifndef INPUT_DTYPE
#define INPUT_DTYPE 0
#endif

struct bf16_bits { unsigned short bits; };  // bfloat16: the top 16 bits of a float32
struct fp16_bits { unsigned short bits; };  // IEEE binary16

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_bits x) {
    return __uint_as_float((unsigned int)x.bits << 16);
}
__device__ __forceinline__ float to_float(fp16_bits x) {
#if defined(__CUDA_ARCH__)  // NVRTC and nvcc's device pass: the one PTX instruction
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
#else  // the same exact widening in C, for a host compiler (the CPU emulation's g++)
    const unsigned int sign = (unsigned int)(x.bits & 0x8000u) << 16;
    unsigned int exponent = (x.bits >> 10) & 0x1fu, mantissa = x.bits & 0x3ffu;
    if (exponent == 0x1fu)  // inf, nan
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    if (exponent == 0) {
        if (mantissa == 0) return __uint_as_float(sign);
        exponent = 113;  // a subnormal half is a normal float: shift its leading 1 up
        while (!(mantissa & 0x400u)) { mantissa <<= 1; --exponent; }
        return __uint_as_float(sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13));
    }
    return __uint_as_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
#endif
}

// the storage type of q, k, v and dO
#if INPUT_DTYPE == 0
typedef float input_t;
#elif INPUT_DTYPE == 1
typedef bf16_bits input_t;
#elif INPUT_DTYPE == 2
typedef fp16_bits input_t;
#else
#error "attention.cu: INPUT_DTYPE must be 0 (float32), 1 (bfloat16) or 2 (float16)"
#endif

#define WARP 32
#define WARPS 4                             // warps per block: 128 threads
#define TILE 32                             // keys per K/V tile (forward, dq), queries per
                                            // Q tile (dkdv): one per lane of a warp
#define DIMS_PER_LANE ((HEAD_DIM + WARP - 1) / WARP)  // lane owns dims lane + 32 * t
#define PADDED (HEAD_DIM | 1)               // odd row stride for tiles where lane j reads
                                            // row j: the 32 lanes hit 32 different banks
#define FWD_ROWS 4                          // query rows per warp in the forward
#define BWD_ROWS (HEAD_DIM > 64 ? 2 : 4)    // query rows (dq) / key rows (dkdv) per warp
#define FULL_MASK 0xffffffffu
// The forward's minimum resident blocks per SM, for ptxas's register budget. Measured with
// NVRTC 13.5 (scripts/kernel_resources.py, PERF.md): at HEAD_DIM 64 sm_90 took 124
// registers (4 blocks, 25% occupancy); asking for 5 gives 96 with no spill (5 blocks,
// 31%). At other sizes the same request gained nothing or spilled (33, 65, 99), so it is
// asked only at 64 (and a minimum of 1 is not the same as none: it changes the allocation
// too); whether 31% runs faster than 25% only a GPU can say.
// -DFWD_MIN_BLOCKS_AT_64=0 builds it without (scripts/bench_attention_occupancy.py times
// both on a GPU).
#ifndef FWD_MIN_BLOCKS_AT_64
#define FWD_MIN_BLOCKS_AT_64 5
#endif
#if HEAD_DIM == 64 && FWD_MIN_BLOCKS_AT_64 > 0
#define FWD_MIN_BLOCKS , FWD_MIN_BLOCKS_AT_64
#else
#define FWD_MIN_BLOCKS
#endif
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = WARP / 2; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

// exp(a - b), and 0 when a is -inf (so -inf - -inf never makes a nan).
__device__ __forceinline__ float exp_diff(float a, float b) {
    return a == NEG_INF ? 0.0f : expf(a - b);
}

// Whether query `query` may attend to key `key`.
__device__ __forceinline__ bool visible(int query, int key, int S, int causal) {
    return key < S && !(causal && key > query);
}

// The problem and row tile a block owns (see Grid above).
struct Place {
    long long bh;    // the problem's index in the contiguous outputs: (b * heads + h) *
                     // group + g for a query head, b * heads + h for a kv head
    long long b, h;  // its batch and (kv) head: the inputs' strides apply to these
    int g;           // its place in the group of query heads that share kv head (b, h)
    int tile;        // which tile of the problem's rows
};

// `group`: G for blocks of query heads (forward, dq), 1 for blocks of kv heads (dkdv).
__device__ __forceinline__ Place place(int tiles, int heads, int group, bool last_first) {
    const long long block = blockIdx.x;
    const int tile = (int)(block % tiles);
    Place at;
    at.bh = block / tiles;
    const long long kv = at.bh / group;
    at.g = (int)(at.bh % group);
    at.b = kv / heads;
    at.h = kv % heads;
    at.tile = last_first ? tiles - 1 - tile : tile;
    return at;
}

// Row 0 of kv head (b, h) of an input with batch stride `batch` and head stride `head`,
// and of query head g of its group with group stride `group` (q, dO; 0 for k, v).
__device__ __forceinline__ const input_t* rows_of(const input_t* x, const Place& at,
                                                  long long batch, long long head,
                                                  int g = 0, long long group = 0) {
    return x + at.b * batch + at.h * head + g * group;
}

// Copy `rows` rows of HEAD_DIM values starting at row `first` of one problem's `count` rows
// (`row_stride` elements apart, contiguous within) into a float32 shared tile with row
// stride `stride`, widening them from their storage type; rows past `count` become zeros.
// All threads of the block take part (coalesced: consecutive threads, consecutive dims).
template <typename T>
__device__ __forceinline__ void load_tile(float* tile, int stride, const T* src,
                                          long long row_stride, int first, int rows,
                                          int count) {
    for (int idx = threadIdx.x; idx < rows * HEAD_DIM; idx += blockDim.x) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        tile[r * stride + d] =
            first + r < count ? to_float(src[(long long)(first + r) * row_stride + d]) : 0.0f;
    }
}

// acc[t] += sum over the tile's TILE rows j of w_j * tile[j][lane + 32 t], where lane j of
// the warp holds w_j in `w` (read with a shuffle) and `stride` is the tile's row stride:
// the forward's p_j v_j and dq's dS_ij k_j. Every lane of the warp calls it.
__device__ __forceinline__ void accumulate_rows(float (&acc)[DIMS_PER_LANE], float w,
                                                const float* tile, int stride, int lane) {
    for (int j = 0; j < TILE; ++j) {
        const float w_j = __shfl_sync(FULL_MASK, w, j);
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) {
            const int d = lane + WARP * t;
            if (d < HEAD_DIM) acc[t] += w_j * tile[j * stride + d];
        }
    }
}

// Backward's recomputation for one visible (query i, key j) pair, from their rows of q, k,
// dO and v and the query's saved lse and D: returns P_ij = exp(scale q_i . k_j - lse_i)
// and sets ds to dS_ij = P_ij (dO_i . v_j - D_i). Used by both the dq and dkdv kernels.
__device__ __forceinline__ float recompute_p(const float* q_i, const float* k_j,
                                             const float* do_i, const float* v_j, float scale,
                                             float lse_i, float delta_i, float& ds) {
    float s = 0.0f, dp = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) {
        s += q_i[d] * k_j[d];
        dp += do_i[d] * v_j[d];
    }
    const float p = expf(s * scale - lse_i);
    ds = p * (dp - delta_i);
    return p;
}

// ---- forward --------------------------------------------------------------------------
// Parallel decomposition: block (bh, tile) owns the BR = WARPS * FWD_ROWS query rows
// tile * BR ... of query head bh (head (h, g) reads kv head h); warp w owns FWD_ROWS of
// them, handled one after another. For each K/V tile (TILE keys, loaded by the whole
// block into shared memory) lane j computes the score of key j; warp_max / warp_sum
// reduce over the tile's keys; then lane j accumulates output dims j, j + 32, ... (acc in
// registers), reading each key's p_j from its lane with a shuffle. Causal: the block
// stops at the tile holding its last row's key.
// grid: ceil(L / BR) * B * H * G blocks of WARPS * 32 threads.
// q: (B, H, G, L, HEAD_DIM), k, v: (B, H, 1, S, HEAD_DIM), strided; o: (B, H, G, L,
// HEAD_DIM) and lse: (B, H, G, L) outputs, contiguous float32.
extern "C" __global__ void __launch_bounds__(WARPS * WARP FWD_MIN_BLOCKS)
flash_attention_forward(const input_t* __restrict__ q, const input_t* __restrict__ k,
                        const input_t* __restrict__ v, float* __restrict__ o,
                        float* __restrict__ lse, int L, int S, int heads, int group,
                        float scale, int causal, long long q_batch, long long q_head,
                        long long q_group, long long q_row, long long k_batch,
                        long long k_head, long long k_row, long long v_batch,
                        long long v_head, long long v_row)
{
    constexpr int BR = WARPS * FWD_ROWS;
    __shared__ float q_s[BR][HEAD_DIM];     // this block's query rows
    __shared__ float k_s[TILE][PADDED];     // lane j reads row j: padded
    __shared__ float v_s[TILE][HEAD_DIM];   // lane d reads column d: no padding needed

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const Place at = place((L + BR - 1) / BR, heads, group, causal);
    const int q0 = at.tile * BR;
    const input_t* k_h = rows_of(k, at, k_batch, k_head);
    const input_t* v_h = rows_of(v, at, v_batch, v_head);
    load_tile(&q_s[0][0], HEAD_DIM, rows_of(q, at, q_batch, q_head, at.g, q_group), q_row, q0,
              BR, L);

    float acc[FWD_ROWS][DIMS_PER_LANE];
    float m[FWD_ROWS], l[FWD_ROWS];
    #pragma unroll
    for (int r = 0; r < FWD_ROWS; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) acc[r][t] = 0.0f;
    }

    const int kv_end = causal ? min(S, q0 + BR) : S;  // keys after the last row: all masked
    for (int kv0 = 0; kv0 < kv_end; kv0 += TILE) {
        __syncthreads();  // the previous tile is no longer read (and q_s is written)
        load_tile(&k_s[0][0], PADDED, k_h, k_row, kv0, TILE, S);
        load_tile(&v_s[0][0], HEAD_DIM, v_h, v_row, kv0, TILE, S);
        __syncthreads();
        #pragma unroll
        for (int r = 0; r < FWD_ROWS; ++r) {
            const int local = warp * FWD_ROWS + r, row = q0 + local;
            if (row >= L) break;  // the same for every lane: the warp stays converged
            const int key = kv0 + lane;
            float s = NEG_INF;
            if (visible(row, key, S, causal)) {
                float dot = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d) dot += q_s[local][d] * k_s[lane][d];
                s = dot * scale;
            }
            const float m_new = fmaxf(m[r], warp_max(s));
            const float p = exp_diff(s, m_new);       // this lane's key weight
            const float alpha = exp_diff(m[r], m_new);  // rescales what came before
            l[r] = l[r] * alpha + warp_sum(p);
            #pragma unroll
            for (int t = 0; t < DIMS_PER_LANE; ++t) acc[r][t] *= alpha;
            accumulate_rows(acc[r], p, &v_s[0][0], HEAD_DIM, lane);
            m[r] = m_new;
        }
    }

    #pragma unroll

    for (int r = 0; r < FWD_ROWS; ++r) {
        const int row = q0 + warp * FWD_ROWS + r;
        if (row >= L) break;
        float* o_row = o + (at.bh * L + row) * HEAD_DIM;
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) {
            const int d = lane + WARP * t;
            if (d < HEAD_DIM) o_row[d] = acc[r][t] / l[r];
        }
        if (lane == 0) lse[at.bh * L + row] = m[r] + logf(l[r]);
    }
}

// ---- backward, step 1: D = rowsum(dO * O) ---------------------------------------------
// Parallel decomposition: one warp per row (of all B * H * G * L rows), lanes strided over
// dims; a grid-stride loop over the rows, so the grid is capped by the caller, not by them.
// grid: min(ceil(rows / WARPS), a cap) blocks of WARPS * 32 threads.
// o: (B, H, G, L, HEAD_DIM), contiguous float32; dout: (B, H, G, L, HEAD_DIM), strided;
// delta: (B, H, G, L) output.
extern "C" __global__ void __launch_bounds__(WARPS * WARP)
flash_attention_backward_preprocess(const float* __restrict__ o,
                                    const input_t* __restrict__ dout,
                                    float* __restrict__ delta, long long rows, int L,
                                    int heads, int group, long long dout_batch,
                                    long long dout_head, long long dout_group,
                                    long long dout_row)
{
    const int lane = threadIdx.x % WARP;
    for (long long row = (long long)blockIdx.x * WARPS + threadIdx.x / WARP; row < rows;
         row += (long long)gridDim.x * WARPS) {  // the same for every lane of a warp
        const long long qbh = row / L, kv = qbh / group;
        const input_t* do_row = dout + (kv / heads) * dout_batch + (kv % heads) * dout_head
                                + (qbh % group) * dout_group + (row % L) * dout_row;
        float sum = 0.0f;
        for (int d = lane; d < HEAD_DIM; d += WARP)
            sum += o[row * HEAD_DIM + d] * to_float(do_row[d]);
        sum = warp_sum(sum);
        if (lane == 0) delta[row] = sum;
    }
}

// ---- backward, step 2: dQ ---------------------------------------------------------------
// Parallel decomposition: as the forward. Block (bh, tile) owns BR = WARPS * BWD_ROWS query
// rows of query head bh, warp w owns BWD_ROWS of them; for each K/V tile lane j recomputes
// P_ij and dS_ij for key j, then lane d accumulates dQ_i[d] += dS_ij k_j[d] over the tile.
// grid: ceil(L / BR) * B * H * G blocks of WARPS * 32 threads.
// q, dout: (B, H, G, L, HEAD_DIM), k, v: (B, H, 1, S, HEAD_DIM), strided; lse, delta:
// (B, H, G, L); dq: (B, H, G, L, HEAD_DIM) output, contiguous float32.
extern "C" __global__ void __launch_bounds__(WARPS * WARP)
flash_attention_backward_dq(const input_t* __restrict__ q, const input_t* __restrict__ k,
                            const input_t* __restrict__ v, const input_t* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            float* __restrict__ dq, int L, int S, int heads, int group,
                            float scale, int causal, long long q_batch, long long q_head,
                            long long q_group, long long q_row, long long k_batch,
                            long long k_head, long long k_row, long long v_batch,
                            long long v_head, long long v_row, long long dout_batch,
                            long long dout_head, long long dout_group, long long dout_row)
{
    constexpr int BR = WARPS * BWD_ROWS;
    __shared__ float q_s[BR][HEAD_DIM];
    __shared__ float do_s[BR][HEAD_DIM];
    __shared__ float k_s[TILE][PADDED];   // lane j reads row j (dot products): padded
    __shared__ float v_s[TILE][PADDED];

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const Place at = place((L + BR - 1) / BR, heads, group, causal);
    const int q0 = at.tile * BR;
    const input_t* k_h = rows_of(k, at, k_batch, k_head);
    const input_t* v_h = rows_of(v, at, v_batch, v_head);
    load_tile(&q_s[0][0], HEAD_DIM, rows_of(q, at, q_batch, q_head, at.g, q_group), q_row, q0,
              BR, L);
    load_tile(&do_s[0][0], HEAD_DIM, rows_of(dout, at, dout_batch, dout_head, at.g,
                                             dout_group), dout_row, q0, BR, L);

    float acc[BWD_ROWS][DIMS_PER_LANE];
    float row_lse[BWD_ROWS], row_delta[BWD_ROWS];
    #pragma unroll
    for (int r = 0; r < BWD_ROWS; ++r) {
        const int row = q0 + warp * BWD_ROWS + r;
        row_lse[r] = row < L ? lse[at.bh * L + row] : 0.0f;
        row_delta[r] = row < L ? delta[at.bh * L + row] : 0.0f;
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) acc[r][t] = 0.0f;
    }

    const int kv_end = causal ? min(S, q0 + BR) : S;
    for (int kv0 = 0; kv0 < kv_end; kv0 += TILE) {
        __syncthreads();
        load_tile(&k_s[0][0], PADDED, k_h, k_row, kv0, TILE, S);
        load_tile(&v_s[0][0], PADDED, v_h, v_row, kv0, TILE, S);
        __syncthreads();
        #pragma unroll
        for (int r = 0; r < BWD_ROWS; ++r) {
            const int local = warp * BWD_ROWS + r, row = q0 + local;
            if (row >= L) break;
            const int key = kv0 + lane;
            float ds = 0.0f;  // dS for (row, key); 0 where masked
            if (visible(row, key, S, causal))
                recompute_p(q_s[local], k_s[lane], do_s[local], v_s[lane], scale, row_lse[r],
                            row_delta[r], ds);
            accumulate_rows(acc[r], ds, &k_s[0][0], PADDED, lane);
        }
    }

    #pragma unroll

    for (int r = 0; r < BWD_ROWS; ++r) {
        const int row = q0 + warp * BWD_ROWS + r;
        if (row >= L) break;
        float* dq_row = dq + (at.bh * L + row) * HEAD_DIM;
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) {
            const int d = lane + WARP * t;
            if (d < HEAD_DIM) dq_row[d] = acc[r][t] * scale;
        }
    }
}

// ---- backward, step 3: dK and dV --------------------------------------------------------
// Parallel decomposition: the transpose of dq's. Block (bh, tile) owns BK = WARPS *
// BWD_ROWS keys of kv head bh, warp w owns BWD_ROWS of them (k and v rows in shared
// memory, dK and dV accumulators in registers). For each of the G query heads of its
// group in turn, it walks the queries that can see its keys (causal: from its first key
// on) in tiles of TILE: lane i recomputes P_ij and dS_ij for query i, then lane d
// accumulates dV_j[d] += P_ij dO_i[d] and dK_j[d] += dS_ij q_i[d] over the tile. So the
// accumulators sum over the whole group, g = 0 .. G - 1 and each g's tiles in order.
// grid: ceil(S / BK) * B * H blocks of WARPS * 32 threads.
// q, dout: (B, H, G, L, HEAD_DIM), k, v: (B, H, 1, S, HEAD_DIM), strided; lse, delta:
// (B, H, G, L); dk, dv: (B, H, 1, S, HEAD_DIM) outputs, contiguous float32.
extern "C" __global__ void __launch_bounds__(WARPS * WARP)
flash_attention_backward_dkdv(const input_t* __restrict__ q, const input_t* __restrict__ k,
                              const input_t* __restrict__ v, const input_t* __restrict__ dout,
                              const float* __restrict__ lse, const float* __restrict__ delta,
                              float* __restrict__ dk, float* __restrict__ dv, int L, int S,
                              int heads, int group, float scale, int causal,
                              long long q_batch, long long q_head, long long q_group,
                              long long q_row, long long k_batch, long long k_head,
                              long long k_row, long long v_batch, long long v_head,
                              long long v_row, long long dout_batch, long long dout_head,
                              long long dout_group, long long dout_row)
{
    constexpr int BK = WARPS * BWD_ROWS;
    __shared__ float k_s[BK][HEAD_DIM];
    __shared__ float v_s[BK][HEAD_DIM];
    __shared__ float q_s[TILE][PADDED];   // lane i reads row i (dot products): padded
    __shared__ float do_s[TILE][PADDED];
    __shared__ float lse_s[TILE], delta_s[TILE];

    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const Place at = place((S + BK - 1) / BK, heads, 1, false);  // a kv head per problem
    const int k0 = at.tile * BK;
    load_tile(&k_s[0][0], HEAD_DIM, rows_of(k, at, k_batch, k_head), k_row, k0, BK, S);
    load_tile(&v_s[0][0], HEAD_DIM, rows_of(v, at, v_batch, v_head), v_row, k0, BK, S);

    float dk_acc[BWD_ROWS][DIMS_PER_LANE], dv_acc[BWD_ROWS][DIMS_PER_LANE];
    #pragma unroll
    for (int r = 0; r < BWD_ROWS; ++r)
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) dk_acc[r][t] = dv_acc[r][t] = 0.0f;

    const int q_start = causal ? k0 : 0;  // earlier queries see none of these keys
    for (int g = 0; g < group; ++g) {
        const input_t* q_h = rows_of(q, at, q_batch, q_head, g, q_group);
        const input_t* do_h = rows_of(dout, at, dout_batch, dout_head, g, dout_group);
        const long long qbh = at.bh * group + g;  // the query head: its rows of lse and delta
        for (int q0 = q_start; q0 < L; q0 += TILE) {
            __syncthreads();
            load_tile(&q_s[0][0], PADDED, q_h, q_row, q0, TILE, L);
            load_tile(&do_s[0][0], PADDED, do_h, dout_row, q0, TILE, L);
            if (threadIdx.x < TILE) {
                const int row = q0 + threadIdx.x;
                lse_s[threadIdx.x] = row < L ? lse[qbh * L + row] : 0.0f;
                delta_s[threadIdx.x] = row < L ? delta[qbh * L + row] : 0.0f;
            }
            __syncthreads();
            #pragma unroll
            for (int r = 0; r < BWD_ROWS; ++r) {
                const int local = warp * BWD_ROWS + r, key = k0 + local;
                if (key >= S) break;
                const int query = q0 + lane;
                float p = 0.0f, ds = 0.0f;  // P and dS for (query, key); 0 where masked
                if (query < L && visible(query, key, S, causal))
                    p = recompute_p(q_s[lane], k_s[local], do_s[lane], v_s[local], scale,
                                    lse_s[lane], delta_s[lane], ds);
                for (int i = 0; i < TILE; ++i) {
                    const float p_i = __shfl_sync(FULL_MASK, p, i);
                    const float ds_i = __shfl_sync(FULL_MASK, ds, i);
                    #pragma unroll
                    for (int t = 0; t < DIMS_PER_LANE; ++t) {
                        const int d = lane + WARP * t;
                        if (d < HEAD_DIM) {
                            dv_acc[r][t] += p_i * do_s[i][d];
                            dk_acc[r][t] += ds_i * q_s[i][d];
                        }
                    }
                }
            }
        }
    }

    #pragma unroll

    for (int r = 0; r < BWD_ROWS; ++r) {
        const int key = k0 + warp * BWD_ROWS + r;
        if (key >= S) break;
        const long long out = (at.bh * S + key) * HEAD_DIM;
        #pragma unroll
        for (int t = 0; t < DIMS_PER_LANE; ++t) {
            const int d = lane + WARP * t;
            if (d < HEAD_DIM) {
                dk[out + d] = dk_acc[r][t] * scale;
                dv[out + d] = dv_acc[r][t];
            }
        }
    }
}
