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
};

struct clemu_thread {          // one CUDA thread of the running block
    uint3 idx;
    const clemu_block* blk;
    int linear;                // x + y*bx + z*bx*by
};

// A buffer argument as the launcher passes it: base pointer and size in bytes.
struct clemu_buf { void* p; long long nbytes; };

// The runtime is built with hidden symbols and loaded RTLD_LOCAL (its C++ internals must not
// interpose on other libraries, e.g. pybind11 in matplotlib); what kernels call is exported here.
#pragma GCC visibility push(default)
extern thread_local clemu_thread* clemu_cur;

extern "C" {
void clemu_syncthreads(const char* file, int line);
int clemu_syncthreads_reduce(int pred, int op, const char* file, int line);   // op: 0 count, 1 and, 2 or
unsigned long long* clemu_warp_exchange(unsigned mask, unsigned long long value, const char* file, int line);
unsigned clemu_activemask();
[[noreturn]] void clemu_fault_oob(int arg, long long elem, long long n_elems, long long elem_size);
[[noreturn]] void clemu_fault(int kind, const char* fmt, ...);
[[noreturn]] void clemu_fault_shared(const char* name, long long elem, long long n_elems, long long elem_size);
void clemu_printf(const char* fmt, ...);
}
#pragma GCC visibility pop

enum clemu_status {
    CLEMU_OK = 0, CLEMU_FAULT = 1, CLEMU_BARRIER = 2, CLEMU_OOB = 3, CLEMU_TIMEOUT = 4,
    CLEMU_SEGV = 5, CLEMU_ASSERT = 6, CLEMU_FPE = 7, CLEMU_STACK = 8, CLEMU_LAUNCH = 9,
};
