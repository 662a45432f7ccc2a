// What the project's CUDA C needs from CUDA, supplied on the CPU so that g++ can compile the
// same .cu files and run their kernels here (emulated_cuda/build.py includes this header
// before the source; nothing in the .cu files changes for it).
//
// Every CUDA thread of a block is a fiber with its own stack (switched by emu_switch_to). The block's fibers
// run one at a time on this OS thread until each reaches a barrier (__syncthreads), a warp
// shuffle or its end; then the barrier or the shuffle is resolved and the fibers it frees
// resume in a seeded shuffled order. So:
//   - __syncthreads is a real barrier among the block's live (not exited) threads;
//   - a shuffle waits for every lane its mask names, and fails loudly when one of them has
//     exited, does not exist, or waits at a barrier instead (a deadlock on a GPU);
//   - a missing barrier lets a thread read shared memory another has not written yet, which
//     is poisoned (NaN bytes) before every block, so the results change;
//   - blocks run one after another, in a seeded shuffled order, each block's threads in
//     their own shuffled order;
//   - an index past a local or __shared__ array traps (g++'s -fsanitize=bounds) and is
//     reported, as is an integer division by zero.
// Static __shared__ variables live in one linker section, poisoned before each block. The
// launch runs with the SSE unit flushing denormals to zero (FTZ and DAZ), as CuPy compiles
// every kernel with -ftz=true. A fault (an access past a device buffer, whose end the
// buffer allocator puts flush against a guard page; a fiber's stack overflow) is caught on
// an alternate signal stack and reported with its address, so the launcher can name the
// buffer. One launch at a time per process (the Python side holds a lock).
#pragma once

#if !defined(__linux__) || !defined(__x86_64__)
#error "cuda_emulation.h: the emulated GPU runs on Linux x86-64 (ucontext, SSE's FTZ/DAZ)"
#endif

#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <xmmintrin.h>

#include <type_traits>
#include <utility>

#define MINITORCH_EMULATED_CUDA 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __shared__ static __attribute__((section("emu_shared"), aligned(16)))

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
typedef dim3 uint3;

