// The few structures that the emulator runtime (runtime.cpp) and the kernel-side header
// (cuda_emu.h) share. Kept tiny and C-like: both sides are compiled separately.
#pragma once
#include <cstddef>

struct uint3 { unsigned int x, y, z; };
struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

struct clemu_block {           // the block a worker runs now
    uint3 idx;
    dim3 dim, grid;
    unsigned char* dyn_shared;
    long long dyn_bytes;       // the launch's shared= bytes
    unsigned long long serial; // unique per block run on this OS thread: static __shared__ arrays poison on a new one
};

struct clemu_thread {          // one CUDA thread of the running block
    uint3 idx;
    const clemu_block* blk;
    int linear;                // x + y*bx + z*bx*by
    unsigned long long loop;   // hooked builds: which iteration of which loops the thread is in (cuda_emu.h)
};

// A buffer argument as the launcher passes it: base pointer and size in bytes.
struct clemu_buf { void* p; long long nbytes; };

// The runtime is built with hidden symbols and loaded RTLD_LOCAL (its C++ internals must not
// interpose on other libraries, e.g. pybind11 in matplotlib); what kernels call is exported here.
#pragma GCC visibility push(default)
extern thread_local clemu_thread* clemu_cur;

// The per-access hook. Every element access that goes through a checked kernel pointer
// (clemu::ptr), a static or extern __shared__ array calls
//     clemu_access(op, addr, bytes, name, base)
// while clemu_hook_on is nonzero:
//   op    CLEMU_RD / CLEMU_WR (both for x[i] += v) or CLEMU_ATOM, plus CLEMU_SHARED for shared memory;
//         CLEMU_ANY where the space is not known (a local pointer: the runtime looks the address
//         up), CLEMU_COUNT for an access only the profiler sees (half and vector elements, local
//         pointers: the race detector checks the arithmetic elements of kernel pointers and arrays),
//         CLEMU_CONST (with CLEMU_COUNT) for a read of a __constant__ array
//   addr  the element's address; bytes its size
//   name  the shared array's name (nullptr for global memory: the runtime finds the buffer argument)
//   base  the start of that array or buffer, so index = (addr - base) / bytes
// The source site is the hook's return address (the instruction in the kernel that accessed);
// the thread and block are clemu_cur's. The race detector is one user; a profiler counting
// requests, sectors and bank conflicts per warp and per site can be another.
enum { CLEMU_RD = 1, CLEMU_WR = 2, CLEMU_ATOM = 4, CLEMU_SHARED = 8, CLEMU_ANY = 16, CLEMU_COUNT = 32, CLEMU_CONST = 64 };
enum { CLEMU_XCHG_REGS = 8 };

extern "C" {
extern int clemu_hook_on;
extern int clemu_count_on;     // the profiler counts this launch: CLEMU_COUNT accesses call the hook too
// nonzero: a static __shared__ index past its dimension but inside the array reads on into it, as
// a GPU does (the exercise checks show what such a read computes), instead of faulting
extern int clemu_flat_shared;
void clemu_syncthreads(const char* file, int line);
int clemu_syncthreads_reduce(int pred, int op, const char* file, int line);   // op: 0 count, 1 and, 2 or
unsigned long long* clemu_warp_exchange(unsigned mask, unsigned long long value, const char* file, int line);
unsigned clemu_activemask();
[[noreturn]] void clemu_fault_oob(int arg, long long elem, long long n_elems, long long elem_size);
[[noreturn]] void clemu_fault(int kind, const char* fmt, ...);
[[noreturn]] void clemu_fault_shared(const char* name, long long elem, long long n_elems, long long elem_size);
void clemu_printf(const char* fmt, ...);
void clemu_access(unsigned op, const volatile void* addr, unsigned bytes, const char* name, const void* base);
[[noreturn]] void clemu_fault_shared_index(const char* name, int dim, long long index, long long extent,
                                           const long long* prefix, int rank);
// A static __shared__ array the running block has opened (cuda_emu.h's shared_open): the runtime
// then knows which addresses are shared memory, and names them in messages.
void clemu_shared_region(const void* lo, long long bytes, long long elem_bytes, const char* name);
// The static __shared__ array that holds p (1), or none (0): its start, bytes and name. A local
// pointer made into one (cuda_emu.h's lptr) checks its elements against it, and faults with
// clemu_fault_shared_ptr (offset of the element from the array's start, in bytes).
int clemu_shared_span(const void* p, const char** lo, long long* bytes, const char** name);
[[noreturn]] void clemu_fault_shared_ptr(const char* name, long long offset, long long bytes, long long elem_bytes);
// A warp exchange of up to CLEMU_XCHG_REGS 32-bit registers per lane (mma's fragments): returns
// the slots, lane j's registers at [j * CLEMU_XCHG_REGS].
const unsigned* clemu_warp_exchange_regs(unsigned mask, const unsigned* regs, int n, const char* file, int line);
// Tensor-core instructions (clemu_tensor_core.h). Each names its source line by its return address.
//   ldmatrix: each lane whose row is used checks it before the warp's exchange (16-byte aligned,
//   inside shared memory, no cp.async in flight), and reads it for the hooks after the exchange.
void clemu_ldmatrix_check(const void* row, const char* what);
//   wmma: a pointer that is not 32-byte aligned, named as the array and offset it points into.
[[noreturn]] void clemu_wmma_misaligned(const void* p, int elem, const char* what, const char* file, int line);
void clemu_ldmatrix_hook(const void* row);
//   cp.async: the copy is checked and its source read at once, and lands at the wait that covers
//   it; until then its destination holds NaN bytes and any access to it is a fault.
void clemu_cp_async(void* dst, const void* src, int bytes, int full);
void clemu_cp_async_commit();
void clemu_cp_async_wait(int n);
}
#pragma GCC visibility pop

enum clemu_status {
    CLEMU_OK = 0, CLEMU_FAULT = 1, CLEMU_BARRIER = 2, CLEMU_OOB = 3, CLEMU_TIMEOUT = 4,
    CLEMU_SEGV = 5, CLEMU_ASSERT = 6, CLEMU_FPE = 7, CLEMU_STACK = 8, CLEMU_LAUNCH = 9, CLEMU_RACE = 10,
    CLEMU_INTERRUPT = 11, CLEMU_WARP = 12,
};
