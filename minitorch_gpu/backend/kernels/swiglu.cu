// SwiGLU's gating, Llama's MLP: out = silu(gate) * up, elementwise over n values, forward
// and backward. With s = sigmoid(gate):
//
//   forward:  out = gate * s * up
//   backward: dgate = dy * up * s * (1 + gate * (1 - s)),   dup = dy * gate * s
//
// s is computed stably, as ops/_util.py's sigmoid_into: exp(min(g, 0)) / (1 + exp(-|g|)),
// so exp never overflows and the tail keeps its relative accuracy. The backward recomputes
// s from gate (gate and up are what the op saves).
//
// Storage. gate, up, out and dy are INPUT_DTYPE (0: float32, 1: bfloat16; one module per
// dtype), widened to float32 as they are loaded; out is rounded once to the storage type
// (bf16: to nearest, ties to even); dgate and dup are float32. The launcher hands the
// kernels contiguous arrays (a strided gate or up, such as a half of a fused gate/up
// projection, is copied once).
//
// Parallel decomposition: a grid-stride loop, one element per thread per step;
// grid: min(ceil(n / 256), 65536) blocks of 256 threads (chosen by the caller).
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

// the storage type of gate, up, out and dy
#if INPUT_DTYPE == 0
typedef float input_t;
#elif INPUT_DTYPE == 1
typedef bf16_bits input_t;
#else
#error "swiglu.cu: INPUT_DTYPE must be 0 (float32) or 1 (bfloat16)"
#endif

#define SWIGLU_THREADS 256

// sigmoid(g) = exp(min(g, 0)) / (1 + exp(-|g|)), for either sign without overflow.
__device__ __forceinline__ float stable_sigmoid(float g) {
    return expf(fminf(g, 0.0f)) / (1.0f + expf(-fabsf(g)));
}

// gate, up, out: (n,).
extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_forward(const input_t* __restrict__ gate, const input_t* __restrict__ up,
               input_t* __restrict__ out, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = to_float(gate[i]);
        store(&out[i], g * stable_sigmoid(g) * to_float(up[i]));
    }
}

// dy, gate, up: (n,); dgate, dup: (n,) float32 outputs.
extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_backward(const input_t* __restrict__ dy, const input_t* __restrict__ gate,
                const input_t* __restrict__ up, float* __restrict__ dgate,
                float* __restrict__ dup, long long n)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float g = to_float(gate[i]), u = to_float(up[i]), d = to_float(dy[i]);
        const float s = stable_sigmoid(g);
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
        dup[i] = d * g * s;
    }
}
