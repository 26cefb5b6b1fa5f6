// clemu_profile.h — the emulator's profiler (profile.cpp): it groups each warp's memory accesses
// into requests and counts them as Nsight Compute does. A request is one access site's (a load or
// store in the source) execution by the lanes of one warp in one iteration of the loops around
// it, between two barriers.
// Only linked into a launch that cl.profile asked for; plain launches never call it.
#pragma once

enum clprof_kind {            // what an access site does
    CLPROF_GLOBAL_LD = 0, CLPROF_GLOBAL_ST = 1, CLPROF_SHARED_LD = 2, CLPROF_SHARED_ST = 3,
    CLPROF_GLOBAL_ATOM = 4, CLPROF_SHARED_ATOM = 5, CLPROF_CONST_LD = 6,
};

enum clprof_counter {         // per site and in total; convlab/profile.py names them after ncu's metrics
    CLPROF_GLD_REQ, CLPROF_GLD_SECT, CLPROF_GST_REQ, CLPROF_GST_SECT,
    CLPROF_SLD_REQ, CLPROF_SLD_WAVE, CLPROF_SLD_CONFL, CLPROF_SST_REQ, CLPROF_SST_WAVE, CLPROF_SST_CONFL,
    CLPROF_GATOM_REQ, CLPROF_SATOM_REQ, CLPROF_BARRIER,
    CLPROF_CLD_REQ, CLPROF_CLD_ADDR,   // __constant__ reads: requests, and the distinct addresses they read
    CLPROF_N_COUNTERS,
};

// One access of a traced block (cl.trace), as clprof_trace_take hands it to Python.
struct clprof_trace_rec {
    unsigned long long addr, loop, epoch;  // epoch: the worker's count of barriers and block ends so far
    long long offset, elem, size;          // bytes from the start of its array or buffer (-1: none); its element
                                           // size (0: unknown); the array's or buffer's bytes
    int block, thread, kind, site, bytes;  // block: index into the blocks asked for; kind: clprof_kind
    int array;                             // its name's index (clprof_trace_array)
};

// The runtime's answer (runtime.cpp) for an access of the running CUDA thread: its blockIdx, and
// where the address lies: the buffer argument's or static __shared__ array's name (nullptr: extern
// __shared__ memory, or none), its start, element size (0: unknown) and size in bytes. Returns 0 outside a block.
// Weak: profile.cpp compiled alone (count_trace) has no runtime.
extern "C" int clemu_trace_place(const void* addr, unsigned* block, const char** name, const char** lo,
                                 long long* elem, long long* size) __attribute__((weak));

// Called from Python (ctypes) too: exported although the runtime hides its other symbols.
#pragma GCC visibility push(default)
extern "C" {
// A site's id: the same key (the accessing instruction's address in the kernel's code) and kind
// always give the same id.
int clprof_site(unsigned long long key, int kind);
// One thread's access: its linear index in the block, the site, the address and size in bytes,
// and which iteration of which loops the thread was in (0: none; cuda_emu.h's loop tag).
void clprof_access(int thread, int site, const void* addr, int bytes, unsigned long long loop);
// The emulator's per-access hook (op bits as clemu_abi.h's CLEMU_RD/WR/ATOM/SHARED; pc: the
// accessing instruction, which names the site).
void clprof_hook(unsigned op, const void* addr, unsigned bytes, const void* pc, int thread, unsigned long long loop);
// The block's threads all reached a barrier (or the block ended): group what they did since the
// last one into requests. n_threads: the block's size. barrier: 1 at a __syncthreads().
void clprof_epoch(int n_threads, int barrier);
// Start counting afresh (before a launch).
void clprof_reset();
// Totals of every worker into out[CLPROF_N_COUNTERS]; returns the number of sites.
int clprof_totals(long long* out);
// One site's key, kind and counters; returns 0 when there is no such site.
int clprof_site_info(int site, unsigned long long* key, int* kind, long long* out);
// Where a site is, as the runtime's {{site:MODULE+OFFSET}} token (convlab.emu.resolve_sites turns
// it into a source line); returns 0 when the key is no address in a loaded module.
int clprof_site_where(int site, char* buf, int cap);
// The trace: record every access of these n blocks (xyz: 3n blockIdx values; n = 0: none) in the
// launches that follow, forgetting what was recorded before.
void clprof_trace_blocks(const unsigned* xyz, int n);
// Copy up to cap records to out (out may be null); returns how many there are.
long long clprof_trace_take(clprof_trace_rec* out, long long cap);
// Name i of the trace's arrays into buf; -1 when there is no such name.
int clprof_trace_array(int i, char* buf, int cap);
}
#pragma GCC visibility pop