namespace emu {

enum State { RUNNABLE, AT_BARRIER, AT_SHUFFLE, EXITED };
enum Shuffle { SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_XOR };

struct Fiber {
    void* sp;  // its stack pointer while switched out (switch_to saved its registers there)
    dim3 thread_idx;
    int linear;  // threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)
    State state;
    // a pending shuffle: what this lane offers, asks for, and is given
    unsigned long long offered, result;
    unsigned int mask;
    int kind, operand, width;
    const char* where;  // the intrinsic, for reports
};

// What the Python side passes in and reads back (emulated_cuda/launch.py's Launch).
struct Launch {
    unsigned int grid[3], block[3];
    unsigned long long seed;
    // out: 0 ok, 1 an error (message), 2 a fault (fault_signal, fault_address, fault_write)
    int status;
    int fault_signal;
    int fault_write;
    unsigned long long fault_address;
    unsigned int fault_block[3], fault_thread[3];
    char message[2048];
};

inline dim3 block_idx, block_dim, grid_dim;
inline Fiber* volatile current = nullptr;  // volatile: reloaded after every switch
inline void* scheduler_sp = nullptr;  // the scheduler's stack pointer while a fiber runs
inline Launch* launch_state = nullptr;
inline void (*body)(void**) = nullptr;
inline void** body_args = nullptr;
inline Fiber* fibers = nullptr;
inline int fiber_count = 0, fiber_capacity = 0;
inline char* stacks = nullptr;
inline const size_t STACK_BYTES = 256 * 1024;  // per fiber, a guard page below it
inline sigjmp_buf fault_return;
inline bool failed = false;
inline unsigned long long rng_state = 1;

inline unsigned long long next_random() {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

inline void report(const char* format, ...) {
    if (failed) return;  // the first error is the one reported
    failed = true;
    launch_state->status = 1;
    int used = snprintf(launch_state->message, sizeof launch_state->message,
                        "block (%u, %u, %u): ", block_idx.x, block_idx.y, block_idx.z);
    va_list args;
    va_start(args, format);
    vsnprintf(launch_state->message + used, sizeof launch_state->message - used, format, args);
    va_end(args);
}

// A switch between stacks without a system call. swapcontext saves and restores the signal
// mask on every switch (rt_sigprocmask, a system call each way), which made a launch of
// 131,072 threads with a few barriers take most of a second; every fiber here runs with
// the same mask, so only the registers a called function must preserve (System V x86-64:
// rbx, rbp, r12 to r15) are pushed on the old stack, its rsp saved to *save, and the
// same popped from the new stack, whose ret resumes it. MXCSR (FTZ/DAZ) is the same for
// every fiber. A new fiber's stack is laid out as such a save, returning into fiber_entry.
extern "C" void emu_switch_to(void** save, void* load);
asm(".text\n"
    ".globl emu_switch_to\n"
    ".hidden emu_switch_to\n"
    ".type emu_switch_to, @function\n"
    "emu_switch_to:\n"
    "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n"
    "    pushq %r13\n    pushq %r14\n    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n    popq %r14\n    popq %r13\n"
    "    popq %r12\n    popq %rbx\n    popq %rbp\n"
    "    ret\n"
    ".size emu_switch_to, .-emu_switch_to\n");

// A switch to the scheduler: every thread's writes to shared and global memory are made
// before it and read again after it (the compiler barriers say so, whatever it could
// prove about swapcontext).
inline void yield_to_scheduler() {
    Fiber* self = current;
    asm volatile("" ::: "memory");
    emu_switch_to(&self->sp, scheduler_sp);
    asm volatile("" ::: "memory");
}

// An error inside a kernel: recorded, and this thread never runs again.
[[noreturn]] inline void fail_here(const char* format, const char* detail) {
    Fiber* self = current;
    report(format, self->thread_idx.x, self->thread_idx.y, self->thread_idx.z, detail);
    self->state = EXITED;
    emu_switch_to(&self->sp, scheduler_sp);
    __builtin_unreachable();
}

// Where a new fiber's first switch returns to; it never returns itself (an exited fiber is
// never switched to again).
[[noreturn]] inline void fiber_entry() {
    body(body_args);
    current->state = EXITED;
    emu_switch_to(&current->sp, scheduler_sp);
    __builtin_unreachable();
}

// A fresh fiber on stack i: six zeroed callee-saved registers and fiber_entry as the
// return address, 16 bytes below the top, so that fiber_entry starts with rsp = 8 mod 16
// as after a call.
inline void* new_fiber_stack(char* stack) {
    void** top = (void**)(stack + STACK_BYTES - 16);
    top[0] = (void*)&fiber_entry;
    void** sp = top - 6;
    for (int r = 0; r < 6; ++r) sp[r] = nullptr;
    return sp;
}

inline void fault_handler(int signal, siginfo_t* info, void* raw) {
    Launch* l = launch_state;
    l->status = 2;
    l->fault_signal = signal;
    l->fault_address = (unsigned long long)(uintptr_t)info->si_addr;
#if defined(__x86_64__)
    l->fault_write = (int)((((ucontext_t*)raw)->uc_mcontext.gregs[REG_ERR] & 2) != 0);
#else
    (void)raw;
    l->fault_write = -1;
#endif
    memcpy(l->fault_block, &block_idx, sizeof l->fault_block);
    if (current) memcpy(l->fault_thread, (const void*)&current->thread_idx,
                        sizeof l->fault_thread);
    siglongjmp(fault_return, 1);
}

inline bool grow_fibers(int count) {
    if (count <= fiber_capacity) return true;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (stacks) munmap(stacks, (size_t)fiber_capacity * (STACK_BYTES + page));
    delete[] fibers;
    fibers = new Fiber[count];
    void* memory = mmap(nullptr, (size_t)count * (STACK_BYTES + page), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) {
        stacks = nullptr;
        fiber_capacity = 0;
        return false;
    }
    stacks = (char*)memory;
    for (int i = 0; i < count; ++i)  // a guard page below each stack: an overflow faults
        mprotect(stacks + (size_t)i * (STACK_BYTES + page), page, PROT_NONE);
    fiber_capacity = count;
    return true;
}

inline char* stack_of(int i) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return stacks + (size_t)i * (STACK_BYTES + page) + page;
}

inline void shuffle_order(int* order, int n) {
    for (int i = n - 1; i > 0; --i) {
        const int j = (int)(next_random() % (unsigned long long)(i + 1));
        std::swap(order[i], order[j]);
    }
}

inline const char* state_name(State s) {
    switch (s) {
        case RUNNABLE: return "running";
        case AT_BARRIER: return "waiting at __syncthreads";
        case AT_SHUFFLE: return "waiting at a shuffle";
        default: return "exited";
    }
}

// The lane a shuffle of `f` (lane `lane` of its warp) reads, by CUDA's rules: within its
// segment of `width` lanes; up/down past the segment's edge, or xor into a later segment,
// read the lane's own value. The operand's low 5 bits count, as PTX's shfl takes them.
inline int source_lane(const Fiber& f, int lane) {
    const int base = lane & ~(f.width - 1), operand = f.operand & 31;
    switch (f.kind) {
        case SHFL_IDX: return base + (operand & (f.width - 1));
        case SHFL_UP: return lane - base >= operand ? lane - operand : lane;
        case SHFL_DOWN: return lane - base + operand < f.width ? lane + operand : lane;
        default: {
            const int other = lane ^ operand;
            return other >= base + f.width ? lane : other;
        }
    }
}

// Resolve every warp whose waiting lanes have all arrived: true if a lane was freed.
// Fails (returns false with `failed` set) on a mask naming a lane that cannot come.
inline bool resolve_shuffles(int threads) {
    bool freed = false;
    for (int first = 0; first < threads; first += 32) {
        const int lanes = threads - first < 32 ? threads - first : 32;
        for (int lane = 0; lane < lanes; ++lane) {
            Fiber& f = fibers[first + lane];
            if (f.state != AT_SHUFFLE) continue;
            bool ready = true;
            for (int other = 0; other < 32 && ready; ++other) {
                if (!(f.mask >> other & 1u)) continue;
                if (other >= lanes) {
                    report("thread (%d, %d, %d): %s with mask 0x%08x names lane %d, past the "
                           "block's last thread (%d threads)", f.thread_idx.x, f.thread_idx.y,
                           f.thread_idx.z, f.where, f.mask, other, threads);
                    return false;
                }
                const Fiber& g = fibers[first + other];
                if (g.state == EXITED) {
                    report("thread (%d, %d, %d): %s with mask 0x%08x waits for lane %d, which "
                           "has exited", f.thread_idx.x, f.thread_idx.y, f.thread_idx.z,
                           f.where, f.mask, other);
                    return false;
                }
                if (g.state != AT_SHUFFLE) ready = false;
            }
            if (!ready) continue;
            // every lane of the mask is here: each reads its source's offer
            for (int other = 0; other < lanes; ++other) {
                Fiber& g = fibers[first + other];
                if (!(f.mask >> other & 1u)) continue;
                if (g.mask != f.mask) {
                    report("thread (%d, %d, %d): %s with mask 0x%08x meets lane %d's mask "
                           "0x%08x", f.thread_idx.x, f.thread_idx.y, f.thread_idx.z, f.where,
                           f.mask, other, g.mask);
                    return false;
                }
                const int source = source_lane(g, other);
                if (!(f.mask >> source & 1u)) {
                    report("thread (%d, %d, %d): %s reads lane %d, which its mask 0x%08x "
                           "leaves out", g.thread_idx.x, g.thread_idx.y, g.thread_idx.z,
                           g.where, source, g.mask);
                    return false;
                }
                g.result = fibers[first + source].offered;
            }
            for (int other = 0; other < lanes; ++other)
                if (f.mask >> other & 1u) fibers[first + other].state = RUNNABLE;
            freed = true;
        }
    }
    return freed;
}

inline void run_block(int threads) {
    for (int i = 0; i < threads; ++i) {
        Fiber& f = fibers[i];
        f.linear = i;
        f.thread_idx.x = (unsigned)(i % (int)block_dim.x);
        f.thread_idx.y = (unsigned)(i / (int)block_dim.x % (int)block_dim.y);
        f.thread_idx.z = (unsigned)(i / (int)(block_dim.x * block_dim.y));
        f.state = RUNNABLE;
        f.sp = new_fiber_stack(stack_of(i));
    }
    int* order = new int[threads];
    for (;;) {
        int n = 0;
        for (int i = 0; i < threads; ++i)
            if (fibers[i].state == RUNNABLE) order[n++] = i;
        if (n) {
            shuffle_order(order, n);
            for (int k = 0; k < n && !failed; ++k) {
                Fiber* f = &fibers[order[k]];
                if (f->state != RUNNABLE) continue;
                current = f;
                emu_switch_to(&scheduler_sp, f->sp);
                current = nullptr;
            }
            if (failed) break;
            continue;
        }
        if (resolve_shuffles(threads)) continue;
        if (failed) break;
        int live = 0, waiting = 0;
        for (int i = 0; i < threads; ++i) {
            live += fibers[i].state != EXITED;
            waiting += fibers[i].state == AT_BARRIER;
        }
        if (!live) break;
        if (waiting == live) {
            for (int i = 0; i < threads; ++i)
                if (fibers[i].state == AT_BARRIER) fibers[i].state = RUNNABLE;
            continue;
        }
        // nothing can move: name a thread at a shuffle and what its mask waits for
        for (int i = 0; i < threads; ++i) {
            const Fiber& f = fibers[i];
            if (f.state != AT_SHUFFLE) continue;
            const int first = i - i % 32;
            for (int other = 0; other < 32; ++other) {
                if (!(f.mask >> other & 1u)) continue;
                const Fiber& g = fibers[first + other];
                if (g.state != AT_SHUFFLE) {
                    report("deadlock: thread (%d, %d, %d) waits at %s for lane %d, which is "
                           "%s (%d of %d live threads wait at __syncthreads)", f.thread_idx.x,
                           f.thread_idx.y, f.thread_idx.z, f.where, other,
                           state_name(g.state), waiting, live);
                    break;
                }
            }
            break;
        }
        report("deadlock: %d of %d live threads wait at __syncthreads", waiting, live);
        break;
    }
    delete[] order;
}

// The shared-memory section: every __shared__ variable of the module, poisoned per block.
extern "C" char __start_emu_shared[] __attribute__((visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((visibility("hidden")));
// The section's own variable, which also gives it a start and an end in a module without
// __shared__ arrays. g++ lays a section's variables out in reverse order of definition, so
// this one, defined before the kernels, lands after their arrays: 4 KiB poisoned with
// them before every block, so a read one row past the last array (an address g++'s bounds
// check allows) finds NaN rather than whatever follows the section.
static char shared_guard[4096] __attribute__((section("emu_shared"), used, aligned(16))) = {1};

inline void launch(Launch* l, void (*run)(void**), void** args) {
    launch_state = l;
    l->status = 0;
    l->message[0] = 0;
    failed = false;
    body = run;
    body_args = args;
    block_dim = dim3{l->block[0], l->block[1], l->block[2]};
    grid_dim = dim3{l->grid[0], l->grid[1], l->grid[2]};
    const int threads = (int)(block_dim.x * block_dim.y * block_dim.z);
    if (!grow_fibers(threads)) {
        report("could not map stacks for %d threads", threads);
        return;
    }
    // faults land on a stack of their own (a fiber's may be the one that overflowed)
    static char alternate[1 << 16];
    stack_t alt = {}, old_alt = {};
    alt.ss_sp = alternate;
    alt.ss_size = sizeof alternate;
    sigaltstack(&alt, &old_alt);
    struct sigaction action = {}, old_segv = {}, old_bus = {}, old_fpe = {};
    action.sa_sigaction = fault_handler;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &old_segv);
    sigaction(SIGBUS, &action, &old_bus);
    sigaction(SIGFPE, &action, &old_fpe);  // an integer division by zero
    struct sigaction old_ill = {};
    sigaction(SIGILL, &action, &old_ill);  // -fsanitize=bounds's trap: an index past an array
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);  // FTZ | DAZ: -ftz=true
    // the blocks in a seeded shuffled order (up to 2^22 of them; past that, in order), so
    // a block that writes into a neighbour's output is caught whichever runs last
    const unsigned long long blocks =
        (unsigned long long)grid_dim.x * grid_dim.y * grid_dim.z;
    unsigned long long* order = nullptr;
    if (blocks <= (1ull << 22)) {
        order = new unsigned long long[blocks];
        for (unsigned long long b = 0; b < blocks; ++b) order[b] = b;
        rng_state = (l->seed + 1) * 0xD1B54A32D192ED03ull;
        for (unsigned long long b = blocks - 1; b > 0; --b)
            std::swap(order[b], order[next_random() % (b + 1)]);
    }
    if (sigsetjmp(fault_return, 1) == 0) {
        for (unsigned long long b = 0; b < blocks && !failed; ++b) {
            const unsigned long long linear = order ? order[b] : b;
            const unsigned x = (unsigned)(linear % grid_dim.x);
            const unsigned y = (unsigned)(linear / grid_dim.x % grid_dim.y);
            const unsigned z = (unsigned)(linear / ((unsigned long long)grid_dim.x * grid_dim.y));
            block_idx = dim3{x, y, z};
            rng_state = (l->seed + 1) * 0x9E3779B97F4A7C15ull ^
                        ((unsigned long long)x << 32 | (y << 16) | z);
            if (!rng_state) rng_state = 1;
            memset(__start_emu_shared, 0xff, (size_t)(__stop_emu_shared - __start_emu_shared));
            run_block(threads);
        }
    }
    delete[] order;
    current = nullptr;
    _mm_setcsr(csr);
    sigaction(SIGSEGV, &old_segv, nullptr);
    sigaction(SIGBUS, &old_bus, nullptr);
    sigaction(SIGFPE, &old_fpe, nullptr);
    sigaction(SIGILL, &old_ill, nullptr);
    sigaltstack(&old_alt, nullptr);
}

// --- the kernel's C signature, as the compiler sees it ------------------------------------
template <typename T>
void describe_type(char* out) {
    // kind: f float, i signed, u unsigned, b bool, s anything else (a struct); then bytes
    using U = std::remove_cv_t<T>;
    const char kind = std::is_same_v<U, bool> ? 'b'
                      : std::is_floating_point_v<U> ? 'f'
                      : std::is_integral_v<U> && std::is_signed_v<U> ? 'i'
                      : std::is_integral_v<U> ? 'u' : 's';
    snprintf(out, 16, "%c%zu", kind, sizeof(U));
}

template <typename A>
void describe_parameter(char*& cursor) {
    if constexpr (std::is_pointer_v<A>) {
        using P = std::remove_pointer_t<A>;
        *cursor++ = 'p';
        if (std::is_const_v<P>) *cursor++ = 'c';
        describe_type<P>(cursor);
    } else {
        describe_type<A>(cursor);
    }
    cursor += strlen(cursor);
    *cursor++ = ',';
    *cursor = 0;
}

template <typename... A>
const char* signature(void (*)(A...)) {
    static char text[512];
    char* cursor = text;
    *cursor = 0;
    (describe_parameter<A>(cursor), ...);
    if (cursor > text) cursor[-1] = 0;
    return text;
}

template <typename... A, size_t... I>
void call_with(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

template <typename... A>
constexpr size_t arity(void (*)(A...)) { return sizeof...(A); }

// __launch_bounds__'s most threads per block: its first argument, whatever macro brought
// the second (a minimum of resident blocks, for the register allocator)
template <typename... Rest>
constexpr long first_of(long threads, Rest...) { return threads; }

}  // namespace emu

// --- CUDA's built-in variables and intrinsics ---------------------------------------------
#define threadIdx (::emu::current->thread_idx)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)
#define warpSize 32

inline void __syncthreads() {
    ::emu::Fiber* self = ::emu::current;
    self->state = ::emu::AT_BARRIER;
    ::emu::yield_to_scheduler();
}

namespace emu {
template <typename T>
inline T shuffle(const char* where, unsigned int mask, T value, int kind, int operand,
                 int width) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 8 bytes");
    Fiber* self = current;
    if (width < 1 || width > 32 || (width & (width - 1)))
        fail_here("thread (%d, %d, %d): %s with width that is not a power of two up to 32",
                  where);
    if (!(mask >> (self->linear % 32) & 1u))
        fail_here("thread (%d, %d, %d): %s from a lane its own mask leaves out", where);
    self->offered = 0;
    memcpy(&self->offered, &value, sizeof(T));
    self->mask = mask;
    self->kind = kind;
    self->operand = operand;
    self->width = width;
    self->where = where;
    self->state = AT_SHUFFLE;
    yield_to_scheduler();
    T out;
    memcpy(&out, &current->result, sizeof(T));
    return out;
}
}  // namespace emu

