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

// The emulator's CUtensorMap (a kernel's `const __grid_constant__ CUtensorMap` parameter, passed by
// value): the fields of cuTensorMapEncodeTiled, as EmuBackend.encode_tensor_map packs them
// (convlab/emu/__init__.py), 128 bytes and 64-byte aligned like the driver's.
enum { CLEMU_TMAP_MAGIC = 0x4D544C43 };   // "CLTM"
struct alignas(64) clemu_tensor_map {
    unsigned magic;
    int dtype;                   // CUtensorMapDataType: 0 uint8, 6 float16, 7 float32, 9 bfloat16
    int rank;                    // 1 to 5
    int swizzle;                 // 0 none, 1 32B, 2 64B, 3 128B
    unsigned long long addr;     // the tensor's first element
    long long dims[5];           // elements, innermost first
    long long strides[4];        // bytes between consecutive indices of dims[1..]
    unsigned box[5];             // the box one copy fetches, elements, innermost first
    unsigned elem_bytes;
    unsigned char elem_strides[5];   // the traversal step of each dimension (1 to 8; 0 reads as 1), innermost first
    unsigned char reserved[3];
};
static_assert(sizeof(clemu_tensor_map) == 128, "a CUtensorMap is 128 bytes");

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
// What a wgmma leaves in its accumulators until the wgmma_wait that covers it delivers the result:
// a signalling NaN, so arithmetic on it traps (the runtime unmasks the invalid-operation exception
// while the thread has a wgmma in flight) and a conversion to half names the line (cuda_fp16.h).
enum : unsigned { CLEMU_WGMMA_POISON = 0x7FA0DEADu };
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
// Memory a kernel header hands the kernel as its own (the guard, convlab/emu/guard.cpp, checks every
// load and store of a kernel against what its launch owns).
void clemu_own(const void* p, long long bytes);
// A load or store of `bytes` at p, which is not `align`-aligned (a vector through a cast pointer).
[[noreturn]] void clemu_fault_misaligned(const void* p, int align, int bytes);
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
// Hopper's asynchronous path (clemu_hopper.h). file and line: the kernel's call.
//   a shared-memory matrix descriptor of a 128-byte-swizzled K-major tile (the emulator's encoding:
//   bits 0-13 the start's offset >> 4 inside its shared array, 16-29 LBO, 32-45 SBO, 52-61 which
//   array, 62-63 the layout, so `desc + 2` is 32 bytes further, as on a GPU)
unsigned long long clemu_smem_desc(const void* tile, const char* file, int line);
//   the same for any layout the emulator models (layout 1: the 128-byte swizzle, 0: none), with
//   its leading and stride byte offsets (which operand major-ness reads it: the wgmma's kind)
unsigned long long clemu_smem_desc_any(const void* tile, int layout, unsigned lbo, unsigned sbo, const char* file,
                                       int line);
//   warpgroup instructions (.sync.aligned: all 128 threads of a warpgroup execute them together)
enum { CLEMU_WG_FENCE = 0, CLEMU_WG_COMMIT = 1, CLEMU_WG_WAIT = 2, CLEMU_WG_SETMAXNREG = 3 };
void clemu_wg_op(int op, int arg, const char* file, int line);
//   kind: the operands' type (CLEMU_WG_F16, CLEMU_WG_BF16) | CLEMU_WG_TRANS_A | CLEMU_WG_TRANS_B
//   (imm-trans-a/b: A M-major, B N-major in shared memory)
enum { CLEMU_WG_F16 = 0, CLEMU_WG_BF16 = 1, CLEMU_WG_TRANS_A = 4, CLEMU_WG_TRANS_B = 8 };
void clemu_wgmma(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int accumulate, int kind,
                 const char* file, int line);
void clemu_wgmma_tf32(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int accumulate,
                      const char* file, int line);
//   mbarriers and the copy engine
void clemu_mbar_init(void* bar, unsigned count, const char* file, int line);
void clemu_fence_mbar_init(const char* file, int line);
void clemu_mbar_arrive(void* bar, unsigned tx_bytes, int expect_tx, const char* file, int line);
void clemu_mbar_wait(void* bar, unsigned parity, const char* file, int line);
void clemu_fence_proxy_async(const char* file, int line);
void clemu_tma_load(void* dst, const clemu_tensor_map* map, void* bar, const int* coords, int rank, const char* file,
                    int line);
//   TMA stores (read shared memory at issue, write the tensor at once) and their bulk groups:
//   op 0 commit_group, op 1 wait_group.read n
void clemu_tma_store(const void* src, const clemu_tensor_map* map, const int* coords, int rank, const char* file,
                     int line);
void clemu_bulk_op(int op, int n, const char* file, int line);
//   bar.sync id, threads: a barrier of `threads` threads (whole warps), ids 1..15
void clemu_named_barrier(int id, int threads, const char* file, int line);
//   a float -> half conversion met a wgmma accumulator's poison (read before the wait that covers it)
[[noreturn]] void clemu_poison_read();
}
#pragma GCC visibility pop

enum clemu_status {
    CLEMU_OK = 0, CLEMU_FAULT = 1, CLEMU_BARRIER = 2, CLEMU_OOB = 3, CLEMU_TIMEOUT = 4,
    CLEMU_SEGV = 5, CLEMU_ASSERT = 6, CLEMU_FPE = 7, CLEMU_STACK = 8, CLEMU_LAUNCH = 9, CLEMU_RACE = 10,
    CLEMU_INTERRUPT = 11, CLEMU_WARP = 12,
};
