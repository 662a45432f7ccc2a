// Rotary position embedding (RoPE), Llama's rotate-half convention, elementwise over
// (B, T, H, D) heads: with half = D / 2, x1 = x[..., :half], x2 = x[..., half:] and the
// angle table cos, sin (T, half) of each position t,
//
//   out1 = x1 * cos - x2 * sin,   out2 = x2 * cos + x1 * sin
//
// The backward is the inverse rotation, the same with -sin (inverse = 1), applied to the
// output's gradient: a rotation's transpose is its inverse.
//
// Inputs, read where they are. x is given as a pointer and three strides in elements, its
// batch, position and head strides (x_batch, x_time, x_head); the last dim is contiguous.
// So q and k as (B, T, H, D) views of a fused (B, T, (H + 2 Hkv) D) projection are read
// in place, as attention.cu reads its strided heads; the launcher copies x only when its
// last dim is strided. out is a new contiguous (B, T, H, D) array. cos and sin are
// contiguous float32 (T, half).
//
// Storage. x and out are INPUT_DTYPE (0: float32, 1: bfloat16; one module per dtype),
// widened to float32 as they are loaded; the rotation is float32 and each output is
// rounded once to the storage type (bf16: to nearest, ties to even). Offsets are 64-bit.
//
// Parallel decomposition: one thread per (row, pair i), row = (b, t, h) of the B T H rows
// and i < half: it reads x1[i] and x2[i] of its row and cos[t][i], sin[t][i], and writes
// out1[i] and out2[i]. Consecutive threads take consecutive i of a row (coalesced), in a
// grid-stride loop over the B T H half pairs;
// grid: min(ceil(pairs / 256), 65536) blocks of 256 threads (chosen by the caller).
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

// the storage type of x and out
#if INPUT_DTYPE == 0
typedef float input_t;
#elif INPUT_DTYPE == 1
typedef bf16_bits input_t;
#else
#error "rotary.cu: INPUT_DTYPE must be 0 (float32) or 1 (bfloat16)"
#endif

#define ROTARY_THREADS 256

// x: (B, T, H, 2 half) strided; cos, sin: (T, half); out: (B, T, H, 2 half) contiguous.
// inverse: 1 for the backward's rotation by -angle.
extern "C" __global__ void __launch_bounds__(ROTARY_THREADS)
rotary_forward(const input_t* __restrict__ x, const float* __restrict__ cos_t,
               const float* __restrict__ sin_t, input_t* __restrict__ out, long long pairs,
               int T, int H, int half, int inverse, long long x_batch, long long x_time,
               long long x_head)
{
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < pairs;
         idx += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(idx % half);
        const long long row = idx / half;  // (b * T + t) * H + h
        const int h = (int)(row % H);
        const int t = (int)((row / H) % T);
        const long long b = row / ((long long)H * T);
        const input_t* x_row = x + b * x_batch + t * x_time + h * x_head;
        const float x1 = to_float(x_row[i]), x2 = to_float(x_row[half + i]);
        const float c = cos_t[(long long)t * half + i];
        const float s = inverse ? -sin_t[(long long)t * half + i]
                                : sin_t[(long long)t * half + i];
        input_t* out_row = out + row * (2LL * half);
        store(&out_row[i], x1 * c - x2 * s);
        store(&out_row[half + i], x2 * c + x1 * s);
    }
}