template <typename T>
inline T __shfl_sync(unsigned int mask, T value, int lane, int width = 32) {
    return ::emu::shuffle("__shfl_sync", mask, value, ::emu::SHFL_IDX, lane, width);
}
template <typename T>
inline T __shfl_up_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
    return ::emu::shuffle("__shfl_up_sync", mask, value, ::emu::SHFL_UP, (int)delta, width);
}
template <typename T>
inline T __shfl_down_sync(unsigned int mask, T value, unsigned int delta, int width = 32) {
    return ::emu::shuffle("__shfl_down_sync", mask, value, ::emu::SHFL_DOWN, (int)delta, width);
}
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask, int width = 32) {
    return ::emu::shuffle("__shfl_xor_sync", mask, value, ::emu::SHFL_XOR, lane_mask, width);
}

constexpr float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
constexpr float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
constexpr int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
constexpr unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
// CUDA's device min and max: overloads by type (mixed int widths promote, as CUDA's do)
#define EMU_MIN_MAX(T)                                              \
    inline T min(T a, T b) { return a < b ? a : b; }                \
    inline T max(T a, T b) { return a < b ? b : a; }
EMU_MIN_MAX(int)
EMU_MIN_MAX(unsigned int)
EMU_MIN_MAX(long long)
EMU_MIN_MAX(unsigned long long)
inline long long min(int a, long long b) { return min((long long)a, b); }
inline long long min(long long a, int b) { return min(a, (long long)b); }
inline long long max(int a, long long b) { return max((long long)a, b); }
inline long long max(long long a, int b) { return max(a, (long long)b); }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
#undef EMU_MIN_MAX
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

// One exported trio per kernel (build.py writes an EMU_KERNEL line for each): its launch,
// its signature as "pcf4,pf4,i8,i4" (pointer, const, kind, bytes), and __launch_bounds__.
#define EMU_KERNEL(name, ...)                                                               \
    extern "C" __attribute__((visibility("default"))) void emu_launch_##name(              \
        ::emu::Launch* l, void** args) {                                                    \
        ::emu::launch(l, [](void** a) {                                                     \
            ::emu::call_with(name, a, std::make_index_sequence<::emu::arity(name)>{});     \
        }, args);                                                                           \
    }                                                                                       \
    extern "C" __attribute__((visibility("default"))) const char* emu_signature_##name() {  \
        return ::emu::signature(name);                                                      \
    }                                                                                       \
    extern "C" __attribute__((visibility("default"))) long emu_bounds_##name() {           \
        return ::emu::first_of(__VA_ARGS__);                                                \
    }
