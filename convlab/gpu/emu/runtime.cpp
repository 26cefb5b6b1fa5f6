// convlab's CPU emulator runtime: runs a CUDA grid on the CPU.
//
// Blocks are spread over a pool of OS threads. All CUDA threads of one block run on one OS
// thread: as a plain loop when the kernel has no barrier, otherwise as fibers that switch
// only at __syncthreads() and warp operations. A fiber never moves to another OS thread,
// because compilers cache the addresses of thread_local variables (__shared__ is one).
// The context switch is hand-written: ucontext's swapcontext makes a system call per switch
// (about 20x slower). Faults (out-of-range access, broken barrier, timeout, segfault) stop
// the launch with a message; the host process always survives.
#include "clemu_abi.h"
#include "clemu_profile.h"
#include "clemu_mma_numerics.h"
#include "guard.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <mutex>
#include <condition_variable>
#include <string>
#include <vector>
#include <unordered_map>
#include <unordered_set>
#include <dlfcn.h>
#include <link.h>
#include <unwind.h>
#include <pthread.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <xmmintrin.h>

thread_local clemu_thread* clemu_cur = nullptr;

struct clemu_fault_exc {};   // thrown inside a CUDA thread; caught where the thread started

// ----------------------------------------------------------------------------------------
// Context switch
#if defined(__x86_64__)
extern "C" void clemu_switch(void** save_sp, void* new_sp);
extern "C" void clemu_fiber_start();
asm(R"(
.text
.globl clemu_switch
.type clemu_switch,@function
clemu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size clemu_switch,.-clemu_switch
.globl clemu_fiber_start
.type clemu_fiber_start,@function
clemu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
.size clemu_fiber_start,.-clemu_fiber_start
.section .note.GNU-stack,"",@progbits
.text
)");

// Lay out a fresh stack so that clemu_switch "returns" into clemu_fiber_start, which calls
// entry(arg) with a 16-byte aligned stack.
static void* fiber_prepare(char* top, long long, void (*entry)(void*), void* arg) {
    uint64_t* sp = (uint64_t*)(((uintptr_t)top & ~(uintptr_t)15) - 64);
    uint32_t csr = 0x1F80; uint16_t fcw = 0x037F;
    std::memcpy((char*)sp, &csr, 4);
    std::memcpy((char*)sp + 4, &fcw, 2);
    sp[1] = 0;                        // r15
    sp[2] = 0;                        // r14
    sp[3] = (uint64_t)entry;          // r13
    sp[4] = (uint64_t)arg;            // r12
    sp[5] = 0;                        // rbx
    sp[6] = 0;                        // rbp
    sp[7] = (uint64_t)&clemu_fiber_start;
    return sp;
}
#else
// Portable fallback (slower: a system call per switch): ucontext, kept at the top of the fiber's stack.
#include <ucontext.h>
struct uctx_fiber { ucontext_t uc; };
static void fiber_tramp(unsigned ahi, unsigned alo, unsigned ehi, unsigned elo) {
    void* arg = (void*)(((uintptr_t)ahi << 32) | alo);
    void (*entry)(void*) = (void (*)(void*))(((uintptr_t)ehi << 32) | elo);
    entry(arg);
    abort();
}
static void* fiber_prepare(char* top, long long stack_bytes, void (*entry)(void*), void* arg) {
    uctx_fiber* f = (uctx_fiber*)(((uintptr_t)top - sizeof(uctx_fiber)) & ~(uintptr_t)63);
    getcontext(&f->uc);
    long page = sysconf(_SC_PAGESIZE);
    f->uc.uc_stack.ss_sp = top - stack_bytes + page;
    f->uc.uc_stack.ss_size = (size_t)((char*)f - (top - stack_bytes + page));
    f->uc.uc_link = nullptr;
    uintptr_t a = (uintptr_t)arg, e = (uintptr_t)entry;
    makecontext(&f->uc, (void (*)())fiber_tramp, 4, (unsigned)(a >> 32), (unsigned)a, (unsigned)(e >> 32), (unsigned)e);
    return f;
}
#endif

// ----------------------------------------------------------------------------------------
// The launch, as Python fills it in (ctypes mirrors this struct in convlab/emu/__init__.py).
struct clemu_launch {
    unsigned grid[3], block[3];
    long long shared_bytes;
    long long shared_limit;    // the most shared memory (dynamic + static) the launch may use, as on a GPU
    int order;                 // 0 forward, 1 reverse, 2 shuffled
    unsigned seed;
    double timeout_s;
    int n_workers;
    int use_fibers;
    long long stack_bytes;
    void (*body)(void** args); // calls the kernel once, for clemu_cur
    void** args;
    int n_bufs;
    clemu_buf* bufs;           // buffer arguments: the kernel's pointer parameters read these (staged by guard.cpp)
    const char** buf_names;
    const long long* buf_elem; // each buffer's element size in bytes, for messages
    int detect;                // run the race detector (one worker, so its verdict is deterministic)
    int profile;               // count requests, sectors and bank conflicts (profile.cpp)
    int async_proxy;           // the kernel uses Hopper's async path: ordinary shared stores are recorded (fence checks)
    // results
    int status;
    char message[4096];
};

enum { T_RUN, T_BAR, T_WARP, T_DONE, T_FAULT, T_WG, T_MBAR, T_NBAR };

// A wgmma's accumulators in flight (clemu_hopper.h): the thread's d, the result it gets at the wait
// that covers `group`, and the last wgmma that wrote it.
struct wg_acc { float* d; int n; unsigned long long group; const char* file; int line; std::vector<float> val; };
// What one thread knows of an mbarrier: how many of its phases have completed (mbar_wait, or a
// __syncthreads() after another thread's wait).
struct mbar_seen { uintptr_t bar; unsigned long long phases; };

struct fiber_thread {
    clemu_thread pub;
    void* sp;
    int state;
    const char* site_file;
    int site_line;
    int pred;
    int bar_op;
    unsigned warp_mask;
    unsigned warp_gen;
    unsigned seq;          // checked accesses since the block's last barrier (the race detector's program order)
    unsigned cp_groups;    // cp.async groups the thread has committed in this block
    // Hopper (clemu_hopper.h)
    void* mbar;            // T_MBAR: the mbarrier it waits on, for the phase of this parity
    unsigned mbar_parity;
    int wg_op, wg_n, wg_acc_flag, wg_kind;     // T_WG: the warpgroup instruction and its operands
    float* wg_d;
    unsigned long long wg_da, wg_db;
    unsigned long long fences, fences_at_bar;  // fence_proxy_async calls so far, and as of the last __syncthreads()
    unsigned long long bulk_groups, bulk_read;  // TMA stores: bulk groups committed; those below bulk_read read
    std::vector<mbar_seen> seen;
    std::vector<wg_acc> inflight;
    int nbar_id, nbar_threads;             // T_NBAR: named_barrier_sync(id, threads)
    unsigned nb_count;                     // named barriers passed
    // per thread j: j's nb_count at the last named barrier that orders j before this thread
    std::vector<unsigned> nb_sync;
};

// Static __shared__ arrays the running block has opened (clemu_shared_region).
struct shared_region { const char* lo; long long bytes, elem; const char* name; };

// A cp.async in flight: what it copies (read at issue), where to, and which group it belongs to
// (group == the thread's cp_groups while it is not committed yet).
struct cp_copy { unsigned char* dst; unsigned char data[16]; int bytes; unsigned group; const void* site; };
struct cp_word { int thread; unsigned group; const void* site; };

// An mbarrier (clemu_hopper.h): arrivals still due and bytes still expected in the current phase.
struct mbar_state {
    unsigned count;
    long long pending, tx, announced, announced_before;   // announced: bytes this phase; before: the last phase's
    unsigned long long phase;          // phases completed; the current one's parity is phase & 1
    const char* tx_file; int tx_line;  // the phase's last mbar_arrive_expect_tx
    // who initialised it, where, and in which of the block's barrier epochs; whether that thread's
    // fence_mbar_init() has made the init visible (to the copy engine and, after a barrier, to all)
    int init_thread; unsigned init_epoch; const char* init_file; int init_line;
    bool fenced; unsigned fence_epoch;
};
// A 16-byte chunk of shared memory as the asynchronous proxy sees it: the last TMA copy into it
// (done for a thread once it has seen phase tma_phase of tma_bar complete), the last ordinary store
// (fenced for the tensor cores once its thread's fence_proxy_async count passes w_fences), and the
// wgmmas of each warpgroup that read it, until the wait that covers their group.
enum { MAX_WARPGROUPS = 8 };
struct async_chunk {
    bool tma = false, written = false;
    const char* tma_file = nullptr; int tma_line = 0, tma_thread = 0;
    uintptr_t tma_bar = 0; unsigned long long tma_phase = 0;
    const void* w_site = nullptr; int w_thread = 0; unsigned long long w_fences = 0;
    unsigned rd_mask = 0;
    unsigned long long rd_group[MAX_WARPGROUPS];
    const char* rd_file[MAX_WARPGROUPS]; int rd_line[MAX_WARPGROUPS];
    int st_thread = -1; unsigned long long st_group = 0;    // a TMA store reading it: its thread and bulk group
    const char* st_file = nullptr; int st_line = 0;
};
// A warpgroup's state: `gen` counts its instructions met, `done` the ones their first resumer has
// carried out; commit groups committed, and the groups below `waited` are complete.
struct wg_state { unsigned gen = 0, done = 0; unsigned long long committed = 0, waited = 0; bool fenced = false;
                  const char* wait_file = nullptr; int wait_line = 0; };

static const long long MAX_DYN_SHARED = 232448;   // an H100/H200's opt-in maximum (227 KB)

struct worker {
    pthread_t tid;
    int index;
    // per-launch state
    std::atomic<int> in_kernel{0};
    clemu_block blk;
    std::vector<fiber_thread> threads;
    std::vector<unsigned long long> warp_slots;   // [warp][parity][32]
    std::vector<unsigned> warp_regs;               // [warp][parity][32][CLEMU_XCHG_REGS]
    std::vector<shared_region> regions;            // the running block's static __shared__ arrays
    long long static_bytes = 0, shared_limit = 0;  // their bytes so far; the launch's limit (dynamic + static)
    std::vector<std::vector<cp_copy>> cp_pending;  // per thread of the block: its copies in flight
    std::unordered_map<uintptr_t, cp_word> cp_words;   // every 4-byte word a copy in flight writes
    std::unordered_map<uintptr_t, mbar_state> mbars;   // the block's mbarriers, by address
    std::unordered_map<uintptr_t, async_chunk> chunks; // shared memory the TMA, wgmma or (recorded) stores touched
    wg_state wgs[MAX_WARPGROUPS];
    unsigned char* dyn_shared = nullptr;
    char* stacks = nullptr;                        // n_stacks * stack_bytes, guard page at the bottom of each
    long long stack_bytes = 0;
    int n_stacks = 0;
    void* sched_sp = nullptr;
#if !defined(__x86_64__)
    ucontext_t sched_ctx;
#endif
    sigjmp_buf jmp;
    char* altstack = nullptr;
    fiber_thread* running = nullptr;
    unsigned epoch = 0;                            // barriers the running block has passed
    void* stop_pc = nullptr;                       // where the watchdog's signal found the kernel
    const void* last_site = nullptr;               // the last access the hook saw (when stop_pc is in the runtime)
    char* stack_lo = nullptr;                      // the OS thread's own stack (blocks without fibers run on it)
    char* stack_hi = nullptr;
    char* stack_owned = nullptr;                   // kernels own [stack_lo + a page, stack_owned): below run_block
};

static thread_local worker* W = nullptr;

// ----------------------------------------------------------------------------------------
// The pool and the current launch
static std::mutex pool_mu;
// Never destroyed: at exit the workers still wait on them, and destroying a condition
// variable that threads wait on blocks forever in glibc.
static std::condition_variable& pool_cv = *new std::condition_variable;
static std::condition_variable& done_cv = *new std::condition_variable;
static std::vector<worker*> pool;
static unsigned long long launch_gen = 0;
static int workers_done = 0;
static int workers_active = 0;     // how many take part in the current launch
static clemu_launch* L = nullptr;
static std::atomic<long long> next_block{0};
static std::atomic<long long> threads_done{0}, blocks_done{0};   // the launch's progress, for the watchdog
static long long n_blocks = 0;
static std::atomic<int> failed{0};
static std::atomic<unsigned long long> block_serial{0};
static std::unordered_map<unsigned long long, uint3> serial_block;   // detector launches: serial -> blockIdx
static std::mutex out_mu;
static std::string out_buf;
static bool out_truncated = false;

static void set_failure(int status, const char* fmt, ...) {
    int expected = 0;
    if (!failed.compare_exchange_strong(expected, 1)) return;   // the first fault wins
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(L->message, sizeof L->message, fmt, ap);
    va_end(ap);
    L->status = status;
    // The other workers see `failed` at their next block or fiber switch. They are not signalled:
    // a signal could land in malloc or in an exception's unwinding, and jumping out of those
    // breaks the process. Only the watchdog signals, and only a kernel that never returns.
}

// A source site as a token that Python turns into "cell NAME, line N" or "path:N" (addr2line on
// the module, which is built with line tables): {{site:MODULE+OFFSET}}. `pc` is a return
// address or an interrupted instruction inside a kernel module.
static std::string site(const void* pc) {
    Dl_info info;
    if (!pc || !dladdr(pc, &info) || !info.dli_fname) return "";
    char s[1200];
    snprintf(s, sizeof s, "{{site:%s+%#lx}}", info.dli_fname, (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase));
    return s;
}

static std::string at_site(const void* pc) {
    std::string s = site(pc);
    return s.empty() ? s : " at " + s;
}

// " at SITE, called at SITE, ..." for a fault in a kernel module: the line, then the lines that
// called the __device__ functions it is in, up to the kernel (inlined calls: Python reads them off
// the line tables, {{chain:..}}; real calls: the unwinder's frames in the same module).
static std::string at_chain(const void* pc) {
    Dl_info mine;
    if (!pc || !dladdr(pc, &mine) || !mine.dli_fname) return "";
    struct frames { void* ip[24]; int n; } f{{}, 0};
    _Unwind_Backtrace([](struct _Unwind_Context* c, void* d) -> _Unwind_Reason_Code {
        frames* f = (frames*)d;
        if (f->n >= 24) return _URC_END_OF_STACK;
        f->ip[f->n++] = (void*)_Unwind_GetIP(c);
        return _URC_NO_REASON;
    }, &f);
    std::string s = site(pc);
    if (s.empty()) return "";
    s = " at {{chain:" + s.substr(7);
    bool past = false;
    for (int i = 0; i < f.n; i++) {
        if (!past) { past = f.ip[i] == pc; continue; }
        Dl_info d;
        if (!dladdr(f.ip[i], &d) || d.dli_fbase != mine.dli_fbase) break;
        if (d.dli_sname && strncmp(d.dli_sname, "__clemu_body_", 13) == 0) break;   // the launcher: the kernel is done
        s += ", called at {{chain:" + site(f.ip[i]).substr(7);
    }
    return s;
}

static std::string where(const clemu_thread* t) {
    char s[160];
    if (!t) return "outside any CUDA thread";
    snprintf(s, sizeof s, "thread (%u,%u,%u) of block (%u,%u,%u)", t->idx.x, t->idx.y, t->idx.z,
             t->blk->idx.x, t->blk->idx.y, t->blk->idx.z);
    return s;
}

static std::string tid_str(const clemu_thread* t) {
    char s[64];
    snprintf(s, sizeof s, "(%u,%u,%u)", t->idx.x, t->idx.y, t->idx.z);
    return s;
}

static std::string block_str(const clemu_block* b) {
    char s[64];
    snprintf(s, sizeof s, "(%u,%u,%u)", b->idx.x, b->idx.y, b->idx.z);
    return s;
}

extern "C" [[noreturn]] void clemu_fault_oob(int arg, long long elem, long long n, long long esize) {
    std::string at = at_chain(__builtin_return_address(0));
    const char* name = (L && arg >= 0 && arg < L->n_bufs) ? L->buf_names[arg] : "?";
    char hint[200] = "";
    if (elem == n) snprintf(hint, sizeof hint, " (one past the end: a bounds check `if (i < n)` missing or off by one?)");
    else if (elem < 0) snprintf(hint, sizeof hint, " (before the start: a negative index, e.g. a halo row or column above or left of the input that needs a bounds check)");
    set_failure(CLEMU_OOB,
        "out-of-range access%s: %s[%lld] by %s, but %s has %lld elements of %lld bytes (valid indices 0..%lld)%s",
        at.c_str(), name, elem, where(clemu_cur).c_str(), name, n, esize, n - 1, hint);
    throw clemu_fault_exc();
}

extern "C" [[noreturn]] void clemu_fault_shared(const char* name, long long elem, long long n, long long esize) {
    std::string at = at_chain(__builtin_return_address(0));
    // the size this access needs is all the message can tell: the tile's formula depends on the kernel
    // (a stride, a halo), so the launch's shared= and the kernel's index are for the student to compare
    char need[200] = "";
    if (elem >= n) snprintf(need, sizeof need, " (this index needs at least shared=%lld)", (elem + 1) * esize);
    set_failure(CLEMU_OOB,
        "out-of-range access%s: extern __shared__ %s[%lld] by %s, but the launch gave shared=%lld bytes, "
        "%lld elements of %lld bytes (valid indices 0..%lld): compute shared= from the same sizes as the "
        "kernel's shared index (every element the tile holds, times its bytes)%s, or check the index",
        at.c_str(), name, elem, where(clemu_cur).c_str(), n * esize, n, esize, n - 1, need);
    throw clemu_fault_exc();
}

extern "C" [[noreturn]] void clemu_fault_shared_index(const char* name, int dim, long long index, long long extent,
                                                      const long long* prefix, int rank) {
    std::string at = at_chain(__builtin_return_address(0));
    std::string idx = name;
    for (int d = 0; d < dim && d < 4; d++) idx += "[" + std::to_string(prefix[d]) + "]";
    idx += "[" + std::to_string(index) + "]";
    char dimtxt[80] = "";
    if (rank > 1) snprintf(dimtxt, sizeof dimtxt, " of dimension %d", dim + 1);
    char hint[200] = "";
    if (index == extent) snprintf(hint, sizeof hint, " (one past the end: a bound `< n` written `<= n`, or a tile "
                                                   "index plus a halo or partner offset that runs over?)");
    else if (index < 0) snprintf(hint, sizeof hint, " (a negative index)");
    set_failure(CLEMU_OOB,
        "out-of-range access%s: __shared__ %s by %s, but index %lld%s is outside its %lld elements "
        "(valid 0..%lld)%s",
        at.c_str(), idx.c_str(), where(clemu_cur).c_str(), index, dimtxt, extent, extent - 1, hint);
    throw clemu_fault_exc();
}

extern "C" [[noreturn]] void clemu_fault(int kind, const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_failure(kind, "%s (%s)", msg, where(clemu_cur).c_str());
    throw clemu_fault_exc();
}

extern "C" void clemu_printf(const char* fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    std::lock_guard<std::mutex> g(out_mu);
    if (out_buf.size() > (4u << 20)) { out_truncated = true; return; }
    out_buf.append(line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

// ----------------------------------------------------------------------------------------
// Barriers. A CUDA thread that reaches one parks its fiber; the block's scheduler decides.
static inline fiber_thread* me() { return (fiber_thread*)clemu_cur; }

static void park(int state, const char* file, int line) {
    fiber_thread* t = me();
    if (!W || !W->sched_sp || !t) {
        // no fiber: the kernel source hid its barrier from the scan (e.g. in a macro from a header)
        clemu_fault(CLEMU_BARRIER, "internal: a barrier at %s:%d was reached in a launch run without fibers; "
                                   "please report this file to the course", file, line);
    }
    t->state = state;
    t->site_file = file;
    t->site_line = line;
#if defined(__x86_64__)
    clemu_switch(&t->sp, W->sched_sp);
#else
    swapcontext(&((uctx_fiber*)t->sp)->uc, &W->sched_ctx);
#endif
    clemu_cur = &t->pub;
}

extern "C" void clemu_syncthreads(const char* file, int line) {
    park(T_BAR, file, line);
}

static thread_local int bar_result;

extern "C" int clemu_syncthreads_reduce(int pred, int op, const char* file, int line) {
    fiber_thread* t = me();
    t->pred = pred ? 1 : 0;
    t->bar_op = op;
    park(T_BAR, file, line);
    return bar_result;
}

extern "C" unsigned long long* clemu_warp_exchange(unsigned mask, unsigned long long value, const char* file, int line) {
    fiber_thread* t = me();
    if (!t) clemu_fault(CLEMU_FAULT, "warp operation outside a kernel");
    int warp = t->pub.linear / 32, lane = t->pub.linear % 32;
    unsigned parity = t->warp_gen & 1u;
    unsigned long long* slots = &W->warp_slots[((size_t)warp * 2 + parity) * 32];
    slots[lane] = value;
    t->warp_mask = mask;
    park(T_WARP, file, line);
    t->warp_gen++;
    return slots;
}

extern "C" const unsigned* clemu_warp_exchange_regs(unsigned mask, const unsigned* regs, int n, const char* file, int line) {
    fiber_thread* t = me();
    if (!t) clemu_fault(CLEMU_FAULT, "warp operation outside a kernel");
    int warp = t->pub.linear / 32, lane = t->pub.linear % 32;
    unsigned parity = t->warp_gen & 1u;
    unsigned* slots = &W->warp_regs[((size_t)warp * 2 + parity) * 32 * CLEMU_XCHG_REGS];
    memcpy(slots + lane * CLEMU_XCHG_REGS, regs, sizeof(unsigned) * (n < CLEMU_XCHG_REGS ? n : CLEMU_XCHG_REGS));
    t->warp_mask = mask;
    park(T_WARP, file, line);
    t->warp_gen++;
    return slots;
}

extern "C" unsigned clemu_activemask() {
    fiber_thread* t = me();
    if (!t || !W || W->threads.empty()) return 0xffffffffu;
    int warp = t->pub.linear / 32;
    int n = (int)(W->blk.dim.x * W->blk.dim.y * W->blk.dim.z);
    unsigned m = 0;
    for (int l = 0; l < 32 && warp * 32 + l < n; l++) {
        int s = W->threads[warp * 32 + l].state;
        if (s != T_DONE && s != T_FAULT) m |= 1u << l;
    }
    return m;
}

// ----------------------------------------------------------------------------------------
// The per-access hook (clemu_abi.h) and the race detector, its first user.
//
// Shadow state per accessed element: its last writer and two of its readers, each with the
// block, the thread, the block's barrier epoch and the thread's warp-operation count at the
// access. Two accesses by different threads conflict when at least one writes and nothing
// orders them: threads of different blocks (global memory) are never ordered; threads of one
// block are ordered by a __syncthreads() between them (a different epoch) and lanes of one warp
// also by a warp operation. Atomics never conflict. Shared-memory records of an earlier block
// are stale: that memory was the earlier block's. Launches with the detector run on one worker,
// so the same kernel gives the same report on every run.
int clemu_hook_on = 0;
int clemu_count_on = 0;
int clemu_flat_shared = 0;
static bool detect_on = false;
static bool prof_on = false;                                     // the profiler (profile.cpp) counts
static thread_local const void* volatile hook_site = nullptr;   // inside clemu_access: the access's site
static thread_local volatile int stop_pending = 0;               // the watchdog asked to stop meanwhile

struct acc_rec { const void* site; unsigned long long block; int thread; unsigned epoch; unsigned wgen; unsigned seq;
                 unsigned nb;      // nb: the thread's named barriers passed (named_barrier_sync)
                 bool looped; };   // made inside a `for` loop (the hooked build's loop scopes)
struct shadow_word { acc_rec w, r1, r2; };
static std::unordered_map<uintptr_t, shadow_word> shadow;
struct race_rec { const void* a; const void* b; };
static std::vector<race_rec> races_seen;
static std::string race_text;
// A race whose fix is a barrier between two lines: which barrier (__syncthreads() or __syncwarp())
// is decided when the launch ends, from which threads of the block ran the two lines.
struct race_note { std::string head, a, b; const void* sa; const void* sb; bool a_writes, b_writes; int ta, tb;
                   bool looped; };   // the accesses were made inside a `for` loop
static std::vector<race_note> race_notes;
// Per access site: the threads of the last block that ran it (one bit per thread of the block).
struct site_threads { unsigned long long block; std::vector<unsigned long long> bits; };
static std::unordered_map<const void*, site_threads> site_seen;
static std::unordered_set<const void*> cp_issue_sites;           // detector launches: the cp.async calls' sites
static long long n_races = 0;
static const int MAX_RACE_REPORTS = 3;

static bool conflict(const acc_rec& p, const acc_rec& c, bool shared) {
    if (!p.block) return false;
    if (p.block != c.block) return !shared;
    if (p.thread == c.thread || p.epoch != c.epoch) return false;
    // a named barrier that p's thread passed after p, and c's thread passed (directly or through others) before c
    const std::vector<unsigned>& nb = W->threads[c.thread].nb_sync;
    if (!nb.empty() && nb[p.thread] > p.nb) return false;
    return !(p.thread / 32 == c.thread / 32 && p.wgen != c.wgen);
}

static std::string thread_in_block(int linear, const dim3& d) {
    char s[64];
    snprintf(s, sizeof s, "(%d,%d,%d)", linear % (int)d.x, (linear / (int)d.x) % (int)d.y, linear / (int)(d.x * d.y));
    return s;
}

static std::string block_of_serial(unsigned long long serial) {
    auto it = serial_block.find(serial);
    if (it == serial_block.end()) return "?";
    char s[64];
    snprintf(s, sizeof s, "(%u,%u,%u)", it->second.x, it->second.y, it->second.z);
    return s;
}

static void report_race(const acc_rec& p, bool p_writes, const acc_rec& c, bool c_writes, unsigned op,
                        const volatile void* addr, unsigned bytes, const char* name, const void* base) {
    n_races++;
    for (auto& r : races_seen) if (r.a == p.site && r.b == c.site) return;   // each race once
    races_seen.push_back({p.site, c.site});
    if ((int)races_seen.size() > MAX_RACE_REPORTS) return;
    std::string what;
    char s[600];
    if (op & CLEMU_SHARED) {
        if (name || !base)
            snprintf(s, sizeof s, "__shared__ %s[%lld]", name ? name : "?", (long long)(((const char*)addr - (const char*)base) / bytes));
        else
            snprintf(s, sizeof s, "bytes [%lld, %lld) of extern __shared__ memory", (long long)((const char*)addr - (const char*)base),
                     (long long)((const char*)addr - (const char*)base) + bytes);
        what = s;
    } else {
        what = "global memory";
        for (int i = 0; L && i < L->n_bufs; i++) {
            const char* lo = (const char*)L->bufs[i].p;
            if ((const char*)addr >= lo && (const char*)addr < lo + L->bufs[i].nbytes) {
                snprintf(s, sizeof s, "%s[%lld]", L->buf_names[i], (long long)(((const char*)addr - lo) / bytes));
                what = s;
            }
        }
    }
    const dim3& d = W->blk.dim;
    std::string pa = site(p.site), ca = site(c.site);
    bool blocks = p.block != c.block;
    std::string txt = "data race on " + what + ": thread " + thread_in_block(p.thread, d) + " of block " +
        block_of_serial(p.block) + (p_writes ? " writes it" : " reads it") + (pa.empty() ? "" : " at " + pa) +
        ", then thread " + thread_in_block(c.thread, d) + " of block " + block_str(&W->blk) +
        (c_writes ? " writes it" : " reads it") + (ca.empty() ? "" : " at " + ca) + ", and nothing orders the two. ";
    const void* w_site = c_writes ? c.site : p.site;
    bool rmw = (op & CLEMU_RD) && (op & CLEMU_WR);
    if (blocks && rmw)
        txt += "Threads of different blocks are never ordered (a barrier holds inside one block only): "
               "combine their contributions with atomicAdd at " + site(c.site) + " instead of a plain `+=`.";
    else if (blocks && p_writes && c_writes)
        txt += "Threads of different blocks store to the same element, and nothing orders blocks: which value stays "
               "is undefined. Each output element needs exactly one writer: check the index computed for the store at " +
               site(w_site) + (c.looped ? ", the step of its loop (a grid-stride loop steps by blockDim.x * gridDim.x)"
                                        : "") + " and the guard that decides which thread writes it.";
    else if (p_writes && c_writes && p.site == c.site)
        txt += "Both threads store to the same element at the same line: each element needs exactly one writer (a "
               "barrier would only decide which store stays). Check the index of the store at " + site(w_site) +
               ": a row length, a divisor or an offset that maps two threads to one element.";
    else if (blocks)
        txt += "Threads of different blocks are never ordered (a barrier holds inside one block only), so a block "
               "cannot read what another block writes in the same launch: read only elements this block writes, or "
               "split the work into two launches.";
    else if (p_writes && rmw)
        txt += "Several threads update the same element (read, add, write back): use atomicAdd at " + site(c.site) +
               " (or give each thread its own element and reduce them after a __syncthreads()).";
    else {
        // where the barrier goes: between the two lines in the order each thread runs them, which
        // the count of each thread's accesses since the last barrier tells (the emulator ran the
        // two threads in its own order, not necessarily that one)
        bool p_first = p.seq <= c.seq;
        const std::string& a = p_first ? pa : ca; const std::string& b2 = p_first ? ca : pa;
        bool a_writes = p_first ? p_writes : c_writes, b_writes = p_first ? c_writes : p_writes;
        if (a_writes && cp_issue_sites.count(p_first ? p.site : c.site))
            txt += "A cp.async's copy lands at its thread's cp_async_wait<N>(), not at " + a + ": put a __syncthreads() "
                   "after that wait and before the " + (b_writes ? "write" : "read") + " at " + b2 +
                   " (every thread of the block must reach it), so every thread's copy has landed first.";
        else {
            race_notes.push_back({txt, a, b2, p_first ? p.site : c.site, p_first ? c.site : p.site, a_writes, b_writes,
                                  p_first ? p.thread : c.thread, p_first ? c.thread : p.thread, p.looped || c.looped});
            return;
        }
    }
    race_notes.push_back({txt, "", "", nullptr, nullptr, false, false, -1, -1, false});
}

// "lane 3", "lanes 16-31", "lanes 0, 2, 5-7"
static std::string lanes_str(unsigned bits) {
    std::string s;
    int n = 0;
    for (int l = 0; l < 32; l++) {
        if (!((bits >> l) & 1u)) continue;
        int e = l;
        while (e + 1 < 32 && ((bits >> (e + 1)) & 1u)) e++;
        if (!s.empty()) s += ", ";
        s += std::to_string(l);
        if (e > l) s += "-" + std::to_string(e);
        n += e - l + 1;
        l = e;
    }
    return (n > 1 ? "lanes " : "lane ") + s;
}

static void see_site(const void* pc, int thread, unsigned long long block, int n) {
    site_threads& s = site_seen[pc];
    if (s.block != block) { s.block = block; s.bits.assign((size_t)(n + 63) / 64, 0); }
    if (thread < n) s.bits[(size_t)thread / 64] |= 1ull << (thread % 64);
}

// The threads of the last block that ran site pc (one bit per thread), ORed into `into`.
static void site_runners(const void* pc, std::vector<unsigned long long>& into) {
    auto it = site_seen.find(pc);
    if (it == site_seen.end()) return;
    if (into.size() < it->second.bits.size()) into.resize(it->second.bits.size(), 0);
    for (size_t i = 0; i < it->second.bits.size(); i++) into[i] |= it->second.bits[i];
}

// The fix of a race between two lines of one block: a __syncthreads() between them; or, where the
// two lines run in exactly the lanes of one warp and in no other thread of the block (a
// warp-synchronous tail inside `if (tid < 32)`, where a __syncthreads() would be reached by part of
// the block only), a __syncwarp(). Code that several warps run needs the block's barrier.
static std::string barrier_fix(const race_note& r, int n) {
    const char* aw = r.a_writes ? "write" : "read";
    const char* bw = r.b_writes ? "write" : "read";
    int warp = r.ta / 32;
    std::vector<unsigned long long> ran;
    site_runners(r.sa, ran);
    site_runners(r.sb, ran);
    int total = 0;
    for (unsigned long long b : ran) total += __builtin_popcountll(b);
    unsigned lanes = (size_t)warp / 2 < ran.size() ? (unsigned)(ran[(size_t)warp / 2] >> (32 * (warp % 2))) : 0u;
    int in_warp = n - warp * 32 < 32 ? n - warp * 32 : 32;
    unsigned whole = in_warp == 32 ? 0xffffffffu : (1u << in_warp) - 1u;
    if (r.ta / 32 == r.tb / 32 && lanes == whole && total == in_warp && n > in_warp)
        return std::string("Both threads are lanes of warp ") + std::to_string(warp) + ", and only its lanes run "
               "these lines (a __syncthreads() there would be reached by part of the block only): put a __syncwarp() "
               "between " + r.a + " and " + r.b + " (" + lanes_str(lanes) + " of the warp run these lines and must "
               "reach it), so the " + aw + " at " + r.a + " is finished in every lane before the " + bw + " at " +
               r.b + " starts.";
    // {{loop}}: the accesses were made inside a `for` loop; where both are of one line, Python (which
    // knows the lines) turns the advice into the barrier at the end of the iteration, or, without a
    // loop, into splitting the statement's read from its write (convlab/emu/__init__.py)
    return "Put a __syncthreads() between " + r.a + " and " + r.b + (r.looped ? "{{loop}}" : "") + " (every thread "
           "of the block must reach it), so the " + aw + " at " + r.a + " is finished in every thread before the " +
           bw + " at " + r.b + " starts.";
}

static void cp_check(unsigned op, const void* addr, unsigned bytes, const char* name, const void* base, const void* pc);

// The race detector's part of an access at `pc` (clemu_access's, and the tensor-core instructions').
static void detect(unsigned op, const volatile void* addr, unsigned bytes, const char* name, const void* base,
                   const void* pc) {
    fiber_thread* t = me();
    if (!t || !W) return;
    hook_site = pc;
    W->last_site = hook_site;
    acc_rec c{hook_site, W->blk.serial, t->pub.linear, W->epoch, t->warp_gen, t->seq++, t->nb_count, t->pub.loop != 0};
    see_site(pc, t->pub.linear, W->blk.serial, (int)(W->blk.dim.x * W->blk.dim.y * W->blk.dim.z));
    bool sh = op & CLEMU_SHARED;
    shadow_word& s = shadow[(uintptr_t)addr];
    if (op & CLEMU_RD) {
        if (conflict(s.w, c, sh)) report_race(s.w, true, c, false, op, addr, bytes, name, base);
        bool stale = !s.r1.block || (sh && s.r1.block != c.block) || (s.r1.block == c.block && s.r1.epoch != c.epoch);
        if (stale || (s.r1.block == c.block && s.r1.thread == c.thread)) s.r1 = c;
        else s.r2 = c;
    }
    if (op & CLEMU_WR) {
        if (conflict(s.w, c, sh)) report_race(s.w, true, c, true, op, addr, bytes, name, base);
        else if (conflict(s.r1, c, sh)) report_race(s.r1, false, c, true, op, addr, bytes, name, base);
        else if (conflict(s.r2, c, sh)) report_race(s.r2, false, c, true, op, addr, bytes, name, base);
        s.w = c;
    }
    hook_site = nullptr;
    if (stop_pending) { stop_pending = 0; throw clemu_fault_exc(); }
}

// What memory an address is in, as far as the emulator can tell: the block's shared memory (its
// dynamic buffer and the static arrays it opened), a buffer argument, a thread's stack.
enum { SP_UNKNOWN, SP_SHARED, SP_GLOBAL, SP_LOCAL };
static std::string describe_address(uintptr_t a);
struct mem_place { int space; const char* lo; long long bytes, elem; const char* name; };
static mem_place place_of(const void* a);

// The profiler's part of an access: the space of an access through a local pointer (CLEMU_ANY) is
// where its address lies; one into neither a buffer argument nor shared memory (a thread's own
// array, __constant__ memory) is no load or store the GPU's LSU counts.
static void count_access(unsigned op, const void* addr, unsigned bytes, const void* pc) {
    fiber_thread* t = me();
    if (!t) return;
    if (op & CLEMU_ANY) {
        mem_place m = place_of(addr);
        bool exact = m.space == SP_GLOBAL ||
                     (m.space == SP_SHARED && (const char*)addr >= m.lo && (const char*)addr < m.lo + m.bytes);
        if (!exact) return;
        if (m.space == SP_SHARED) op |= CLEMU_SHARED;
    } else if ((op & CLEMU_ATOM) && !(op & CLEMU_SHARED)) {
        // an atomic comes as a plain pointer: shared memory when it is in no buffer argument
        bool global = false;
        for (int i = 0; L && i < L->n_bufs && !global; i++)
            global = (const char*)addr >= (const char*)L->bufs[i].p &&
                     (const char*)addr < (const char*)L->bufs[i].p + L->bufs[i].nbytes;
        if (!global) op |= CLEMU_SHARED;
    }
    clprof_hook(op, addr, bytes, pc, t->pub.linear, t->pub.loop);
}

static void local_pointer_access(unsigned op, const void* addr, unsigned bytes, const void* pc);
static void async_access(unsigned op, const void* addr, unsigned bytes, const void* pc);
static bool async_on = false;    // the launch's kernel uses Hopper's async path: shared accesses go to async_access

extern "C" __attribute__((visibility("default")))
void clemu_access(unsigned op, const volatile void* addr, unsigned bytes, const char* name, const void* base) {
    if (op & CLEMU_COUNT) {       // half, vector elements, local pointers: the profiler's alone
        if (prof_on) count_access(op, (const void*)addr, bytes, __builtin_return_address(0));
        return;
    }
    if (op & CLEMU_ANY) {         // an arithmetic element through a local pointer
        if (prof_on) count_access(op, (const void*)addr, bytes, __builtin_return_address(0));
        if (W && (detect_on || async_on || !W->cp_words.empty()))
            local_pointer_access(op, (const void*)addr, bytes, __builtin_return_address(0));
        return;
    }
    if (W && !W->cp_words.empty() && !(op & CLEMU_ATOM))
        cp_check(op, (const void*)addr, bytes, name, base, __builtin_return_address(0));
    if (async_on && W && (op & CLEMU_SHARED) && !(op & CLEMU_ATOM))
        async_access(op, (const void*)addr, bytes, __builtin_return_address(0));
    if (prof_on) count_access(op, (const void*)addr, bytes, __builtin_return_address(0));
    if (!detect_on || (op & CLEMU_ATOM)) return;
    detect(op, addr, bytes, name, base, __builtin_return_address(0));
}

// A local pointer's element (a pointer taken into a __shared__ array, `volatile float* vs = s`): where
// it lies in the block's shared memory, the cp.async check and the race detector see it as the
// array's own access; past the launch's extern shared bytes it is a fault. Global memory and a
// thread's own arrays stay unwatched through such pointers.
static void local_pointer_access(unsigned op, const void* addr, unsigned bytes, const void* pc) {
    mem_place m = place_of(addr);
    if (m.space != SP_SHARED) return;
    const char* a = (const char*)addr;
    if (!m.name && a + bytes > m.lo + m.bytes) {
        long long off = a - m.lo;
        set_failure(CLEMU_OOB, "out-of-range access%s: bytes [%lld, %lld) of extern __shared__ memory by %s, through a "
                    "pointer, but the launch gave shared=%lld bytes: pass a larger shared= (this access needs at "
                    "least %lld), or check the index", at_site(pc).c_str(), off, off + bytes, where(clemu_cur).c_str(),
                    m.bytes, off + bytes);
        throw clemu_fault_exc();
    }
    if (a < m.lo || a + bytes > m.lo + m.bytes) return;   // near a static array, not in it: nothing known
    op = (op & ~(unsigned)CLEMU_ANY) | CLEMU_SHARED;
    if (!W->cp_words.empty()) cp_check(op, addr, bytes, m.name, m.lo, pc);
    if (async_on) async_access(op, addr, bytes, pc);
    if (detect_on) detect(op, addr, bytes, m.name, m.lo, pc);
}

// ----------------------------------------------------------------------------------------
// Tensor-core instructions (clemu_tensor_core.h): ldmatrix's row addresses and cp.async's copies.

static const long long NEAR_BYTES = 4096;   // an address this close past (before) an array counts as in it

static mem_place place_of(const void* a) {
    const char* p = (const char*)a;
    if (!W) return {SP_UNKNOWN, nullptr, 0, 1, nullptr};
    const char* dyn = (const char*)W->dyn_shared;
    if (dyn && p >= dyn && p < dyn + MAX_DYN_SHARED) return {SP_SHARED, dyn, W->blk.dyn_bytes, 1, nullptr};
    const shared_region* near = nullptr;
    long long dist = NEAR_BYTES;
    for (auto& g : W->regions) {
        if (p >= g.lo && p < g.lo + g.bytes) return {SP_SHARED, g.lo, g.bytes, g.elem, g.name};
        long long d = p >= g.lo + g.bytes ? p - (g.lo + g.bytes) : g.lo - p;
        if (d < dist) { dist = d; near = &g; }
    }
    for (int i = 0; L && i < L->n_bufs; i++) {
        const char* lo = (const char*)L->bufs[i].p;
        if (p >= lo && p < lo + L->bufs[i].nbytes) return {SP_GLOBAL, lo, L->bufs[i].nbytes, 1, L->buf_names[i]};
    }
    if (near) return {SP_SHARED, near->lo, near->bytes, near->elem, near->name};
    if (W->stacks && p >= W->stacks && p < W->stacks + (size_t)W->n_stacks * W->stack_bytes)
        return {SP_LOCAL, nullptr, 0, 1, nullptr};
    return {SP_UNKNOWN, nullptr, 0, 1, nullptr};
}

// For the profiler's trace (clemu_profile.h): the running thread's block and what addr is in.
extern "C" int clemu_trace_place(const void* addr, unsigned* block, const char** name, const char** lo, long long* elem,
                                 long long* size) {
    fiber_thread* t = me();
    if (!t || !t->pub.blk) return 0;
    block[0] = t->pub.blk->idx.x; block[1] = t->pub.blk->idx.y; block[2] = t->pub.blk->idx.z;
    mem_place m = place_of(addr);
    bool in = m.lo && (const char*)addr >= m.lo && (const char*)addr < m.lo + m.bytes;
    *name = in ? m.name : nullptr;
    *lo = in ? m.lo : nullptr;
    *elem = in && m.name && m.space == SP_SHARED ? m.elem : 0;
    *size = in ? m.bytes : 0;
    return 1;
}

// "__shared__ sA[37]" (the element as the array's type counts), or the byte of extern shared memory
static std::string shared_what(const void* addr, const mem_place& m) {
    char s[300];
    long long off = (const char*)addr - m.lo;
    if (m.name) snprintf(s, sizeof s, "__shared__ %s[%lld]", m.name, off / (m.elem > 0 ? m.elem : 1));
    else snprintf(s, sizeof s, "byte %lld of extern __shared__ memory", off);
    return s;
}

// The race detector keys its records by an element's address: the instructions' accesses are
// split into the elements of the array they touch (2 or 4 bytes; 4 where the type is unknown).
static int detect_step(const mem_place& m) { return m.name && m.elem == 2 ? 2 : 4; }

[[noreturn]] static void tc_fault(int status, const char* fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    set_failure(status, "%s (%s)", msg, where(clemu_cur).c_str());
    throw clemu_fault_exc();
}

// `bytes` of shared memory at addr, as the instruction `what` at pc uses them: inside one array.
static mem_place check_shared(const void* addr, int bytes, const char* what, const char* role, const void* pc) {
    mem_place m = place_of(addr);
    std::string at = at_site(pc);
    if (m.space == SP_GLOBAL)
        tc_fault(CLEMU_FAULT, "%s%s: %s %p is inside argument `%s` (global memory), but it must be shared memory: "
                 "pass the address of an element of a __shared__ array", what, at.c_str(), role, addr, m.name);
    if (m.space == SP_LOCAL)
        tc_fault(CLEMU_FAULT, "%s%s: %s %p is a local variable of the thread (on its stack), but it must be shared "
                 "memory: pass the address of an element of a __shared__ array", what, at.c_str(), role, addr);
    if (m.space == SP_SHARED) {
        long long off = (const char*)addr - m.lo;
        if (off < 0 || off + bytes > m.bytes) {
            if (m.name)
                tc_fault(CLEMU_OOB, "%s%s: %s %p, bytes [%lld, %lld) of __shared__ %s, is outside its %lld bytes: "
                         "check the row and column the address is computed from", what, at.c_str(), role, addr,
                         off, off + bytes, m.name, m.bytes);
            tc_fault(CLEMU_OOB, "%s%s: %s %p, bytes [%lld, %lld) of extern __shared__ memory, is outside the %lld "
                     "bytes the launch gave (shared=): pass a larger shared=, or check the address", what, at.c_str(),
                     role, addr, off, off + bytes, m.bytes);
        }
    }
    return m;
}

// An access to memory that a cp.async in flight will write: a fault that names both lines.
static void cp_check(unsigned op, const void* addr, unsigned bytes, const char* name, const void* base, const void* pc) {
    for (uintptr_t w = (uintptr_t)addr & ~(uintptr_t)3; w < (uintptr_t)addr + bytes; w += 4) {
        auto it = W->cp_words.find(w);
        if (it == W->cp_words.end()) continue;
        const cp_word c = it->second;
        mem_place m = place_of(addr);
        if (name && base) m = {SP_SHARED, (const char*)base, 0, bytes, name};
        std::string what = shared_what(addr, m), at = site(pc), cp = site(c.site);
        fiber_thread* t = me();
        bool own = t && t->pub.linear == c.thread;
        bool committed = c.group < W->threads[c.thread].cp_groups;
        std::string who = own ? "this thread's" : "thread " + thread_in_block(c.thread, W->blk.dim) + "'s";
        std::string fix;
        if (!committed)
            fix = "That copy's group was never committed: call cp_async_commit() after a stage's cp.async calls, then "
                  "cp_async_wait<N>() (N: how many more recent groups may stay in flight; 0 waits for all)";
        else
            fix = "Wait for the copy with cp_async_wait<N>() (N: how many more recent groups may stay in flight; "
                  "0 waits for all)";
        if (own) fix += " between " + cp + " and " + at + ".";
        else fix += " in the thread that issued it, then __syncthreads() (every thread of the block), both between " +
                    cp + " and " + at + ", so every thread's copy has landed before any thread touches it.";
        set_failure(CLEMU_RACE, "%s %s at %s by %s, while %s cp.async at %s that copies into it is still in flight "
                    "(its bytes are undefined until a wait covers it%s). %s",
                    (op & CLEMU_WR) ? "write to" : "read of", what.c_str(), at.c_str(), where(clemu_cur).c_str(),
                    who.c_str(), cp.c_str(), (op & CLEMU_WR) ? ", and it lands over this write" : "", fix.c_str());
        throw clemu_fault_exc();
    }
}

extern "C" __attribute__((visibility("default"))) void clemu_shared_region(const void* lo, long long bytes, long long elem,
                                                                             const char* name) {
    if (!W) return;
    W->regions.push_back({(const char*)lo, bytes, elem, name});
    guard_allow(lo, (size_t)bytes);
    W->static_bytes += bytes;
    // a GPU counts a kernel's __shared__ arrays with the dynamic bytes of its launch, and refuses a
    // launch over the limit (48 KB, or the opt-in): so does the emulator, when the array is opened
    if (W->shared_limit && W->static_bytes + W->blk.dyn_bytes > W->shared_limit) {
        std::string arrays;
        for (auto& g : W->regions) arrays += (arrays.empty() ? "" : ", ") + std::string(g.name) + " " + std::to_string(g.bytes);
        set_failure(CLEMU_LAUNCH,
            "the block asks for %lld bytes of shared memory (%lld dynamic + %lld static: __shared__ %s), over the %lld "
            "this launch may use: a GPU refuses the launch. Opt in with max_shared=<bytes> (up to 232,448 on an "
            "H100/H200), counting the static arrays too, or use less shared memory",
            W->static_bytes + W->blk.dyn_bytes, W->blk.dyn_bytes, W->static_bytes, arrays.c_str(), W->shared_limit);
        throw clemu_fault_exc();
    }
}

extern "C" __attribute__((visibility("default"))) int clemu_shared_span(const void* p, const char** lo, long long* bytes,
                                                                        const char** name) {
    if (!W) return 0;
    for (auto& g : W->regions)
        if ((const char*)p >= g.lo && (const char*)p < g.lo + g.bytes) {
            *lo = g.lo; *bytes = g.bytes; *name = g.name;
            return 1;
        }
    return 0;
}

extern "C" __attribute__((visibility("default"))) void clemu_fault_shared_ptr(const char* name, long long off,
                                                                             long long bytes, long long esize) {
    std::string at = at_site(__builtin_return_address(0));
    long long elem = off >= 0 ? off / esize : -((-off + esize - 1) / esize);
    set_failure(CLEMU_OOB,
        "out-of-range access%s: through a pointer into __shared__ %s, element %lld of %lld bytes (byte %lld from the "
        "array's start) by %s, but %s has %lld bytes (elements 0..%lld of that size)%s: check the offset the pointer "
        "was made with and the index used on it",
        at.c_str(), name, elem, esize, off, where(clemu_cur).c_str(), name, bytes, bytes / esize - 1,
        off < 0 ? " (before its start)" : off >= bytes ? " (past its end)" : " (it runs over the end)");
    throw clemu_fault_exc();
}

// ---- the guard's verdicts ---------------------------------------------------------------
// guard.cpp keeps the shadow of what a launch owns; kernel modules, compiled with
// -fsanitize=kernel-address, check it inline before every load and store and call
// __asan_report_* here when it says no (or fault on the shadow itself: on_signal). Local arrays
// indexed out of range and integer division by zero come from -fsanitize=bounds and
// integer-divide-by-zero (__ubsan_handle_*), with the source line in their data.

static std::atomic<long long> heap_full_bytes{0};   // the last malloc/new the device heap could not serve

// What address a is, for a student: the argument and element it runs past, the shared array, the
// heap block, the stack; and the status the fault gets.
static std::string guard_what(uintptr_t a, unsigned bytes, bool write, int* status) {
    char s[1200];
    const char* act = write ? "store" : "load";
    *status = CLEMU_OOB;
    guard_place pl;
    if (a < 65536) {
        long long full = heap_full_bytes.load();
        char why[300] = "";
        if (full) snprintf(why, sizeof why, " (a malloc or new of %lld bytes in this launch found the device heap full "
                           "and returned NULL: the heap is %lld bytes; cl.set_heap_size() raises it)", full,
                           guard_heap_bytes());
        snprintf(s, sizeof s, "%s through a null pointer (address %#lx)%s: a pointer that was never set, or "
                 "that points at nothing here", act, (unsigned long)a, why);
        *status = CLEMU_SEGV;
        return s;
    }
    if (L && guard_near_buffer(a, &pl) && pl.buf < L->n_bufs) {
        long long esize = L->buf_elem ? L->buf_elem[pl.buf] : 1;
        if (esize < 1) esize = 1;
        long long n = L->bufs[pl.buf].nbytes / esize;
        long long elem = pl.offset >= 0 ? pl.offset / esize : -((-pl.offset + esize - 1) / esize);
        const char* name = L->buf_names[pl.buf];
        char hint[200] = "";
        if (elem == n) snprintf(hint, sizeof hint, " (one past the end: a bounds check `if (i < n)` missing or off by one?)");
        else if (elem < 0) snprintf(hint, sizeof hint, " (before the start: a negative index, e.g. a halo row or column "
                                    "above or left of the input that needs a bounds check)");
        else if (elem < n) snprintf(hint, sizeof hint, " (it starts inside but its %u bytes run past the end)", bytes);
        snprintf(s, sizeof s, "out-of-range %s: %s[%lld] through a pointer into argument `%s`, but %s has %lld elements "
                 "of %lld bytes (valid indices 0..%lld)%s", act, name, elem, name, name, n, esize, n - 1, hint);
        return s;
    }
    if (W) {
        const char* dyn = (const char*)W->dyn_shared;
        if (dyn && (const char*)a + NEAR_BYTES >= dyn && (const char*)a < dyn + MAX_DYN_SHARED) {
            long long off = (long long)(a - (uintptr_t)dyn);
            snprintf(s, sizeof s, "out-of-range %s: byte %lld of extern __shared__ memory, but the launch gave "
                     "shared=%lld bytes: compute shared= from the same sizes as the kernel's shared index, or check the "
                     "index", act, off, W->blk.dyn_bytes);
            return s;
        }
        mem_place m = place_of((const void*)a);
        if (m.space == SP_SHARED && m.name) {
            long long off = (long long)(a - (uintptr_t)m.lo);
            snprintf(s, sizeof s, "out-of-range %s: through a pointer into __shared__ %s, byte %lld from its start, but "
                     "%s has %lld bytes (elements 0..%lld of %lld bytes)%s: check the offset the pointer was made with "
                     "and the index used on it", act, m.name, off, m.name, m.bytes, m.bytes / (m.elem ? m.elem : 1) - 1,
                     m.elem, off < 0 ? " (before its start)" : " (past its end)");
            return s;
        }
        long page = sysconf(_SC_PAGESIZE);
        if (W->stack_lo && (char*)a >= W->stack_lo - 65536 && (char*)a < W->stack_lo + page) {
            snprintf(s, sizeof s, "stack overflow: the thread's local variables (or a recursion) need more than the "
                     "%lld KB of stack the emulator's CPU thread has (a GPU thread has far less): make local arrays "
                     "smaller, put them in shared memory, or end the recursion", (long long)(W->stack_hi - W->stack_lo) >> 10);
            *status = CLEMU_STACK;
            return s;
        }
    }
    long long start, blk;
    bool freed;
    if (guard_heap_place(a, &start, &blk, &freed)) {
        if (start >= 0 && freed)
            snprintf(s, sizeof s, "%s into a block of the device heap that free or delete released (a use after free): "
                     "%lld bytes from the start of its %lld bytes", act, (long long)a - start, blk);
        else if (start >= 0)
            snprintf(s, sizeof s, "out-of-range %s on the device heap: %lld bytes past the end of a block of %lld bytes "
                     "from malloc or new: allocate enough, or check the index", act, (long long)a - (start + blk), blk);
        else snprintf(s, sizeof s, "%s into the device heap where no malloc or new gave a block", act);
        return s;
    }
    snprintf(s, sizeof s, "%s at address %#lx, which the launch does not own (none of its buffer arguments, its shared "
             "memory, the device heap or the thread's own variables): a pointer that was never set, or one computed "
             "from a wrong base or offset", act, (unsigned long)a);
    *status = CLEMU_SEGV;
    return s;
}

// Leave the kernel after a fault reported from a call the compiler takes for one that cannot throw
// (the sanitizers' report calls, free, delete): as a signal leaves it, to the worker's loop.
[[noreturn]] static void leave_kernel() {
    if (W && W->in_kernel.load()) siglongjmp(W->jmp, 1);
    throw clemu_fault_exc();
}

[[noreturn]] static void bad_access(uintptr_t a, unsigned bytes, bool write, const void* pc) {
    {
        int status;
        std::string what = guard_what(a, bytes, write, &status);
        set_failure(status, "%s%s by %s", what.c_str(), at_chain(pc).c_str(), where(clemu_cur).c_str());
    }
    leave_kernel();
}

#define CLEMU_API extern "C" __attribute__((visibility("default")))
#define CLEMU_REPORT(N) \
    CLEMU_API void __asan_report_load##N##_noabort(uintptr_t a) { bad_access(a, N, false, __builtin_return_address(0)); } \
    CLEMU_API void __asan_report_store##N##_noabort(uintptr_t a) { bad_access(a, N, true, __builtin_return_address(0)); }
CLEMU_REPORT(1) CLEMU_REPORT(2) CLEMU_REPORT(4) CLEMU_REPORT(8) CLEMU_REPORT(16)
#undef CLEMU_REPORT
CLEMU_API void __asan_report_load_n_noabort(uintptr_t a, size_t n) { bad_access(a, (unsigned)n, false, __builtin_return_address(0)); }
CLEMU_API void __asan_report_store_n_noabort(uintptr_t a, size_t n) { bad_access(a, (unsigned)n, true, __builtin_return_address(0)); }
// the out-of-line checks (accesses of odd sizes; and every access when the shadow is in software)
#define CLEMU_CHECK(N) \
    CLEMU_API void __asan_load##N##_noabort(uintptr_t a) { \
        if (!guard_owned(a, N)) bad_access(a, N, false, __builtin_return_address(0)); } \
    CLEMU_API void __asan_store##N##_noabort(uintptr_t a) { \
        if (!guard_owned(a, N)) bad_access(a, N, true, __builtin_return_address(0)); }
CLEMU_CHECK(1) CLEMU_CHECK(2) CLEMU_CHECK(4) CLEMU_CHECK(8) CLEMU_CHECK(16)
#undef CLEMU_CHECK
CLEMU_API void __asan_loadN_noabort(uintptr_t a, size_t n) {
    if (!guard_owned(a, n)) bad_access(a, (unsigned)n, false, __builtin_return_address(0)); }
CLEMU_API void __asan_storeN_noabort(uintptr_t a, size_t n) {
    if (!guard_owned(a, n)) bad_access(a, (unsigned)n, true, __builtin_return_address(0)); }
CLEMU_API void __asan_handle_no_return() {}

// UndefinedBehaviorSanitizer's data, as GCC lays it out
struct ub_loc { const char* file; unsigned line, column; };
struct ub_type { unsigned short kind, info; char name[1]; };
struct ub_oob_data { ub_loc loc; const ub_type* array; const ub_type* index; };
struct ub_div_data { ub_loc loc; const ub_type* type; };

static long long ub_int(const ub_type* t, uintptr_t v) {
    int bits = 1 << (t->info >> 1);
    if (!(t->info & 1) || bits >= 64) return (long long)v;
    unsigned long long m = 1ull << (bits - 1);
    unsigned long long x = (unsigned long long)v & ((m << 1) - 1);
    return (long long)((x ^ m) - m);   // sign-extended
}

[[noreturn]] static void ub_out_of_bounds(const ub_oob_data* d, uintptr_t index, const void* pc) {
    long long i = ub_int(d->index, index);
    set_failure(CLEMU_OOB, "out-of-range index%s: index %lld into an array of type %s (a local array of the thread, or "
                "an array inside a struct), by %s: a GPU reads or writes whatever lies beyond it. Check the index "
                "against the array's size", at_chain(pc).c_str(), i, d->array->name, where(clemu_cur).c_str());
    leave_kernel();
}
CLEMU_API void __ubsan_handle_out_of_bounds(const ub_oob_data* d, uintptr_t index) {
    ub_out_of_bounds(d, index, __builtin_return_address(0)); }
CLEMU_API void __ubsan_handle_out_of_bounds_abort(const ub_oob_data* d, uintptr_t index) {
    ub_out_of_bounds(d, index, __builtin_return_address(0)); }

[[noreturn]] static void ub_divide(const ub_div_data* d, uintptr_t lhs, uintptr_t rhs, const void* pc) {
    long long r = ub_int(d->type, rhs);
    char at[1200];
    snprintf(at, sizeof at, "%s", at_chain(pc).c_str());
    if (r == 0)
        set_failure(CLEMU_FPE, "integer division or remainder by zero%s (%lld / 0) by %s: a GPU does not stop there, "
                    "it computes an unspecified number and goes on, so the emulator stops to show you. Check the "
                    "divisor (a size that is 0 for this shape? a variable used before it is set?)",
                    at, ub_int(d->type, lhs), where(clemu_cur).c_str());
    else
        set_failure(CLEMU_FPE, "signed integer division overflow%s (%lld / %lld, whose result does not fit) by %s: a "
                    "GPU gives an unspecified number", at, ub_int(d->type, lhs), r, where(clemu_cur).c_str());
    leave_kernel();
}
struct ub_return_data { ub_loc loc; };
[[noreturn]] static void ub_missing_return(const void* pc) {
    set_failure(CLEMU_FAULT, "a function reached its end without returning its value%s, by %s: every path of a "
                "function that returns a value must end in `return value;` (on a GPU the caller gets garbage)",
                at_chain(pc).c_str(), where(clemu_cur).c_str());
    leave_kernel();
}
CLEMU_API void __ubsan_handle_missing_return(const ub_return_data*) { ub_missing_return(__builtin_return_address(0)); }

CLEMU_API void __ubsan_handle_divrem_overflow(const ub_div_data* d, uintptr_t l, uintptr_t r) {
    ub_divide(d, l, r, __builtin_return_address(0)); }
CLEMU_API void __ubsan_handle_divrem_overflow_abort(const ub_div_data* d, uintptr_t l, uintptr_t r) {
    ub_divide(d, l, r, __builtin_return_address(0)); }

// Device code's malloc, free, new and delete (the module is linked with --wrap for each): the
// device heap of guard.cpp, cudaLimitMallocHeapSize bytes (8 MB unless cl.set_heap_size raised it).
static void* device_alloc(size_t n) {
    void* p = guard_malloc(n);
    if (!p) heap_full_bytes.store((long long)n);
    return p;
}
[[noreturn]] static void bad_free(void* p, const char* how, const void* pc) {
    set_failure(CLEMU_FAULT, "%s(%p)%s by %s: that is no block malloc or new returned, or it was released already "
                "(a double free)", how, p, at_chain(pc).c_str(), where(clemu_cur).c_str());
    leave_kernel();
}
CLEMU_API void* __wrap_malloc(size_t n) { return device_alloc(n); }
// new T[n] with n negative or too large for the address space
CLEMU_API void __wrap___cxa_throw_bad_array_new_length() {
    set_failure(CLEMU_FAULT, "new[] of a negative or impossibly large number of elements%s by %s",
                at_chain(__builtin_return_address(0)).c_str(), where(clemu_cur).c_str());
    leave_kernel();
}
CLEMU_API void __wrap_free(void* p) { if (!guard_free(p)) bad_free(p, "free", __builtin_return_address(0)); }
CLEMU_API void* __wrap__Znwm(size_t n) { return device_alloc(n); }
CLEMU_API void* __wrap__Znam(size_t n) { return device_alloc(n); }
CLEMU_API void __wrap__ZdlPv(void* p) { if (!guard_free(p)) bad_free(p, "delete", __builtin_return_address(0)); }
CLEMU_API void __wrap__ZdaPv(void* p) { if (!guard_free(p)) bad_free(p, "delete[]", __builtin_return_address(0)); }
CLEMU_API void __wrap__ZdlPvm(void* p, size_t) { if (!guard_free(p)) bad_free(p, "delete", __builtin_return_address(0)); }
CLEMU_API void __wrap__ZdaPvm(void* p, size_t) { if (!guard_free(p)) bad_free(p, "delete[]", __builtin_return_address(0)); }

// Python's side of the guard: the shadow's offset for the compilers, a module's own data, the heap.
CLEMU_API unsigned long long clemu_guard_offset() {
    static bool once = false;
    if (!once) {
        once = true;
        guard_init();
        guard_allow(&clemu_hook_on, sizeof clemu_hook_on);   // flags the kernel headers read
        guard_allow(&clemu_count_on, sizeof clemu_count_on);
        guard_allow(&clemu_flat_shared, sizeof clemu_flat_shared);
    }
    return guard_offset();
}

// A kernel module just loaded: its data (__constant__ and __device__ variables, string literals,
// tables) is the kernel's to read and write; its code is not.
CLEMU_API int clemu_module_loaded(const char* path) {
    struct ctx { const char* path; int found; } c{path, 0};
    dl_iterate_phdr([](struct dl_phdr_info* info, size_t, void* data) -> int {
        ctx* c = (ctx*)data;
        if (!info->dlpi_name || strcmp(info->dlpi_name, c->path) != 0) return 0;
        for (int i = 0; i < info->dlpi_phnum; i++) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type == PT_LOAD && !(ph.p_flags & PF_X))
                guard_allow((const void*)(info->dlpi_addr + ph.p_vaddr), ph.p_memsz);
        }
        c->found = 1;
        return 1;
    }, &c);
    return c.found;
}

CLEMU_API int clemu_heap_limit(long long bytes) { return guard_heap_limit(bytes); }
CLEMU_API long long clemu_heap_bytes() { return guard_heap_bytes(); }
// what a kernel header gives the kernel of its own (a slot that stands for memory past an array)
CLEMU_API void clemu_own(const void* p, long long bytes) { guard_allow(p, (size_t)bytes); }

extern "C" __attribute__((visibility("default"))) [[noreturn]] void clemu_fault_misaligned(const void* p, int align,
                                                                                         int bytes) {
    std::string at = at_chain(__builtin_return_address(0));
    mem_place m = place_of(p);
    std::string what = m.space == SP_SHARED ? shared_what(p, m) : m.space == SP_GLOBAL && m.name ?
                       std::string("byte ") + std::to_string((const char*)p - m.lo) + " of argument `" + m.name + "`" :
                       "address " + std::to_string((uintptr_t)p);
    set_failure(CLEMU_FAULT, "misaligned access%s: %d bytes at %s, which is %d bytes past a multiple of %d, by %s: a GPU "
                "stops the kernel there (misaligned address). A vector type (float4, float2, half2...) is read and "
                "written only at a multiple of its size: check the offset the pointer is cast at",
                at.c_str(), bytes, what.c_str(), (int)((uintptr_t)p % align), align, where(clemu_cur).c_str());
    throw clemu_fault_exc();
}

// wmma's load and store need a 32-byte aligned pointer: say which array and which element it
// points at, and by how many bytes it misses, instead of the raw address.
extern "C" __attribute__((visibility("default"))) [[noreturn]] void clemu_wmma_misaligned(
        const void* p, int elem, const char* what, const char* file, int line) {
    mem_place m = place_of(p);
    long long off = m.lo ? (const char*)p - m.lo : 0;
    bool in = m.lo && off >= 0 && off < m.bytes;
    std::string at;
    if (in && m.space == SP_SHARED)
        at = shared_what(p, m) + (m.name ? " (byte " + std::to_string(off) + " of the array)" : std::string());
    else if (in && m.space == SP_GLOBAL)
        at = std::string("argument `") + m.name + "` + " + std::to_string(off) + " bytes (element " +
             std::to_string(off / elem) + ")";
    else at = describe_address((uintptr_t)p);
    tc_fault(CLEMU_FAULT, "wmma::%s at %s:%d: the pointer must be 32-byte (256-bit) aligned, but it points at %s, "
             "%d bytes past a 32-byte boundary: a tile's first element must sit at a multiple of 32 bytes (a row "
             "start whose row length is a multiple of 16 halves or 8 floats, a column that is a multiple of 16, "
             "and the array declared __align__(32))", what, file, line, at.c_str(), (int)((uintptr_t)p % 32));
}

extern "C" __attribute__((visibility("default"))) void clemu_ldmatrix_check(const void* row, const char* what) {
    const void* pc = __builtin_return_address(0);
    int lane = me() ? me()->pub.linear % 32 : 0;
    char role[64];
    snprintf(role, sizeof role, "lane %d's row address", lane);
    if ((uintptr_t)row % 16)
        tc_fault(CLEMU_FAULT, "%s%s: %s %p is not 16-byte aligned: each lane passes the start of a row of 8 halves "
                 "(16 bytes), so its column must be a multiple of 8 and the row pitch a multiple of 8 halves",
                 what, at_site(pc).c_str(), role, row);
    mem_place m = check_shared(row, 16, what, role, pc);
    if (!W->cp_words.empty()) cp_check(CLEMU_RD | CLEMU_SHARED, row, 16, m.name, m.name ? m.lo : nullptr, pc);
}

// After the warp's exchange: the row is read, for the profiler (one 16-byte shared load per lane,
// as ncu counts ldmatrix's wavefronts) and the race detector (per 4-byte word, as others write).
extern "C" __attribute__((visibility("default"))) void clemu_ldmatrix_hook(const void* row) {
    const void* pc = __builtin_return_address(0);
    fiber_thread* t = me();
    if (!t) return;
    if (prof_on) clprof_hook(CLEMU_RD | CLEMU_SHARED, row, 16, pc, t->pub.linear, t->pub.loop);
    if (!detect_on) return;
    mem_place m = place_of(row);
    int step = detect_step(m);
    for (int k = 0; k < 16; k += step)
        detect(CLEMU_RD | CLEMU_SHARED, (const char*)row + k, (unsigned)step, m.name, m.name ? m.lo : nullptr, pc);
}

extern "C" __attribute__((visibility("default"))) void clemu_cp_async(void* dst, const void* src, int bytes, int full) {
    const void* pc = __builtin_return_address(0);
    fiber_thread* t = me();
    if (!t || !W) clemu_fault(CLEMU_FAULT, "cp.async outside a kernel");
    const char* what = bytes == 16 ? "cp_async_16" : "cp_async_4";
    std::string at = at_site(pc);
    if ((uintptr_t)dst % bytes)
        tc_fault(CLEMU_FAULT, "%s%s: the destination %p is not %d-byte aligned: a %d-byte cp.async copies to and from "
                 "addresses that are multiples of %d", what, at.c_str(), dst, bytes, bytes, bytes);
    mem_place d = check_shared(dst, bytes, what, "the destination", pc);
    if (full) {
        if ((uintptr_t)src % bytes)
            tc_fault(CLEMU_FAULT, "%s%s: the source %p is not %d-byte aligned: a %d-byte cp.async copies to and from "
                     "addresses that are multiples of %d", what, at.c_str(), src, bytes, bytes, bytes);
        mem_place g = place_of(src);
        if (g.space == SP_SHARED || g.space == SP_LOCAL)
            tc_fault(CLEMU_FAULT, "%s%s: the source %p is %s, but cp.async copies from global memory: pass the "
                     "global pointer (a kernel argument plus an offset) second", what, at.c_str(), src,
                     g.space == SP_SHARED ? "shared memory" : "a local variable");
        if (g.space != SP_GLOBAL)
            tc_fault(CLEMU_OOB, "%s%s: the source is %s. Compute the address inside the input, or pass full=false "
                     "for a chunk that lies outside it (zero-fill: nothing is read)", what, at.c_str(),
                     describe_address((uintptr_t)src).c_str());
        long long off = (const char*)src - g.lo;
        if (off + bytes > g.bytes)
            tc_fault(CLEMU_OOB, "%s%s: the source, bytes [%lld, %lld) of argument `%s`, runs past its end (%lld bytes): "
                     "pass full=false for a chunk that lies outside the input (zero-fill: nothing is read)", what,
                     at.c_str(), off, off + bytes, g.name, g.bytes);
    }
    if (!W->cp_words.empty()) {
        for (uintptr_t w = (uintptr_t)dst; w < (uintptr_t)dst + bytes; w += 4) {
            auto it = W->cp_words.find(w);
            if (it == W->cp_words.end()) continue;
            std::string other = site(it->second.site);
            tc_fault(CLEMU_RACE, "%s%s writes %s, but the cp.async at %s by thread %s that copies into it is still in "
                     "flight: wait for that copy (cp_async_wait<N>(), then __syncthreads()) before reusing the buffer",
                     what, at.c_str(), shared_what((void*)w, d).c_str(), other.c_str(),
                     thread_in_block(it->second.thread, W->blk.dim).c_str());
        }
    }
    if (detect_on) cp_issue_sites.insert(pc);
    cp_copy c;
    c.dst = (unsigned char*)dst;
    c.bytes = bytes;
    c.group = t->cp_groups;
    c.site = pc;
    if (full) memcpy(c.data, src, (size_t)bytes);
    else memset(c.data, 0, (size_t)bytes);
    memset(dst, 0xFF, (size_t)bytes);   // undefined until the wait: NaN
    W->cp_pending[t->pub.linear].push_back(c);
    for (int k = 0; k < bytes; k += 4) W->cp_words[(uintptr_t)dst + k] = {t->pub.linear, c.group, pc};
    // the copy may land any time from now: it conflicts with what other threads do before a barrier
    if (detect_on)
        for (int k = 0, step = detect_step(d); k < bytes; k += step)
            detect(CLEMU_WR | CLEMU_SHARED, (char*)dst + k, (unsigned)step, d.name, d.name ? d.lo : nullptr, pc);
}

extern "C" __attribute__((visibility("default"))) void clemu_cp_async_commit() {
    if (me()) me()->cp_groups++;
}

// The thread's copies of every group but the n most recent committed ones land, as writes at the
// wait's line: a thread that reads them before a barrier races with it.
extern "C" __attribute__((visibility("default"))) void clemu_cp_async_wait(int n) {
    const void* pc = __builtin_return_address(0);
    fiber_thread* t = me();
    if (!t || !W) return;
    auto& mine = W->cp_pending[t->pub.linear];
    unsigned limit = t->cp_groups > (unsigned)n ? t->cp_groups - (unsigned)n : 0;
    size_t keep = 0;
    for (size_t i = 0; i < mine.size(); i++) {
        cp_copy& c = mine[i];
        if (c.group >= limit) { mine[keep++] = c; continue; }
        memcpy(c.dst, c.data, (size_t)c.bytes);
        for (int k = 0; k < c.bytes; k += 4) W->cp_words.erase((uintptr_t)c.dst + k);
        if (detect_on) {
            mem_place d = place_of(c.dst);
            for (int k = 0, step = detect_step(d); k < c.bytes; k += step)
                detect(CLEMU_WR | CLEMU_SHARED, c.dst + k, (unsigned)step, d.name, d.name ? d.lo : nullptr, pc);
        }
    }
    mine.resize(keep);
}

// ----------------------------------------------------------------------------------------
// Hopper's asynchronous path (clemu_hopper.h): warpgroup MMA, mbarriers, TMA loads.
//
// Model: a TMA copy lands when it is issued and counts its bytes against its mbarrier at once; a
// wgmma computes when the warpgroup issues it, from the shared tiles as they are then, and hands
// the result to the accumulators at the wgmma_wait that covers its commit group (until then they
// hold a signalling NaN). What the GPU leaves undefined is checked instead: every access to a
// chunk of shared memory is held against the copies and MMAs that use it (async_chunk).

static inline unsigned csr_quiet() {          // mask the invalid-operation trap (the runtime's own arithmetic)
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x80u);
    return old;
}
// While the thread has a wgmma in flight, arithmetic on its poisoned accumulators traps (SIGFPE,
// on_signal names the line). The fiber switch keeps each thread's MXCSR.
static void trap_update(fiber_thread* t) {
    unsigned c = _mm_getcsr() & ~1u;          // clear a stale invalid flag
    _mm_setcsr(t->inflight.empty() ? (c | 0x80u) : (c & ~0x80u));
}

// cuda_fp16.h's h2f (that header is the kernels', not the runtime's)
static float hp_h2f(uint16_t h) {
    uint32_t u = (uint32_t)(h & 0x7fff) << 13, e = u & 0x0f800000u;
    u += 0x38000000u;
    float f;
    if (e == 0x0f800000u) u += 0x38000000u;
    else if (e == 0) { u += 0x00800000u; memcpy(&f, &u, 4); f -= 6.10351562e-05f; memcpy(&u, &f, 4); }
    u |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &u, 4);
    return f;
}

// One m64nNk16 step for one output element: the accumulator c plus the 16 products a[k] * b[k],
// added as the GPU's tensor cores add them (clemu_mma_numerics.h).
static inline float wgmma_k16(float c, const float* a, const float* b) { return clemu::mma_k16(c, a, b); }

// The swizzles as functions of the shared address: 16-byte chunk bits [4:6] ^= bits [7:9] (128B),
// [4:5] ^= [7:8] (64B), [4] ^= [7] (32B).
static inline uintptr_t swizzle(uintptr_t a, int mode) {
    static const uintptr_t mask[4] = {0, 1, 3, 7};
    return a ^ (((a >> 7) & mask[mode & 3]) << 4);
}

static std::string file_line(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

static std::string warps_str(unsigned bits, int first_warp) {
    std::string s;
    for (int k = 0; k < 4; k++) {
        if (!((bits >> k) & 1u)) continue;
        int e = k;
        while (e + 1 < 4 && ((bits >> (e + 1)) & 1u)) e++;
        if (!s.empty()) s += ", ";
        s += std::to_string(first_warp + k) + (e > k ? "-" + std::to_string(first_warp + e) : "");
        k = e;
    }
    return (__builtin_popcount(bits) > 1 ? "warps " : "warp ") + s;
}

enum { WG_MMA = 4, WG_MMA_TF32 = 5 };
static const char* wg_name(int op, int n) {
    switch (op) {
        case CLEMU_WG_FENCE: return "wgmma_fence()";
        case CLEMU_WG_COMMIT: return "wgmma_commit()";
        case CLEMU_WG_WAIT: return "wgmma_wait<N>()";
        case CLEMU_WG_SETMAXNREG: return "setmaxnreg";
        case WG_MMA_TF32: return n == 64 ? "wgmma_m64n64k8_tf32" : "wgmma_m64n128k8_tf32";
        default: return n == 64 ? "wgmma_m64n64k16" : n == 128 ? "wgmma_m64n128k16" : "wgmma_m64n256k16";
    }
}

// What a thread has seen of an mbarrier's phases.
static mbar_seen* seen_of(fiber_thread* t, uintptr_t bar) {
    for (auto& s : t->seen) if (s.bar == bar) return &s;
    t->seen.push_back({bar, 0});
    return &t->seen.back();
}
static bool has_seen(fiber_thread* t, uintptr_t bar, unsigned long long phase) {
    for (auto& s : t->seen) if (s.bar == bar) return s.phases > phase;
    return false;
}

static std::string shared_name(const void* a) {
    mem_place m = place_of(a);
    if (m.space != SP_SHARED) return "address " + std::to_string((uintptr_t)a);
    return shared_what(a, m);
}

// "the mbarrier __shared__ full[1] (phase 3, parity 1: 0 of 1 arrivals and 8192 bytes still due)"
static std::string mbar_text(uintptr_t bar, const mbar_state& m) {
    char s[300];
    snprintf(s, sizeof s, "the mbarrier %s (current phase %llu, parity %llu: %lld of its %u arrivals and %lld bytes "
             "still due)", shared_name((void*)bar).c_str(), m.phase, m.phase & 1, m.pending, m.count, m.tx);
    return s;
}

// "inside argument `D` (global memory)", for an address that should be shared memory
static std::string not_shared(const void* a) {
    mem_place m = place_of(a);
    if (m.space == SP_GLOBAL) return std::string("it is inside argument `") + m.name + "`, global memory";
    if (m.space == SP_LOCAL) return "it is a local variable of the thread";
    return "it is in no shared array";
}

static mbar_state& mbar_get(void* bar, const char* what, const char* file, int line) {
    if (!W || !me()) clemu_fault(CLEMU_FAULT, "%s outside a kernel", what);
    mem_place m = place_of(bar);
    const char* lo = (const char*)bar;
    if (m.space != SP_SHARED || lo < m.lo || lo + 8 > m.lo + m.bytes)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the mbarrier is not in shared memory (%s): an mbarrier is a uint64_t "
                 "of a __shared__ array", what, file, line, not_shared(bar).c_str());
    if ((uintptr_t)bar % 8)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the mbarrier %s is not 8-byte aligned: declare it a uint64_t", what, file,
                 line, shared_name(bar).c_str());
    auto it = W->mbars.find((uintptr_t)bar);
    if (it == W->mbars.end())
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the mbarrier %s is used before mbar_init: one thread calls "
                 "mbar_init(&bar, count), then fence_mbar_init(), and a __syncthreads() orders that before every "
                 "other use", what, file, line, shared_name(bar).c_str());
    return it->second;
}

static void mbar_complete(mbar_state& m) {
    if (m.pending == 0 && m.tx == 0) { m.phase++; m.pending = m.count; m.announced_before = m.announced; m.announced = 0; }
}

extern "C" __attribute__((visibility("default"))) void clemu_mbar_init(void* bar, unsigned count, const char* file,
                                                                       int line) {
    mem_place m = place_of(bar);
    const char* lo = (const char*)bar;
    if (!W || !me()) clemu_fault(CLEMU_FAULT, "mbar_init outside a kernel");
    if (m.space != SP_SHARED || lo < m.lo || lo + 8 > m.lo + m.bytes || (uintptr_t)bar % 8)
        tc_fault(CLEMU_FAULT, "mbar_init at %s:%d: the mbarrier is not an 8-byte aligned uint64_t in shared memory "
                 "(%s): an mbarrier is an element of a __shared__ uint64_t array", file, line,
                 m.space == SP_SHARED ? "it is not 8-byte aligned" : not_shared(bar).c_str());
    if (count < 1 || count >= (1u << 20))
        tc_fault(CLEMU_FAULT, "mbar_init at %s:%d: count %u: an mbarrier expects 1 to 2^20 - 1 arrivals a phase",
                 file, line, count);
    mbar_state s{};
    s.count = count;
    s.pending = count;
    s.init_thread = me()->pub.linear;
    s.init_epoch = W->epoch;
    s.init_file = file;
    s.init_line = line;
    W->mbars[(uintptr_t)bar] = s;
}

// fence.mbarrier_init: the thread's inits so far become visible to the copy engine, and to the
// other threads once a barrier follows
extern "C" __attribute__((visibility("default"))) void clemu_fence_mbar_init(const char*, int) {
    fiber_thread* t = me();
    if (!W || !t) return;
    for (auto& kv : W->mbars)
        if (kv.second.init_thread == t->pub.linear && !kv.second.fenced) {
            kv.second.fenced = true;
            kv.second.fence_epoch = W->epoch;
        }
}

// A use of an mbarrier by this thread (or, async, by the copy engine on its behalf): the init must
// be visible to it, as on a GPU: fenced (fence_mbar_init) for the copy engine and other threads,
// and ordered by a __syncthreads() for other threads. Otherwise they may find it uninitialised.
static void mbar_visible(const mbar_state& m, void* bar, const char* what, const char* file, int line, bool async) {
    int self = me()->pub.linear;
    bool other = self != m.init_thread;
    std::string init = file_line(m.init_file, m.init_line), by = thread_in_block(m.init_thread, W->blk.dim);
    if (other && W->epoch <= m.init_epoch)
        tc_fault(CLEMU_RACE, "%s at %s:%d uses the mbarrier %s, which thread %s initialised at %s with no __syncthreads() "
                 "between that and this use: on a GPU this thread may find it uninitialised. After the mbar_init calls "
                 "(and fence_mbar_init()), put a __syncthreads() that every thread passes before any of them uses the "
                 "barriers", what, file, line, shared_name(bar).c_str(), by.c_str(), init.c_str());
    if ((other || async) && !m.fenced)
        tc_fault(CLEMU_RACE, "%s at %s:%d uses the mbarrier %s, which thread %s initialised at %s, but no "
                 "fence_mbar_init() followed that init: %s may find the barrier uninitialised. Call fence_mbar_init() "
                 "in the initialising thread after its mbar_init calls, before the __syncthreads()",
                 what, file, line, shared_name(bar).c_str(), by.c_str(), init.c_str(),
                 async ? "the copy engine, which completes the barrier's bytes," : "other threads");
    if (other && W->epoch <= m.fence_epoch)
        tc_fault(CLEMU_RACE, "%s at %s:%d uses the mbarrier %s, whose fence_mbar_init() in thread %s came after the "
                 "last __syncthreads(): the fence must come before the barrier that publishes the init (mbar_init, "
                 "fence_mbar_init(), then __syncthreads())", what, file, line, shared_name(bar).c_str(), by.c_str());
}

extern "C" __attribute__((visibility("default"))) void clemu_mbar_arrive(void* bar, unsigned tx, int expect,
                                                                         const char* file, int line) {
    const char* what = expect ? "mbar_arrive_expect_tx" : "mbar_arrive";
    mbar_state& m = mbar_get(bar, what, file, line);
    mbar_visible(m, bar, what, file, line, false);
    if (m.pending == 0)
        tc_fault(CLEMU_BARRIER, "%s at %s:%d: %s has had all its arrivals this phase and waits only for bytes: one "
                 "arrival too many (mbar_init's count is the number of mbar_arrive and mbar_arrive_expect_tx calls "
                 "of one phase)", what, file, line, mbar_text((uintptr_t)bar, m).c_str());
    if (expect) {
        m.tx += tx;
        m.announced += tx;
        m.tx_file = file;
        m.tx_line = line;
    }
    m.pending--;
    mbar_complete(m);
}

extern "C" __attribute__((visibility("default"))) void clemu_mbar_wait(void* bar, unsigned parity, const char* file,
                                                                       int line) {
    unsigned csr = csr_quiet();
    fiber_thread* t = me();
    mbar_state* m = &mbar_get(bar, "mbar_wait", file, line);
    mbar_visible(*m, bar, "mbar_wait", file, line, false);
    if ((m->phase & 1) == (parity & 1)) {     // that phase is still running: let the others work
        t->mbar = bar;
        t->mbar_parity = parity & 1;
        park(T_MBAR, file, line);
        m = &W->mbars[(uintptr_t)bar];
    }
    mbar_seen* s = seen_of(t, (uintptr_t)bar);
    // two phases or more since this thread last knew the barrier: the parity cannot tell them apart
    if (m->phase >= s->phases + 2)
        tc_fault(CLEMU_RACE, "mbar_wait at %s:%d returns for parity %u of the mbarrier %s, but %llu of its phases "
                 "(%llu to %llu) have completed since this thread last knew it: a parity tells a phase only from the "
                 "next one, so the thread cannot tell which phase's data it gets (here phase %llu's, not phase "
                 "%llu's). What completes this barrier's phases ran two phases ahead of this thread: a producer "
                 "waits until the consumers release a stage (its 'empty' mbarrier) before it refills the stage",
                 file, line, parity & 1, shared_name(bar).c_str(), m->phase - s->phases, s->phases, m->phase - 1,
                 m->phase - 1, s->phases);
    if (s->phases < m->phase) s->phases = m->phase;
    _mm_setcsr(csr);
}

extern "C" __attribute__((visibility("default"))) void clemu_fence_proxy_async(const char*, int) {
    if (me()) me()->fences++;
}

// A chunk's TMA copy or in-flight wgmma read, against an ordinary access by the running thread at pc
// (hooked launches of a kernel that uses the async path).
static void async_access(unsigned op, const void* addr, unsigned bytes, const void* pc) {
    fiber_thread* t = me();
    if (!t) return;
    bool wr = op & CLEMU_WR;
    for (uintptr_t c = (uintptr_t)addr & ~(uintptr_t)15; c < (uintptr_t)addr + bytes; c += 16) {
        auto it = W->chunks.find(c);
        if (it != W->chunks.end()) {
            async_chunk& k = it->second;
            if (k.tma && !has_seen(t, k.tma_bar, k.tma_phase)) {
                const mbar_state& m = W->mbars[k.tma_bar];
                set_failure(CLEMU_RACE, "%s %s at %s by %s, before this thread has waited for the copy that writes it: "
                    "the tma_load at %s (thread %s) lands when phase %llu (parity %llu) of the mbarrier %s completes, "
                    "and nothing orders this %s after that. Call mbar_wait(&bar, %llu) in this thread before the %s "
                    "(or have one thread wait, then __syncthreads())%s.",
                    wr ? "write to" : "read of", shared_name(addr).c_str(), site(pc).c_str(), where(clemu_cur).c_str(),
                    file_line(k.tma_file, k.tma_line).c_str(), thread_in_block(k.tma_thread, W->blk.dim).c_str(),
                    k.tma_phase, k.tma_phase & 1, shared_name((void*)k.tma_bar).c_str(), wr ? "write" : "read",
                    k.tma_phase & 1, wr ? "write" : "read",
                    m.phase > k.tma_phase ? "" : " (that phase has not even completed yet)");
                throw clemu_fault_exc();
            }
            if (wr && k.st_thread >= 0 && k.st_group >= W->threads[k.st_thread].bulk_read) {
                set_failure(CLEMU_RACE, "write to %s at %s by %s, while the tma_store at %s (thread %s) may still read "
                    "it: a TMA store reads shared memory after it is issued, until the bulk_wait_read<N>() of its "
                    "thread that covers its bulk group. Have that thread call bulk_wait_read<0>() (after "
                    "bulk_commit()), then a barrier, before anyone overwrites the staged tile.",
                    shared_name(addr).c_str(), site(pc).c_str(), where(clemu_cur).c_str(),
                    file_line(k.st_file, k.st_line).c_str(), thread_in_block(k.st_thread, W->blk.dim).c_str());
                throw clemu_fault_exc();
            }
            for (int g = 0; wr && g < MAX_WARPGROUPS; g++)
                if (((k.rd_mask >> g) & 1u) && k.rd_group[g] >= W->wgs[g].waited) {
                    set_failure(CLEMU_RACE, "write to %s at %s by %s, while the wgmma at %s of warpgroup %d still reads "
                        "it (no wgmma_wait covers its commit group yet, so the tensor cores may read the new value). "
                        "Overwrite a tile only after the wgmma_wait<N>() that covers the MMAs reading it (and, for "
                        "another warpgroup's tile, a barrier or mbarrier after that wait).",
                        shared_name(addr).c_str(), site(pc).c_str(), where(clemu_cur).c_str(),
                        file_line(k.rd_file[g], k.rd_line[g]).c_str(), g);
                    throw clemu_fault_exc();
                }
        }
        if (wr) {
            async_chunk& k = W->chunks[c];
            k.tma = false;
            k.written = true;
            k.w_site = pc;
            k.w_thread = t->pub.linear;
            k.w_fences = t->fences;
        }
    }
}

extern "C" __attribute__((visibility("default"))) void clemu_tma_load(void* dst, const clemu_tensor_map* map,
                                                                      void* bar, const int* c, int rank,
                                                                      const char* file, int line) {
    unsigned csr = csr_quiet();
    fiber_thread* t = me();
    char what[32];
    snprintf(what, sizeof what, "tma_load_%dd", rank);
    if (!t || !W) clemu_fault(CLEMU_FAULT, "%s outside a kernel", what);
    if (!map || map->magic != CLEMU_TMAP_MAGIC)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the map is not a tensor map: pass the address of the kernel's `const "
                 "__grid_constant__ CUtensorMap` parameter, made by cl.tensor_map(t, box)", what, file, line);
    if (map->rank != rank)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the tensor map has %d dimensions, but %d coordinates were given: call "
                 "tma_load_%dd", what, file, line, map->rank, rank, map->rank);
    // measured on an H100: a box whose innermost coordinate is not a multiple of 16 bytes stops the
    // kernel ("an illegal instruction was encountered"), inside the tensor or not
    if (((long long)c[0] * map->elem_bytes) % 16)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the box's innermost coordinate %d is %lld bytes into a row, not a "
                 "multiple of 16: a GPU stops the kernel there (an illegal instruction). Start boxes at multiples of "
                 "%d elements along the innermost dimension", what, file, line, c[0],
                 (long long)c[0] * map->elem_bytes, (int)(16 / map->elem_bytes));
    // with element strides, a copy traverses box[d] elements of dimension d (d >= 1) from c[d] in steps
    // of the stride, and loads ceil(box[d] / stride) of them (the innermost stride is ignored, as the
    // driver does without interleave)
    long long step[5] = {1, 1, 1, 1, 1}, count[5] = {map->box[0], 1, 1, 1, 1};
    for (int d = 1; d < rank; d++) {
        step[d] = map->elem_strides[d] ? map->elem_strides[d] : 1;
        count[d] = (map->box[d] + step[d] - 1) / step[d];
    }
    long long row = (long long)map->box[0] * map->elem_bytes, rows = 1;
    for (int d = 1; d < rank; d++) rows *= count[d];
    long long bytes = row * rows;
    static const int align[4] = {128, 256, 512, 1024};
    int need = align[map->swizzle & 3];
    if ((uintptr_t)dst % need)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the destination %s is %d bytes past a %d-byte boundary: a box in the "
                 "%s lands at a multiple of %d bytes", what, file, line, shared_name(dst).c_str(),
                 (int)((uintptr_t)dst % need), need,
                 map->swizzle == 3 ? "128-byte swizzle" : map->swizzle ? "swizzled layout" : "shared memory", need);
    check_shared(dst, (int)bytes, what, "the destination", __builtin_return_address(0));
    mbar_state& m = mbar_get(bar, what, file, line);
    mbar_visible(m, bar, what, file, line, true);
    unsigned char* base = (unsigned char*)dst;
    // the chunks it writes: none may still be read by a wgmma in flight
    for (long long o = 0; o < bytes; o += 16) {
        auto it = W->chunks.find((uintptr_t)base + o);
        if (it == W->chunks.end()) continue;
        async_chunk& k = it->second;
        for (int g = 0; g < MAX_WARPGROUPS; g++)
            if (((k.rd_mask >> g) & 1u) && k.rd_group[g] >= W->wgs[g].waited)
                tc_fault(CLEMU_RACE, "%s at %s:%d writes %s, which the wgmma at %s of warpgroup %d still reads (no "
                         "wgmma_wait covers its commit group yet). Refill a stage only after its consumers are done: "
                         "they wgmma_wait<N>() for the MMAs that read it, then arrive on the stage's 'empty' mbarrier, "
                         "and the producer waits for that before the copy", what, file, line,
                         shared_name(base + o).c_str(), file_line(k.rd_file[g], k.rd_line[g]).c_str(), g);
    }
    // the box: element i of row r at linear offset r * row + i * elem, then swizzled
    const unsigned char* src = (const unsigned char*)guard_staged((const void*)(uintptr_t)map->addr);
    int eb = (int)map->elem_bytes;
    long long idx[5] = {0, 0, 0, 0, 0};
    for (long long r = 0; r < rows; r++) {
        long long rem = r, off = 0;
        bool inside = true;
        for (int d = 1; d < rank; d++) {
            idx[d] = rem % count[d];
            rem /= count[d];
            long long g = (long long)c[d] + idx[d] * step[d];
            if (g < 0 || g >= map->dims[d]) inside = false;
            off += g * map->strides[d - 1];
        }
        for (long long i = 0; i < map->box[0]; i++) {
            uintptr_t a = swizzle((uintptr_t)(base + r * row + i * eb), map->swizzle);
            long long g = (long long)c[0] + i;
            if (inside && g >= 0 && g < map->dims[0]) memcpy((void*)a, src + off + g * eb, (size_t)eb);
            else memset((void*)a, 0, (size_t)eb);
        }
    }
    for (long long o = 0; o < bytes; o += 16) {
        async_chunk& k = W->chunks[(uintptr_t)base + o];
        k.tma = true;
        k.written = false;
        k.tma_file = file;
        k.tma_line = line;
        k.tma_thread = t->pub.linear;
        k.tma_bar = (uintptr_t)bar;
        k.tma_phase = m.phase;
    }
    if (m.tx - bytes < 0) {
        std::string before;
        if (!m.tx_file) before = " (no mbar_arrive_expect_tx announced any)";
        else if (m.announced == 0 && m.pending == (long long)m.count && m.phase > 0)
            before = " (its phase " + std::to_string(m.phase - 1) + " already completed when the copies before this "
                     "one brought the " + std::to_string(m.announced_before) + " bytes that mbar_arrive_expect_tx at " +
                     file_line(m.tx_file, m.tx_line) + " announced)";
        else before = " (mbar_arrive_expect_tx at " + file_line(m.tx_file, m.tx_line) + " announced " +
                      std::to_string(m.announced) + ")";
        tc_fault(CLEMU_BARRIER, "%s at %s:%d brings %lld bytes to %s, but only %lld bytes of its phase are still "
                 "expected, so its transaction count would go negative%s: mbar_arrive_expect_tx must announce, before "
                 "the copies, every byte the phase's copies bring (here %lld bytes a box)",
                 what, file, line, bytes, shared_name(bar).c_str(), m.tx, before.c_str(), bytes);
    }
    m.tx -= bytes;
    mbar_complete(m);
    _mm_setcsr(csr);
}

// A TMA store (cp.async.bulk.tensor ... global.shared::cta.bulk_group): the box is read from shared
// memory when issued and written to the tensor at once, only its elements inside the tensor. Each
// chunk it reads is checked: a TMA copy into it this thread has not waited for, an ordinary store
// into it that no fence_proxy_async (then a barrier) orders for the async proxy. The chunks stay
// read by the thread's open bulk group until a bulk_wait_read covers it (async_access).
extern "C" __attribute__((visibility("default"))) void clemu_tma_store(const void* src, const clemu_tensor_map* map,
                                                                       const int* c, int rank, const char* file,
                                                                       int line) {
    unsigned csr = csr_quiet();
    fiber_thread* t = me();
    char what[32];
    snprintf(what, sizeof what, "tma_store_%dd", rank);
    if (!t || !W) clemu_fault(CLEMU_FAULT, "%s outside a kernel", what);
    if (!map || map->magic != CLEMU_TMAP_MAGIC)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the map is not a tensor map: pass the address of the kernel's `const "
                 "__grid_constant__ CUtensorMap` parameter, made by cl.tensor_map(t, box)", what, file, line);
    if (map->rank != rank)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the tensor map has %d dimensions, but %d coordinates were given: call "
                 "tma_store_%dd", what, file, line, map->rank, rank, map->rank);
    if (((long long)c[0] * map->elem_bytes) % 16)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the box's innermost coordinate %d is %lld bytes into a row, not a "
                 "multiple of 16: start boxes at multiples of %d elements along the innermost dimension", what, file,
                 line, c[0], (long long)c[0] * map->elem_bytes, (int)(16 / map->elem_bytes));
    for (int d = 1; d < rank; d++)
        if (map->elem_strides[d] > 1)
            tc_fault(CLEMU_FAULT, "%s at %s:%d: the map has element strides: the emulator models TMA stores of "
                     "dense boxes only", what, file, line);
    long long row = (long long)map->box[0] * map->elem_bytes, rows = 1;
    for (int d = 1; d < rank; d++) rows *= map->box[d];
    long long bytes = row * rows;
    static const int align[4] = {128, 256, 512, 1024};
    int need = align[map->swizzle & 3];
    if ((uintptr_t)src % need)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the source %s is %d bytes past a %d-byte boundary: a box in the %s "
                 "starts at a multiple of %d bytes", what, file, line, shared_name(src).c_str(),
                 (int)((uintptr_t)src % need), need, map->swizzle ? "swizzled layout" : "shared memory", need);
    check_shared(src, (int)bytes, what, "the source", __builtin_return_address(0));
    const unsigned char* base = (const unsigned char*)src;
    for (long long o = 0; o < bytes; o += 16) {
        uintptr_t a = (uintptr_t)base + o;
        auto it = W->chunks.find(a);
        if (it != W->chunks.end()) {
            async_chunk& k = it->second;
            if (k.tma && !has_seen(t, k.tma_bar, k.tma_phase))
                tc_fault(CLEMU_RACE, "%s at %s:%d reads %s before this thread has waited for the tma_load at %s that "
                         "writes it: call mbar_wait on its mbarrier first", what, file, line, shared_name((void*)a).c_str(),
                         file_line(k.tma_file, k.tma_line).c_str());
            if (k.written) {
                fiber_thread& wt = W->threads[k.w_thread];
                if (!(wt.fences_at_bar > k.w_fences || (k.w_thread == t->pub.linear && wt.fences > k.w_fences)))
                    tc_fault(CLEMU_RACE, "%s at %s:%d reads %s, which thread %s wrote with an ordinary store at %s, but "
                             "no fence_proxy_async() makes that store visible to the copy engine (the async proxy): "
                             "add fence_proxy_async() after the stores at %s, before the barrier that orders them "
                             "before the store", what, file, line, shared_name((void*)a).c_str(),
                             thread_in_block(k.w_thread, W->blk.dim).c_str(), site(k.w_site).c_str(),
                             site(k.w_site).c_str());
            }
        }
        async_chunk& k = W->chunks[a];
        k.st_thread = t->pub.linear;
        k.st_group = t->bulk_groups;
        k.st_file = file;
        k.st_line = line;
    }
    // the tensor's staged copy for the launch (guard.cpp), as tma_load reads it: the original is
    // overwritten by that copy when the launch ends
    unsigned char* dst = (unsigned char*)(uintptr_t)guard_staged((const void*)(uintptr_t)map->addr);
    int eb = (int)map->elem_bytes;
    for (long long r = 0; r < rows; r++) {
        long long rem = r, off = 0;
        bool inside = true;
        for (int d = 1; d < rank; d++) {
            long long i = rem % map->box[d], g = (long long)c[d] + i;
            rem /= map->box[d];
            if (g < 0 || g >= map->dims[d]) inside = false;
            off += g * map->strides[d - 1];
        }
        if (!inside) continue;
        for (long long i = 0; i < map->box[0]; i++) {
            long long g = (long long)c[0] + i;
            if (g < 0 || g >= map->dims[0]) continue;
            memcpy(dst + off + g * eb, (const void*)swizzle((uintptr_t)(base + r * row + i * eb), map->swizzle),
                   (size_t)eb);
        }
    }
    _mm_setcsr(csr);
}

// cp.async.bulk.commit_group (op 0) and cp.async.bulk.wait_group.read n (op 1), per thread: a wait
// leaves at most n of its committed groups still reading their sources.
extern "C" __attribute__((visibility("default"))) void clemu_bulk_op(int op, int n, const char* file, int line) {
    fiber_thread* t = me();
    if (!t || !W) clemu_fault(CLEMU_FAULT, "%s outside a kernel", op ? "bulk_wait_read" : "bulk_commit");
    (void)file, (void)line;
    if (op == 0) t->bulk_groups++;
    else if (t->bulk_groups >= (unsigned long long)n && t->bulk_groups - n > t->bulk_read) t->bulk_read = t->bulk_groups - n;
}

// The tile a descriptor points at: its shared array (0 the dynamic buffer, k the k-th static
// array the block opened) and the start's offset in it; the layout (1: the 128-byte swizzle, the
// tile 1024-byte aligned; 0: none, 16-byte aligned) and its leading and stride byte offsets.
extern "C" __attribute__((visibility("default"))) unsigned long long clemu_smem_desc_any(const void* tile, int layout,
                                                                                         unsigned lbo, unsigned sbo,
                                                                                         const char* file, int line) {
    const char* name = layout == 0 ? "smem_desc_plain" : lbo == 16 ? "smem_desc_128b" : "smem_desc_128b_mn";
    if (!W || !me()) clemu_fault(CLEMU_FAULT, "%s outside a kernel", name);
    mem_place m = place_of(tile);
    const char* p = (const char*)tile;
    if (m.space != SP_SHARED || p < m.lo || p >= m.lo + (m.name ? m.bytes : MAX_DYN_SHARED))
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the tile is not in shared memory (%s): wgmma reads its "
                 "operands from a __shared__ array", name, file, line, not_shared(tile).c_str());
    int align = layout == 1 ? 1024 : 16;
    if ((uintptr_t)tile % align)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the tile %s is %d bytes past a %d-byte boundary: %s", name, file, line,
                 shared_name(tile).c_str(), (int)((uintptr_t)tile % align), align,
                 layout == 1 ? "a tile in the 128-byte swizzle starts at a multiple of 1024 bytes (round the shared "
                               "buffer's start up, and make each tile's size a multiple of 1024 bytes)"
                             : "a tile's rows of 16 bytes start at a multiple of 16 bytes");
    if (lbo % 16 || sbo % 16 || !lbo || !sbo || (lbo >> 18) || (sbo >> 18))
        tc_fault(CLEMU_FAULT, "%s at %s:%d: leading byte offset %u and stride byte offset %u: each a nonzero multiple "
                 "of 16 below 256 KB (the descriptor keeps them >> 4 in 14 bits)", name, file, line, lbo, sbo);
    unsigned long long region = 0;
    if (m.name)
        for (size_t i = 0; i < W->regions.size(); i++)
            if (W->regions[i].lo == m.lo) region = i + 1;
    unsigned long long off = (unsigned long long)(p - m.lo);
    if (off >> 18)
        tc_fault(CLEMU_FAULT, "%s at %s:%d: the tile lies %llu bytes into its shared array, past the "
                 "descriptor's 256 KB", name, file, line, off);
    return (off >> 4) | ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32) |
           (region << 52) | ((unsigned long long)layout << 62);
}

extern "C" __attribute__((visibility("default"))) unsigned long long clemu_smem_desc(const void* tile, const char* file,
                                                                                     int line) {
    return clemu_smem_desc_any(tile, 1, 16, 1024, file, line);
}

// An operand tile as a wgmma reads it (clemu_hopper.h): where it starts, its layout (1: the
// 128-byte swizzle, 0: none), its byte offsets, and whether it is M/N-major (a transposed operand).
struct operand_tile { const unsigned char* start; int layout; unsigned long long lbo, sbo; bool mn; };

// The 16-byte chunk of shared memory that holds 8 consecutive values of an operand tile: K-major,
// values k..k+7 (k = 0 or 8) of row mn; M/N-major, values mn..mn+7 (mn a multiple of 8) of K row k.
//   K-major, 128-byte swizzle: row mn at (mn / 8) * SBO + (mn % 8) * 128, its 16 values consecutive
//   K-major, no swizzle: core matrices of 8 rows x 16 bytes; rows 8.. SBO on, values 8..15 LBO on
//   M/N-major, 128-byte swizzle: K row k at (k / 8) * SBO + (k % 8) * 128, 64 M/N values a row,
//   the next 64 LBO on
static uintptr_t operand_chunk(const operand_tile& o, int mn, int k) {
    uintptr_t s = (uintptr_t)o.start;
    if (o.mn) return swizzle(s + (mn / 64) * o.lbo + (k / 8) * o.sbo + (k % 8) * 128 + (mn % 64) / 8 * 16, 3);
    if (o.layout == 1) return swizzle(s + (mn / 8) * o.sbo + (mn % 8) * 128 + (k / 8) * 16, 3);
    return s + (mn / 8) * o.sbo + (mn % 8) * 16 + (k / 8) * o.lbo;
}

// A descriptor's tile, checked: shared, a layout the emulator models for that major-ness, `rows`
// rows (M or N values) inside the array.
static operand_tile desc_tile(unsigned long long desc, int rows, bool mn, const char* operand, const char* what,
                              const char* file, int line) {
    unsigned long long region = (desc >> 52) & 0x3FF, off = (desc & 0x3FFF) << 4;
    unsigned long long lbo = ((desc >> 16) & 0x3FFF) << 4, sbo = ((desc >> 32) & 0x3FFF) << 4;
    int layout = (int)(desc >> 62);
    const char* lo;
    long long size;
    if (region == 0) { lo = (const char*)W->dyn_shared; size = W->blk.dyn_bytes; }
    else if (region <= W->regions.size()) { lo = W->regions[region - 1].lo; size = W->regions[region - 1].bytes; }
    else tc_fault(CLEMU_FAULT, "%s at %s:%d: %s's descriptor %#llx names no shared array of this block: make it with "
                  "smem_desc_128b(tile) (plus 2 per 16 columns)", what, file, line, operand, desc);
    operand_tile o{(const unsigned char*)lo + off, layout, lbo, sbo, mn};
    uintptr_t at = (uintptr_t)o.start;
    if (mn) {
        if (layout != 1 || sbo != 1024 || (rows > 64 && lbo % 1024))
            tc_fault(CLEMU_FAULT, "%s at %s:%d: %s is transposed (M/N-major), but its descriptor %#llx is not "
                     "smem_desc_128b_mn's (layout %d, stride byte offset %llu, leading byte offset %llu): the emulator "
                     "models M/N-major tiles in the 128-byte swizzle, 8-row groups of K 1024 bytes apart, each 64 M/N "
                     "values a multiple of 1024 bytes further", what, file, line, operand, desc, layout, sbo, lbo);
        if (at % 1024)
            tc_fault(CLEMU_FAULT, "%s at %s:%d: %s's descriptor starts %d bytes past a 1024-byte boundary: an M/N-major "
                     "tile in the 128-byte swizzle starts 1024-aligned, and desc + 128 (2048 bytes on) starts at its "
                     "K row 16", what, file, line, operand, (int)(at % 1024));
    } else if (layout == 1) {
        if (sbo != 1024)
            tc_fault(CLEMU_FAULT, "%s at %s:%d: %s's descriptor %#llx is not smem_desc_128b's (layout %d, stride byte "
                     "offset %llu): the emulator models K-major tiles in the 128-byte swizzle, 8-row groups 1024 bytes "
                     "apart", what, file, line, operand, desc, layout, sbo);
        if (at % 32 || at % 1024 >= 128)
            tc_fault(CLEMU_FAULT, "%s at %s:%d: %s's descriptor starts %d bytes past a 1024-byte boundary: a tile in "
                     "the 128-byte swizzle starts 1024-aligned, and desc + 2k (k = 0..3) starts at its columns "
                     "16k..16k+15", what, file, line, operand, (int)(at % 1024));
    } else if (layout != 0 || at % 16) {
        tc_fault(CLEMU_FAULT, "%s at %s:%d: %s's descriptor %#llx (layout %d, %d bytes past a 16-byte boundary) is "
                 "neither smem_desc_128b's nor smem_desc_plain's: the emulator models K-major tiles in the 128-byte "
                 "swizzle or without swizzle (16-byte aligned)", what, file, line, operand, desc, layout,
                 (int)(at % 16));
    }
    // the farthest chunk it reads, from the first byte of the array
    long long end = 0;
    for (int r = 0; r < rows; r += rows - 1 > 0 ? rows - 1 : 1)
        for (int k = 0; k < 16; k += mn ? 1 : 8) {
            uintptr_t c = operand_chunk(o, mn ? r / 8 * 8 : r, k) & ~(uintptr_t)(layout == 1 ? 1023 : 15);
            long long e = (long long)(c - (uintptr_t)lo) + (layout == 1 ? 1024 : 16);
            if (e > end) end = e;
        }
    if (end > size)
        tc_fault(CLEMU_OOB, "%s at %s:%d: %s's %d rows (to %lld bytes from the array's start) run past the end of %s "
                 "(%lld bytes)", what, file, line, operand, rows, end, region ? W->regions[region - 1].name :
                 "the launch's extern __shared__ memory", size);
    return o;
}

// Read an operand tile of `rows` M (or N) values x 16 K values into out[rows][16] (tf32: 8 K values
// a row, each float read as a tf32 operand, its top 19 bits: out[r][0..7]), checking each chunk for
// warpgroup g: a TMA copy into it that some thread of the warpgroup has not waited for, an ordinary
// store into it that no fence_proxy_async orders for the tensor cores. The wgmma's read is recorded
// on the chunk until the wait that covers `group`. bf16: the values are bf16.
static void read_tile(const operand_tile& o, int rows, float (*out)[16], bool bf16, bool tf32, int g,
                      unsigned long long group, const char* operand, const char* what, const char* file, int line) {
    fiber_thread* th = &W->threads[128 * g];
    int outer = o.mn ? 16 : rows, inner = o.mn ? rows / 8 : 2;
    for (int r = 0; r < outer; r++)
        for (int h = 0; h < inner; h++) {
            // K-major: row r, values 8h..8h+7; M/N-major: K row r, M/N values 8h..8h+7
            uintptr_t a = o.mn ? operand_chunk(o, 8 * h, r) : operand_chunk(o, r, 8 * h);
            auto it = W->chunks.find(a);
            if (it != W->chunks.end()) {
                async_chunk& k = it->second;
                if (k.tma)
                    for (int i = 0; i < 128; i++)
                        if (!has_seen(&th[i], k.tma_bar, k.tma_phase)) {
                            const mbar_state& m = W->mbars[k.tma_bar];
                            tc_fault(CLEMU_RACE, "%s at %s:%d reads %s (%s, row %d) before thread %s of the warpgroup "
                                "has waited for the copy that writes it: the tma_load at %s lands when phase %llu "
                                "(parity %llu) of the mbarrier %s completes%s. Call mbar_wait(&bar, %llu) in every "
                                "thread of the warpgroup before its wgmmas read the stage",
                                what, file, line, shared_name((void*)a).c_str(), operand, r,
                                thread_in_block(th[i].pub.linear, W->blk.dim).c_str(),
                                file_line(k.tma_file, k.tma_line).c_str(), k.tma_phase, k.tma_phase & 1,
                                shared_name((void*)k.tma_bar).c_str(),
                                m.phase > k.tma_phase ? "" : " (it has not completed yet)", k.tma_phase & 1);
                        }
                if (k.written) {
                    fiber_thread& wt = W->threads[k.w_thread];
                    bool mine = k.w_thread / 128 == g;
                    if (!(wt.fences_at_bar > k.w_fences || (mine && wt.fences > k.w_fences)))
                        tc_fault(CLEMU_RACE, "%s at %s:%d reads %s (%s, row %d), which thread %s wrote with an "
                            "ordinary store at %s, but no fence_proxy_async() makes that store visible to the tensor "
                            "cores (the async proxy): add fence_proxy_async() after the stores at %s, before the "
                            "__syncthreads() that orders them before the wgmma", what, file, line,
                            shared_name((void*)a).c_str(), operand, r,
                            thread_in_block(k.w_thread, W->blk.dim).c_str(), site(k.w_site).c_str(),
                            site(k.w_site).c_str());
                }
            }
            async_chunk& k = it != W->chunks.end() ? it->second : W->chunks[a];
            k.rd_mask |= 1u << g;
            k.rd_group[g] = group;
            k.rd_file[g] = file;
            k.rd_line[g] = line;
            if (tf32) {   // K-major only (wgmma's tf32 operands have no transposed form)
                uint32_t v[4];
                memcpy(v, (const void*)a, 16);
                for (int e = 0; e < 4; e++) out[r][4 * h + e] = clemu::tf32_operand(v[e]);
                continue;
            }
            uint16_t v[8];
            memcpy(v, (const void*)a, 16);
            for (int e = 0; e < 8; e++) {
                float f = bf16 ? clemu::bf16_value(v[e]) : hp_h2f(v[e]);
                if (o.mn) out[8 * h + e][r] = f;
                else out[r][8 * h + e] = f;
            }
        }
}

static bool is_poison(const float* d, int n) {
    for (int i = 0; i < n; i++) {
        unsigned u;
        memcpy(&u, &d[i], 4);
        if (u != CLEMU_WGMMA_POISON) return false;
    }
    return true;
}

static void poison(float* d, int n) {
    unsigned u = CLEMU_WGMMA_POISON;
    for (int i = 0; i < n; i++) memcpy(&d[i], &u, 4);
}

[[noreturn]] static void acc_touched(const fiber_thread& t, const wg_acc& e, const char* now, const char* file, int line) {
    int k = 0;
    while (k < e.n / 2 && is_poison(e.d + k, 1)) k++;
    tc_fault(CLEMU_RACE, "thread %s wrote its accumulator d[%d] while the wgmma at %s that computes into it was still "
             "in flight (found at the %s at %s:%d): a wgmma owns its accumulators from issue until the "
             "wgmma_wait<N>() that covers its commit group; write them before the wgmma_fence() that precedes the "
             "wgmma, or after that wait", thread_in_block(t.pub.linear, W->blk.dim).c_str(), k,
             file_line(e.file, e.line).c_str(), now, file, line);
}

// All 128 threads of warpgroup g have met at a wgmma (op WG_MMA: k16 of fp16, WG_MMA_TF32: k8 of
// tf32): compute it for each of them.
static void wgmma_issue(int g, int op, const char* file, int line) {
    fiber_thread* th = &W->threads[128 * g];
    fiber_thread& a = th[0];
    int n = a.wg_n;
    bool tf32 = op == WG_MMA_TF32;
    const char* what = wg_name(op, n);
    for (int i = 1; i < 128; i++)
        if (th[i].wg_da != a.wg_da || th[i].wg_db != a.wg_db || th[i].wg_acc_flag != a.wg_acc_flag ||
            th[i].wg_kind != a.wg_kind)
            tc_fault(CLEMU_FAULT, "%s at %s:%d: threads %s and %s of warpgroup %d pass different %s: the "
                     "descriptors, the accumulate flag and the operands' kind of a wgmma are the warpgroup's, the same "
                     "in all 128 threads", what, file, line, thread_in_block(a.pub.linear, W->blk.dim).c_str(),
                     thread_in_block(th[i].pub.linear, W->blk.dim).c_str(), g,
                     th[i].wg_da != a.wg_da ? "A descriptors" : th[i].wg_db != a.wg_db ? "B descriptors" :
                     th[i].wg_kind != a.wg_kind ? "operand kinds" : "accumulate flags");
    wg_state& s = W->wgs[g];
    static thread_local float A[64][16], B[256][16];
    int kind = a.wg_kind;
    bool bf16 = (kind & 3) == CLEMU_WG_BF16;
    operand_tile ta = desc_tile(a.wg_da, 64, (kind & CLEMU_WG_TRANS_A) != 0, "A", what, file, line);
    operand_tile tb = desc_tile(a.wg_db, n, (kind & CLEMU_WG_TRANS_B) != 0, "B", what, file, line);
    read_tile(ta, 64, A, bf16, tf32, g, s.committed, "A", what, file, line);
    read_tile(tb, n, B, bf16, tf32, g, s.committed, "B", what, file, line);
    for (int i = 0; i < 128; i++) {
        fiber_thread& t = th[i];
        wg_acc* e = nullptr;
        for (auto& x : t.inflight) if (x.d == t.wg_d) e = &x;
        if (e && !is_poison(t.wg_d, n / 2)) acc_touched(t, *e, what, file, line);
        if (!e && !s.fenced)
            tc_fault(CLEMU_RACE, "%s at %s:%d: no wgmma_fence() since the warpgroup last touched its accumulators "
                     "(%s%s): call wgmma_fence() before the first wgmma, and after any ordinary write of d, so the "
                     "MMA sees it", what, file, line, s.wait_file ? "the wgmma_wait at " : "the kernel's start",
                     s.wait_file ? file_line(s.wait_file, s.wait_line).c_str() : "");
        if (!e) {
            t.inflight.push_back({t.wg_d, n, 0, file, line, std::vector<float>(t.wg_d, t.wg_d + n / 2)});
            e = &t.inflight.back();
        }
        int w = i / 32, l = i % 32;
        for (int j = 0; j < n / 8; j++)
            for (int q = 0; q < 4; q++) {
                int row = 16 * w + l / 4 + 8 * (q >> 1), col = 8 * j + 2 * (l % 4) + (q & 1);
                float& v = e->val[4 * j + q];
                float c = t.wg_acc_flag ? v : 0.0f;
                v = tf32 ? clemu::mma_k8(c, A[row], B[col]) : wgmma_k16(c, A[row], B[col]);
            }
        e->group = s.committed;
        e->file = file;
        e->line = line;
        poison(t.wg_d, n / 2);
    }
}

static void wg_collective(int g, int op, int arg, const char* file, int line) {
    wg_state& s = W->wgs[g];
    fiber_thread* th = &W->threads[128 * g];
    if (op == CLEMU_WG_FENCE) s.fenced = true;
    else if (op == CLEMU_WG_COMMIT) s.committed++;
    else if (op == CLEMU_WG_WAIT) {
        if (s.committed >= (unsigned long long)arg && s.committed - arg > s.waited) s.waited = s.committed - arg;
        s.fenced = false;
        s.wait_file = file;
        s.wait_line = line;
        for (int i = 0; i < 128; i++) {
            auto& fl = th[i].inflight;
            size_t keep = 0;
            for (size_t k = 0; k < fl.size(); k++) {
                wg_acc& e = fl[k];
                if (e.group >= s.waited) { if (keep != k) fl[keep] = std::move(e); keep++; continue; }
                if (!is_poison(e.d, e.n / 2)) acc_touched(th[i], e, "wgmma_wait", file, line);
                memcpy(e.d, e.val.data(), sizeof(float) * (size_t)(e.n / 2));
            }
            fl.resize(keep);
        }
    } else if (op == WG_MMA || op == WG_MMA_TF32) wgmma_issue(g, op, file, line);
}

// A warpgroup instruction: wait for the other 127 threads (release() checks who comes), then the
// first of them to run on carries it out for all.
static void wg_meet(int op, int arg, const char* file, int line) {
    unsigned csr = csr_quiet();
    fiber_thread* t = me();
    if (!t || !W) clemu_fault(CLEMU_FAULT, "%s outside a kernel", wg_name(op, t ? t->wg_n : 0));
    t->wg_op = op;
    park(T_WG, file, line);
    wg_state& s = W->wgs[t->pub.linear / 128];
    if (s.done != s.gen) {
        s.done = s.gen;
        wg_collective(t->pub.linear / 128, op, arg, file, line);
    }
    _mm_setcsr(csr);
    trap_update(t);
}

extern "C" __attribute__((visibility("default"))) void clemu_wg_op(int op, int arg, const char* file, int line) {
    wg_meet(op, arg, file, line);
}

extern "C" __attribute__((visibility("default"))) void clemu_wgmma(float* d, int n, unsigned long long da,
                                                                   unsigned long long db, int accumulate, int kind,
                                                                   const char* file, int line) {
    fiber_thread* t = me();
    if (t) {
        t->wg_d = d; t->wg_n = n; t->wg_da = da; t->wg_db = db; t->wg_acc_flag = accumulate ? 1 : 0;
        t->wg_kind = kind;
    }
    wg_meet(WG_MMA, 0, file, line);
}

// wgmma m64nNk8 with .tf32 operands (clemu_hopper.h): the same tiles, descriptors and checks, 8 floats a row
extern "C" __attribute__((visibility("default"))) void clemu_wgmma_tf32(float* d, int n, unsigned long long da,
                                                                        unsigned long long db, int accumulate,
                                                                        const char* file, int line) {
    fiber_thread* t = me();
    if (t) {
        t->wg_d = d; t->wg_n = n; t->wg_da = da; t->wg_db = db; t->wg_acc_flag = accumulate ? 1 : 0;
        t->wg_kind = CLEMU_WG_F16;   // K-major operands (read as tf32 by the op)
    }
    wg_meet(WG_MMA_TF32, 0, file, line);
}

// a float -> half conversion of a wgmma accumulator's poison (cuda_fp16.h's f2h)
extern "C" __attribute__((visibility("default"))) [[noreturn]] void clemu_poison_read() {
    const void* pc = __builtin_return_address(0);
    fiber_thread* t = me();
    std::string wg = t && !t->inflight.empty() ? " at " + file_line(t->inflight[0].file, t->inflight[0].line) +
                     ", which is still in flight" : " before the wgmma_wait that delivered it";
    set_failure(CLEMU_RACE, "read of a wgmma accumulator at %s by %s: it holds the emulator's poison (a signalling "
                "NaN), so it was read while the wgmma%s. Its value exists only after the wgmma_wait<N>() that covers "
                "its commit group: put wgmma_commit() and wgmma_wait<0>() (or a smaller N that covers that group) "
                "before the read", site(pc).c_str(), where(clemu_cur).c_str(), wg.c_str());
    throw clemu_fault_exc();
}

// The block's threads met a barrier: what any thread saw of an mbarrier, each has seen now, and
// fences before it order earlier stores for the async proxy.
static void merge_at_barrier(worker* w, int n) {
    std::vector<mbar_seen> all;
    for (int i = 0; i < n; i++) {
        for (auto& s : w->threads[i].seen) {
            bool found = false;
            for (auto& a : all) if (a.bar == s.bar) { found = true; if (a.phases < s.phases) a.phases = s.phases; }
            if (!found) all.push_back(s);
        }
        w->threads[i].fences_at_bar = w->threads[i].fences;
    }
    if (!all.empty())
        for (int i = 0; i < n; i++) w->threads[i].seen = all;
}

// "256 at __syncthreads() at f:12, 1 at mbar_wait at f:30 (empty[2]), 127 returned"
static std::string where_others(worker* w, int n) {
    struct spot { std::string text; int count; };
    std::vector<spot> spots;
    for (int i = 0; i < n; i++) {
        fiber_thread& t = w->threads[i];
        std::string s;
        if (t.state == T_DONE) s = "returned";
        else if (t.state == T_BAR) s = "wait at __syncthreads() at " + file_line(t.site_file, t.site_line);
        else if (t.state == T_WARP) s = "wait at a warp operation at " + file_line(t.site_file, t.site_line);
        else if (t.state == T_WG) s = "wait at " + std::string(wg_name(t.wg_op, t.wg_n)) + " at " +
                                      file_line(t.site_file, t.site_line);
        else if (t.state == T_NBAR) s = "wait at named_barrier_sync(" + std::to_string(t.nbar_id) + ", " +
                                        std::to_string(t.nbar_threads) + ") at " + file_line(t.site_file, t.site_line);
        else if (t.state == T_MBAR) s = "wait at mbar_wait at " + file_line(t.site_file, t.site_line) + " on " +
                                        shared_name(t.mbar) + " for parity " + std::to_string(t.mbar_parity);
        else continue;
        bool found = false;
        for (auto& p : spots) if (p.text == s) { p.count++; found = true; }
        if (!found) spots.push_back({s, 1});
    }
    std::string out;
    for (auto& p : spots) out += (out.empty() ? "" : "; ") + std::to_string(p.count) + " " + p.text;
    return out;
}

// Which warps of warpgroup g wait at a's instruction, and where threads of a neighbouring warpgroup
// wait at the same line (the role spans two warpgroups): "warps 1-3 of warpgroup 0 (threads 0-127)
// reach it. Warp 4 of warpgroup 1 waits at the same line: the threads that run it span two warpgroups."
static std::string wg_who(worker* w, int n, int g, const fiber_thread* a) {
    auto& th = w->threads;
    auto warps_at = [&](int h) {
        unsigned bits = 0;
        for (int i = 128 * h; i < 128 * h + 128 && i < n; i++)
            if (th[i].state == T_WG && th[i].site_line == a->site_line && !strcmp(th[i].site_file, a->site_file))
                bits |= 1u << ((i - 128 * h) / 32);
        return bits;
    };
    std::string s = warps_str(warps_at(g), 4 * g) + " of warpgroup " + std::to_string(g) + " (warps " +
                    std::to_string(4 * g) + "-" + std::to_string(4 * g + 3) + ", threads " + std::to_string(128 * g) +
                    "-" + std::to_string(128 * g + 127) + ") reach it.";
    for (int h = g - 1; h <= g + 1; h += 2) {
        if (h < 0 || h * 128 >= n) continue;
        unsigned bits = warps_at(h);
        if (bits) {
            std::string who = warps_str(bits, 4 * h);
            who[0] = 'W';
            s += " " + who + " of warpgroup " + std::to_string(h) + (__builtin_popcount(bits) > 1 ? " wait" : " waits") +
                 " at the same line: the threads that run it span two warpgroups.";
        }
    }
    return s;
}

// Warpgroup instructions: a warpgroup moves on when all 128 of its threads are at the same one.
// False, with the fault set, when some never can.
static bool release_warpgroups(worker* w, int n, bool& released) {
    auto& th = w->threads;
    for (int g = 0; g * 128 < n; g++) {
        int lo = 128 * g, hi = lo + 128 < n ? lo + 128 : n, here = 0;
        fiber_thread* a = nullptr;
        for (int i = lo; i < hi; i++)
            if (th[i].state == T_WG) { here++; if (!a) a = &th[i]; }
        if (!here) continue;
        const char* what = wg_name(a->wg_op, a->wg_n);
        for (int i = lo; i < hi; i++) {
            fiber_thread& t = th[i];
            if (t.state == T_WG && (t.site_line != a->site_line || strcmp(t.site_file, a->site_file))) {
                set_failure(CLEMU_BARRIER, "threads of warpgroup %d of block %s execute different warpgroup "
                    "instructions: thread %s %s at %s:%d, thread %s %s at %s:%d. The 128 threads of a warpgroup "
                    "execute each wgmma, wgmma_fence/commit/wait and setmaxnreg together (.sync.aligned), at the same "
                    "line: keep them out of branches that split a warpgroup", g, block_str(&w->blk).c_str(),
                    tid_str(&a->pub).c_str(), what, a->site_file, a->site_line, tid_str(&t.pub).c_str(),
                    wg_name(t.wg_op, t.wg_n), t.site_file, t.site_line);
                return false;
            }
        }
        if (hi - lo < 128) {
            set_failure(CLEMU_BARRIER, "%s at %s:%d in block %s: warpgroup %d has only %d threads (the block has %d): "
                "a warpgroup is 4 whole warps, 128 threads, so a kernel that uses warpgroup instructions launches "
                "blocks of a multiple of 128 threads", what, a->site_file, a->site_line, block_str(&w->blk).c_str(), g,
                hi - lo, n);
            return false;
        }
        for (int i = lo; i < hi; i++)
            if (th[i].state == T_DONE || th[i].state == T_FAULT) {
                set_failure(CLEMU_BARRIER, "%s at %s:%d in block %s is executed by only %d of the 128 threads of "
                    "warpgroup %d: %s Thread %s had already returned. A warpgroup is 4 consecutive warps from a warp "
                    "index divisible by 4, and all 128 of its threads execute each wgmma, wgmma_fence/commit/wait and "
                    "setmaxnreg together: choose roles by threadIdx.x / 128, not by warp or thread",
                    what, a->site_file, a->site_line, block_str(&w->blk).c_str(), here, g,
                    wg_who(w, n, g, a).c_str(), tid_str(&th[i].pub).c_str());
                return false;
            }
        if (here == 128) {
            for (int i = lo; i < hi; i++) th[i].state = T_RUN;
            w->wgs[g].gen++;
            released = true;
        }
    }
    return true;
}

// Nothing can move and some warpgroup waits for threads that are elsewhere.
static void warpgroup_stuck(worker* w, int n) {
    auto& th = w->threads;
    for (int g = 0; g * 128 < n; g++) {
        fiber_thread* a = nullptr;
        for (int i = 128 * g; i < 128 * g + 128 && i < n && !a; i++) if (th[i].state == T_WG) a = &th[i];
        if (!a) continue;
        set_failure(CLEMU_BARRIER, "%s at %s:%d in block %s waits for threads that never come: %s (The block's "
            "threads: %s.) A warpgroup is 4 consecutive warps from a warp index divisible by 4, and all 128 of its "
            "threads execute each wgmma, wgmma_fence/commit/wait and setmaxnreg together: choose roles by "
            "threadIdx.x / 128", wg_name(a->wg_op, a->wg_n), a->site_file, a->site_line, block_str(&w->blk).c_str(),
            wg_who(w, n, g, a).c_str(), where_others(w, n).c_str());
        return;
    }
}

// Nothing can move and some thread waits on an mbarrier phase that cannot complete.
static void mbar_deadlock(worker* w, int n) {
    fiber_thread* a = nullptr;   // a waiter whose barrier misses bytes says the most, then one that misses arrivals
    for (int pass = 0; pass < 2 && !a; pass++)
        for (int i = 0; i < n && !a; i++) {
            fiber_thread& t = w->threads[i];
            if (t.state == T_MBAR && (pass == 1 || w->mbars[(uintptr_t)t.mbar].tx != 0)) a = &t;
        }
    const mbar_state& m = w->mbars[(uintptr_t)a->mbar];
    std::string fix;
    if (m.pending > 0)
        fix += " It needs " + std::to_string(m.pending) + " more arrival" + (m.pending > 1 ? "s" : "") +
               ": mbar_init's count (" + std::to_string(m.count) + ") is the number of mbar_arrive and "
               "mbar_arrive_expect_tx calls each phase gets.";
    if (m.tx > 0)
        fix += " Its copies brought " + std::to_string(m.tx) + " bytes fewer than announced (" +
               std::to_string(m.announced) + " by mbar_arrive_expect_tx at " + file_line(m.tx_file, m.tx_line) +
               "): announce exactly the bytes of the boxes that the phase's tma_load calls fetch.";
    // a waiter whose barrier completed a phase and has had nothing since may have meant that phase
    for (int i = 0; i < n; i++) {
        fiber_thread& t = w->threads[i];
        if (t.state != T_MBAR) continue;
        const mbar_state& b = w->mbars[(uintptr_t)t.mbar];
        if (b.phase > 0 && b.pending == (long long)b.count && b.tx == 0 && b.announced == 0) {
            fix += " Thread " + tid_str(&t.pub) + " waits at " + file_line(t.site_file, t.site_line) + " for parity " +
                   std::to_string(t.mbar_parity) + " of " + shared_name(t.mbar) + ", whose phase " +
                   std::to_string(b.phase - 1) + " (parity " + std::to_string((b.phase - 1) & 1) + ") has completed "
                   "and whose next phase has had no arrival: if it meant the phase that completed, its parity is off "
                   "by one (mbar_wait(bar, p) returns once the phase of parity p has completed; the k-th phase, from "
                   "0, has parity k & 1).";
            break;
        }
    }
    if (m.pending == 0 && m.tx == 0 && fix.empty())
        fix += " Check the parity: mbar_wait(bar, p) returns once the phase of parity p has completed, and phases "
               "alternate 0, 1, 0, ...";
    set_failure(CLEMU_BARRIER, "deadlock in block %s: thread %s waits at mbar_wait at %s:%d for the phase of parity %u "
        "of %s, and nothing can complete it (the block's threads: %s).%s",
        block_str(&w->blk).c_str(), tid_str(&a->pub).c_str(), a->site_file, a->site_line, a->mbar_parity,
        mbar_text((uintptr_t)a->mbar, m).c_str(), where_others(w, n).c_str(), fix.c_str());
}

// named_barrier_sync(id, threads): bar.sync id, threads. Barrier id completes when `threads` threads
// (whole warps) have arrived; they then move on, ordered after one another's earlier accesses.
extern "C" __attribute__((visibility("default"))) void clemu_named_barrier(int id, int threads, const char* file,
                                                                           int line) {
    fiber_thread* t = me();
    if (!t || !W) clemu_fault(CLEMU_FAULT, "named_barrier_sync outside a kernel");
    int n = (int)(W->blk.dim.x * W->blk.dim.y * W->blk.dim.z);
    if (id < 1 || id > 15)
        tc_fault(CLEMU_FAULT, "named_barrier_sync(%d, %d) at %s:%d: the barrier id is 1 to 15 (0 is __syncthreads()'s)",
                 id, threads, file, line);
    if (threads < 32 || threads % 32 || threads > n)
        tc_fault(CLEMU_FAULT, "named_barrier_sync(%d, %d) at %s:%d: the thread count is a multiple of 32 (whole warps), "
                 "at most the block's %d", id, threads, file, line, n);
    t->nbar_id = id;
    t->nbar_threads = threads;
    park(T_NBAR, file, line);
}

// Threads that met (a named barrier, a warp operation): what one of them knew of the mbarriers'
// phases, each knows now.
static void share_seen(worker* w, const std::vector<int>& who) {
    auto& th = w->threads;
    std::vector<mbar_seen> seen;
    for (int i : who)
        for (auto& s : th[i].seen) {
            bool found = false;
            for (auto& a : seen) if (a.bar == s.bar) { found = true; if (a.phases < s.phases) a.phases = s.phases; }
            if (!found) seen.push_back(s);
        }
    for (int i : who)
        for (auto& s : seen) {
            mbar_seen* mine = seen_of(&th[i], s.bar);
            if (mine->phases < s.phases) mine->phases = s.phases;
        }
}

// The threads of a named barrier that has filled: they share what they saw of mbarriers, their
// fences count as before a barrier, and for the race detector each is ordered after the others'
// accesses before it.
static void named_barrier_pass(worker* w, int n, const std::vector<int>& who) {
    auto& th = w->threads;
    if (th[0].nb_sync.empty())
        for (int i = 0; i < n; i++) th[i].nb_sync.assign(n, 0);
    std::vector<unsigned> m(n, 0);
    for (int i : who) {
        th[i].nb_count++;
        for (int j = 0; j < n; j++) if (th[i].nb_sync[j] > m[j]) m[j] = th[i].nb_sync[j];
    }
    for (int i : who) m[i] = th[i].nb_count;
    share_seen(w, who);
    for (int i : who) {
        th[i].nb_sync = m;
        th[i].fences_at_bar = th[i].fences;
        th[i].state = T_RUN;
    }
}

// Named barriers that have filled move on; false, with the fault set, where the threads at one
// disagree on its count or are more than it.
static bool release_named(worker* w, int n, bool& released) {
    auto& th = w->threads;
    for (int id = 1; id <= 15; id++) {
        std::vector<int> who;
        for (int i = 0; i < n; i++) if (th[i].state == T_NBAR && th[i].nbar_id == id) who.push_back(i);
        if (who.empty()) continue;
        fiber_thread& a = th[who[0]];
        for (int i : who)
            if (th[i].nbar_threads != a.nbar_threads) {
                set_failure(CLEMU_BARRIER, "threads of block %s wait at named barrier %d with different thread counts: "
                    "thread %s passes %d at %s:%d, thread %s passes %d at %s:%d. All threads of one named barrier pass "
                    "the same count", block_str(&w->blk).c_str(), id, tid_str(&a.pub).c_str(), a.nbar_threads,
                    a.site_file, a.site_line, tid_str(&th[i].pub).c_str(), th[i].nbar_threads, th[i].site_file,
                    th[i].site_line);
                return false;
            }
        if ((int)who.size() > a.nbar_threads) {
            set_failure(CLEMU_BARRIER, "named_barrier_sync(%d, %d) at %s:%d in block %s: %d threads wait at barrier %d, "
                "more than its count %d: two groups of threads use the same barrier id at once (give each its own "
                "id, e.g. the warpgroup's index) or the count is too small", id, a.nbar_threads, a.site_file,
                a.site_line, block_str(&w->blk).c_str(), (int)who.size(), id, a.nbar_threads);
            return false;
        }
        if ((int)who.size() == a.nbar_threads) {
            named_barrier_pass(w, n, who);
            released = true;
        }
    }
    return true;
}

static void named_deadlock(worker* w, int n) {
    fiber_thread* a = nullptr;
    int here = 0;
    for (int i = 0; i < n; i++)
        if (w->threads[i].state == T_NBAR) { if (!a) a = &w->threads[i]; if (w->threads[i].nbar_id == a->nbar_id) here++; }
    set_failure(CLEMU_BARRIER, "deadlock in block %s: named_barrier_sync(%d, %d) at %s:%d waits for %d threads, but "
        "only %d arrive (the block's threads: %s). The count is the number of threads (whole warps) that call it "
        "with that id each time: e.g. 128 for one warpgroup", block_str(&w->blk).c_str(), a->nbar_id, a->nbar_threads,
        a->site_file, a->site_line, a->nbar_threads, here, where_others(w, n).c_str());
}

// A thread that returns with a wgmma in flight never gets its result.
static void check_thread_end(fiber_thread* t) {
    if (t->inflight.empty() || !W) return;
    const wg_acc& e = t->inflight[0];
    bool committed = e.group < W->wgs[t->pub.linear / 128].committed;
    set_failure(CLEMU_RACE, "%s returned while the wgmma at %s still computes into its accumulators (%s): its result "
        "never arrives, and what the thread read of them was the emulator's poison (NaN). End the MMAs with %s"
        "wgmma_wait<0>() before reading the accumulators", where(&t->pub).c_str(), file_line(e.file, e.line).c_str(),
        committed ? "no wgmma_wait covers its commit group" : "it was never committed",
        committed ? "" : "wgmma_commit(); ");
    t->state = T_FAULT;
}

// ----------------------------------------------------------------------------------------
static void fiber_entry(void* arg) {
    fiber_thread* t = (fiber_thread*)arg;
    clemu_cur = &t->pub;
    try {
        L->body(L->args);
        threads_done.fetch_add(1, std::memory_order_relaxed);
        t->state = T_DONE;
        check_thread_end(t);
    } catch (clemu_fault_exc&) {
        t->state = T_FAULT;
    } catch (std::exception& e) {
        set_failure(CLEMU_FAULT, "C++ exception in %s: %s", where(&t->pub).c_str(), e.what());
        t->state = T_FAULT;
    } catch (...) {
        set_failure(CLEMU_FAULT, "C++ exception in %s", where(&t->pub).c_str());
        t->state = T_FAULT;
    }
#if defined(__x86_64__)
    clemu_switch(&t->sp, W->sched_sp);
#else
    setcontext(&W->sched_ctx);
#endif
    abort();   // never resumed
}

static void ensure_stacks(worker* w, int n, long long stack_bytes) {
    if (w->stacks && w->n_stacks >= n && w->stack_bytes == stack_bytes) return;
    if (w->stacks) {
        guard_forbid(w->stacks, (size_t)w->n_stacks * w->stack_bytes);
        munmap(w->stacks, (size_t)w->n_stacks * w->stack_bytes);
    }
    size_t total = (size_t)n * stack_bytes;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { w->stacks = nullptr; w->n_stacks = 0; return; }
    w->stacks = (char*)p;
    w->n_stacks = n;
    w->stack_bytes = stack_bytes;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        mprotect(w->stacks + (size_t)i * stack_bytes, page, PROT_NONE);   // guard
        guard_allow(w->stacks + (size_t)i * stack_bytes + page, (size_t)(stack_bytes - page));
    }
}

static void make_order(std::vector<int>& order, int n, int mode, unsigned seed) {
    order.resize(n);
    for (int i = 0; i < n; i++) order[i] = mode == 1 ? n - 1 - i : i;
    if (mode == 2) {
        uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
        for (int i = n - 1; i > 0; i--) {
            s ^= s << 13; s ^= s >> 7; s ^= s << 17;
            int j = (int)(s % (uint64_t)(i + 1));
            std::swap(order[i], order[j]);
        }
    }
}

// The lanes of warp `wp` parked at warp operations (`here`): each lane's own bit is in its mask, and
// every lane its mask names that is here passed the same mask (CUDA leaves the result undefined
// otherwise: a GPU may return anything, or hang). False, with the fault set, when not.
static bool warp_masks_agree(worker* w, int wp, unsigned here, int n) {
    auto& th = w->threads;
    auto lane = [&](int l) -> fiber_thread& { return th[wp * 32 + l]; };
    unsigned outside = 0;
    for (int l = 0; l < 32; l++)
        if (((here >> l) & 1u) && !((lane(l).warp_mask >> l) & 1u)) outside |= 1u << l;
    if (outside) {
        fiber_thread& a = lane(__builtin_ctz(outside));
        unsigned same = 0;   // the lanes of the first such call: same line, same mask
        for (int l = 0; l < 32; l++)
            if (((outside >> l) & 1u) && lane(l).warp_mask == a.warp_mask && lane(l).site_line == a.site_line &&
                !strcmp(lane(l).site_file, a.site_file)) same |= 1u << l;
        unsigned callers = 0;
        for (int l = 0; l < 32; l++)
            if (((here >> l) & 1u) && lane(l).site_line == a.site_line && !strcmp(lane(l).site_file, a.site_file))
                callers |= 1u << l;
        char fix[16];
        snprintf(fix, sizeof fix, "%#010x", callers);
        set_failure(CLEMU_WARP,
            "warp operation at %s:%d in block %s: %s of warp %d call it with mask %#010x, which leaves %s out. "
            "Each lane that calls a *_sync warp operation must have its own bit set in the mask (on a GPU the "
            "result is undefined): %s call it here, so pass %s%s",
            a.site_file, a.site_line, block_str(&w->blk).c_str(), lanes_str(same).c_str(), wp, a.warp_mask,
            __builtin_popcount(same) > 1 ? "them" : "it", lanes_str(callers).c_str(), fix,
            callers == 0xffffffffu ? " (the whole warp)" : "");
        return false;
    }
    (void)n;
    for (int l = 0; l < 32; l++) {
        if (!((here >> l) & 1u)) continue;
        unsigned named = lane(l).warp_mask & here;
        for (int k = 0; k < 32; k++) {
            if (!((named >> k) & 1u) || lane(k).warp_mask == lane(l).warp_mask) continue;
            unsigned ml = 0, mk = 0;   // the lanes that pass each of the two masks
            for (int j = 0; j < 32; j++) {
                if (!((here >> j) & 1u)) continue;
                if (lane(j).warp_mask == lane(l).warp_mask) ml |= 1u << j;
                if (lane(j).warp_mask == lane(k).warp_mask) mk |= 1u << j;
            }
            set_failure(CLEMU_WARP,
                "warp operation in block %s, warp %d: %s pass mask %#010x at %s:%d, but %s pass mask %#010x at "
                "%s:%d, and each mask names lanes of the other. The lanes of one warp operation must all pass "
                "the same mask (on a GPU the result is undefined): compute it once, before any branch, and pass "
                "that value in every lane",
                block_str(&w->blk).c_str(), wp, lanes_str(ml).c_str(), lane(l).warp_mask, lane(l).site_file,
                lane(l).site_line, lanes_str(mk).c_str(), lane(k).warp_mask, lane(k).site_file, lane(k).site_line);
            return false;
        }
    }
    return true;
}

// Decide what the parked threads of a block may do next. Returns false on a fault.
static bool release(worker* w, int n, bool& all_done) {
    auto& th = w->threads;
    all_done = true;
    int n_done = 0, n_bar = 0, n_warp = 0, n_wg = 0, n_mbar = 0, n_nbar = 0;
    for (int i = 0; i < n; i++) {
        int s = th[i].state;
        if (s == T_DONE) n_done++;
        else if (s == T_BAR) n_bar++;
        else if (s == T_WARP) n_warp++;
        else if (s == T_WG) n_wg++;
        else if (s == T_MBAR) n_mbar++;
        else if (s == T_NBAR) n_nbar++;
        if (s != T_DONE) all_done = false;
    }
    if (all_done) return true;
    // 1. warp operations: a warp moves on when every lane its mask names has arrived
    bool released = false;
    int n_warps = (n + 31) / 32;
    for (int wp = 0; wp < n_warps && n_warp; wp++) {
        unsigned need = 0, here = 0, alive = 0;
        for (int l = 0; l < 32 && wp * 32 + l < n; l++) {
            fiber_thread& t = th[wp * 32 + l];
            if (t.state != T_DONE) alive |= 1u << l;
            if (t.state == T_WARP) { here |= 1u << l; need |= t.warp_mask; }
        }
        if (!here) continue;
        if (!warp_masks_agree(w, wp, here, n)) return false;
        unsigned exists = (wp * 32 + 32 <= n) ? 0xffffffffu : ((1u << (n - wp * 32)) - 1u);
        need &= exists;
        unsigned exited = need & ~alive;
        if (exited) {
            fiber_thread& any = th[wp * 32 + __builtin_ctz(here)];
            set_failure(CLEMU_WARP,
                "warp operation at %s:%d in block %s: its mask %#010x names %s of warp %d, but %s (%s) already "
                "returned: every lane the mask names must reach the same warp operation (leave those lanes out of "
                "the mask, or keep them alive until it)",
                any.site_file, any.site_line, block_str(&w->blk).c_str(), any.warp_mask, lanes_str(exited).c_str(), wp,
                __builtin_popcount(exited) > 1 ? "those threads" : "that thread",
                tid_str(&th[wp * 32 + __builtin_ctz(exited)].pub).c_str());
            return false;
        }
        if ((need & here) == need) {
            bool seen = false;
            for (int l = 0; l < 32 && wp * 32 + l < n; l++)
                if (th[wp * 32 + l].state == T_WARP) {
                    th[wp * 32 + l].state = T_RUN;
                    seen |= !th[wp * 32 + l].seen.empty();
                }
            if (seen) {   // a lane that waited on an mbarrier, then __syncwarp(): the others may read the copy
                std::vector<int> lanes;
                for (int l = 0; l < 32 && wp * 32 + l < n; l++)
                    if ((here >> l) & 1u) lanes.push_back(wp * 32 + l);
                share_seen(w, lanes);
            }
            released = true;
        }
    }
    // warpgroup instructions, and mbarrier waits whose phase has completed
    if (n_wg && !release_warpgroups(w, n, released)) return false;
    for (int i = 0; i < n && n_mbar; i++) {
        fiber_thread& t = th[i];
        if (t.state != T_MBAR) continue;
        auto it = w->mbars.find((uintptr_t)t.mbar);
        if (it != w->mbars.end() && (it->second.phase & 1) != t.mbar_parity) { t.state = T_RUN; released = true; }
    }
    if (n_nbar && !release_named(w, n, released)) return false;
    if (released) return true;
    if (n_wg && !n_warp) { warpgroup_stuck(w, n); return false; }
    if (n_mbar && !n_warp) { mbar_deadlock(w, n); return false; }
    if (n_nbar && !n_warp) { named_deadlock(w, n); return false; }
    // 2. the block barrier
    if (n_warp) {
        // the first warp that waits: the lanes its masks name that wait at a __syncthreads() instead
        fiber_thread* a = nullptr;
        for (int i = 0; i < n && !a; i++) if (th[i].state == T_WARP) a = &th[i];
        int wp = a->pub.linear / 32;
        unsigned here = 0, need = 0, at_bar = 0;
        for (int l = 0; l < 32 && wp * 32 + l < n; l++) {
            fiber_thread& t = th[wp * 32 + l];
            if (t.state == T_WARP) { here |= 1u << l; need |= t.warp_mask; }
            if (t.state == T_BAR) at_bar |= 1u << l;
        }
        unsigned missing = need & ~here;
        if (missing & at_bar) {
            fiber_thread& b = th[wp * 32 + __builtin_ctz(missing & at_bar)];
            set_failure(CLEMU_WARP,
                "deadlock in block %s: %s of warp %d wait at a warp operation at %s:%d with mask %#010x, which names "
                "%s, but %s wait at __syncthreads() at %s:%d. Every lane the mask names must reach the same warp "
                "operation: leave the others out of the mask, or let every lane call it.",
                block_str(&w->blk).c_str(), lanes_str(here).c_str(), wp, a->site_file, a->site_line, a->warp_mask,
                lanes_str(missing & at_bar).c_str(), __builtin_popcount(missing & at_bar) > 1 ? "they" : "it", b.site_file,
                b.site_line);
        } else
            set_failure(CLEMU_WARP,
                "deadlock in block %s: thread %s waits at a warp operation at %s:%d for lanes its mask %#010x names "
                "that never reach it: every lane the mask names must call the same warp operation",
                block_str(&w->blk).c_str(), tid_str(&a->pub).c_str(), a->site_file, a->site_line, a->warp_mask);
        return false;
    }
    fiber_thread* first = nullptr;
    for (int i = 0; i < n; i++) if (th[i].state == T_BAR) { first = &th[i]; break; }
    if (n_done) {
        fiber_thread* gone = nullptr;
        for (int i = 0; i < n; i++) if (th[i].state == T_DONE) { gone = &th[i]; break; }
        set_failure(CLEMU_BARRIER,
            "__syncthreads() at %s:%d was reached by only %d of the %d threads of block %s; the other %d had "
            "already returned (for example thread %s). Every thread of a block must reach every "
            "__syncthreads(): keep all threads alive through the barriers (guard the loads and the store "
            "with `if`, instead of returning early). On a GPU this is undefined behaviour: it may hang, or "
            "seem to work while threads read shared memory that was never loaded.",
            first->site_file, first->site_line, n_bar, n, block_str(&w->blk).c_str(), n_done, tid_str(&gone->pub).c_str());
        return false;
    }
    for (int i = 0; i < n; i++) {
        fiber_thread& t = th[i];
        if (t.site_line != first->site_line || strcmp(t.site_file, first->site_file) != 0) {
            int n_first = 0;
            for (int j = 0; j < n; j++)
                if (th[j].site_line == first->site_line && strcmp(th[j].site_file, first->site_file) == 0) n_first++;
            set_failure(CLEMU_BARRIER,
                "threads of block %s wait at different __syncthreads(): %d at %s:%d (e.g. thread %s) and %d at "
                "%s:%d (e.g. thread %s). A barrier inside an if/else whose condition differs between threads "
                "is undefined behaviour in CUDA: move the __syncthreads() out of the branch.",
                block_str(&w->blk).c_str(), n_first, first->site_file, first->site_line, tid_str(&first->pub).c_str(),
                n - n_first, t.site_file, t.site_line, tid_str(&t.pub).c_str());
            return false;
        }
    }
    // all arrived at the same barrier: reduce the predicates (for __syncthreads_count/and/or)
    int count = 0;
    for (int i = 0; i < n; i++) count += th[i].pred;
    int op = first->bar_op;
    bar_result = op == 0 ? count : op == 1 ? (count == n) : (count > 0);
    for (int i = 0; i < n; i++) { th[i].state = T_RUN; th[i].pred = 0; th[i].bar_op = 0; th[i].seq = 0; }
    merge_at_barrier(w, n);
    if (prof_on) clprof_epoch(n, 1);   // what each warp did since the last barrier becomes requests
    w->epoch++;
    return true;
}

// What kernel code of a launch reads of the runtime (guard.cpp): its threads' threadIdx and
// blockIdx, the warp exchange's slots, and the launch's dynamic shared memory (shared= bytes).
static void own_launch_fields(worker* w, int n, bool own) {
    auto mark = own ? guard_allow : guard_forbid;
    for (int i = 0; i < n && i < (int)w->threads.size(); i++) mark(&w->threads[i].pub, sizeof(clemu_thread));
    mark(&w->blk, sizeof w->blk);
    mark(w->warp_slots.data(), w->warp_slots.size() * sizeof(unsigned long long));
    mark(w->warp_regs.data(), w->warp_regs.size() * sizeof(unsigned));
    if (L && L->shared_bytes) mark(w->dyn_shared, (size_t)L->shared_bytes);
    if (!own)
        for (auto& g : w->regions) guard_forbid(g.lo, (size_t)g.bytes);   // the block's static __shared__ arrays
}

// The frame a kernel called from run_block starts at: everything of the OS thread's stack below it
// is the running CUDA thread's (run_block's own frame and those above it are not).
__attribute__((noinline)) static char* callee_frame() { return (char*)__builtin_frame_address(0); }

static void own_stack_below(worker* w, char* top) {
    if (!w->stack_lo || w->stack_owned == top) return;
    long page = sysconf(_SC_PAGESIZE);
    if (w->stack_owned) guard_forbid(w->stack_lo, (size_t)(w->stack_owned - w->stack_lo));
    guard_allow(w->stack_lo + page, (size_t)(top - w->stack_lo - page));
    w->stack_owned = top;
}

static bool run_block_fibers(worker* w, const std::vector<int>& order, int n) {
    auto& th = w->threads;
    for (int i = 0; i < n; i++) {
        fiber_thread& t = th[i];
        t.state = T_RUN;
        t.pred = 0;
        t.bar_op = 0;
        t.warp_gen = 0;
        char* top = w->stacks + (size_t)(i + 1) * w->stack_bytes;
        t.sp = fiber_prepare(top, w->stack_bytes, fiber_entry, &t);
    }
    for (;;) {
        for (int k = 0; k < n; k++) {
            fiber_thread& t = th[order[k]];
            if (t.state != T_RUN) continue;
            clemu_cur = &t.pub;
            w->running = &t;
#if defined(__x86_64__)
            clemu_switch(&w->sched_sp, t.sp);
#else
            swapcontext(&w->sched_ctx, &((uctx_fiber*)t.sp)->uc);
#endif
            w->running = nullptr;
            clemu_cur = nullptr;
            if (t.state == T_FAULT) return false;
            if (failed.load()) return false;
        }
        bool all_done;
        if (!release(w, n, all_done)) return false;
        if (all_done) return true;
    }
}

static void run_block(worker* w, long long b) {
    const clemu_launch* l = L;
    unsigned gx = l->grid[0], gy = l->grid[1];
    w->blk.idx = uint3{(unsigned)(b % gx), (unsigned)((b / gx) % gy), (unsigned)(b / ((long long)gx * gy))};
    w->blk.serial = block_serial.fetch_add(1) + 1;
    w->epoch = 0;
    if (detect_on) serial_block[w->blk.serial] = w->blk.idx;
    if (l->shared_bytes) memset(w->dyn_shared, 0xFF, (size_t)l->shared_bytes);   // NaN: unloaded shared memory shows
    int bx = l->block[0], by = l->block[1];
    int n = l->block[0] * l->block[1] * l->block[2];
    static thread_local std::vector<int> order;
    make_order(order, n, l->order, l->seed ^ (unsigned)(b * 2654435761u));
    auto& th = w->threads;
    w->regions.clear();
    w->static_bytes = 0;
    w->cp_words.clear();
    w->mbars.clear();
    w->chunks.clear();
    for (auto& g : w->wgs) g = wg_state();
    for (int i = 0; i < n; i++) {
        th[i].seq = 0;
        th[i].warp_gen = 0;
        th[i].cp_groups = 0;
        th[i].fences = th[i].fences_at_bar = 0;
        th[i].bulk_groups = th[i].bulk_read = 0;
        th[i].seen.clear();
        th[i].inflight.clear();
        th[i].nb_count = 0;
        th[i].nb_sync.clear();
        w->cp_pending[i].clear();
        th[i].pub.idx = uint3{(unsigned)(i % bx), (unsigned)((i / bx) % by), (unsigned)(i / (bx * by))};
        th[i].pub.blk = &w->blk;
        th[i].pub.linear = i;
        th[i].pub.loop = 0;
    }
    if (!l->use_fibers) {
        own_stack_below(w, callee_frame());   // called here: at the depth the kernel's body is called from
        for (int k = 0; k < n; k++) {
            fiber_thread& t = th[order[k]];
            clemu_cur = &t.pub;
            w->running = &t;
            try {
                l->body(l->args);
                threads_done.fetch_add(1, std::memory_order_relaxed);
            } catch (clemu_fault_exc&) {
                clemu_cur = nullptr;
                return;
            } catch (...) {
                set_failure(CLEMU_FAULT, "C++ exception in %s", where(&t.pub).c_str());
                clemu_cur = nullptr;
                return;
            }
            if ((k & 63) == 63 && failed.load()) break;
        }
        w->running = nullptr;
        clemu_cur = nullptr;
        if (prof_on) clprof_epoch(n, 0);
        blocks_done.fetch_add(1, std::memory_order_relaxed);
        return;
    }
    if (run_block_fibers(w, order, n)) {
        if (prof_on) clprof_epoch(n, 0);
        blocks_done.fetch_add(1, std::memory_order_relaxed);
    }
}

// ----------------------------------------------------------------------------------------
// Signals: SIGUSR2 stops a worker (timeout or another worker's fault); SIGSEGV/SIGBUS/SIGFPE
// inside a kernel become a fault message. Anything outside a kernel goes to the old handler.
static struct sigaction old_segv, old_bus, old_fpe, old_ill, old_trap, old_usr2;

static std::string describe_address(uintptr_t a) {
    char s[400];
    if (W && W->stack_lo && a + 65536 >= (uintptr_t)W->stack_lo && a < (uintptr_t)W->stack_lo + (uintptr_t)sysconf(_SC_PAGESIZE)) {
        snprintf(s, sizeof s, "a stack overflow: the thread's local variables (or a recursion) need more than the %lld KB "
                 "of stack the emulator's CPU thread has (a GPU thread has far less): make local arrays smaller, put them "
                 "in shared memory, or end the recursion", (long long)(W->stack_hi - W->stack_lo) >> 10);
        return s;
    }
    if (W && W->stacks) {
        uintptr_t lo = (uintptr_t)W->stacks, hi = lo + (uintptr_t)W->n_stacks * W->stack_bytes;
        if (a >= lo && a < hi && ((a - lo) % W->stack_bytes) < (uintptr_t)sysconf(_SC_PAGESIZE)) {
            snprintf(s, sizeof s, "a stack overflow: the thread's local variables need more than the %lld KB "
                     "the emulator gives each CUDA thread (a GPU gives far less): make local arrays smaller "
                     "or put them in shared memory", W->stack_bytes >> 10);
            return s;
        }
    }
    if (L) {
        for (int i = 0; i < L->n_bufs; i++) {
            uintptr_t lo = (uintptr_t)L->bufs[i].p, hi = lo + (uintptr_t)L->bufs[i].nbytes;
            if (a >= hi && a < hi + (1u << 24)) {
                snprintf(s, sizeof s, "address %#lx, %lu bytes past the end of argument `%s` (%lld bytes)",
                         (unsigned long)a, (unsigned long)(a - hi), L->buf_names[i], L->bufs[i].nbytes);
                return s;
            }
            if (a < lo && a + (1u << 24) > lo) {
                snprintf(s, sizeof s, "address %#lx, %lu bytes before the start of argument `%s`",
                         (unsigned long)a, (unsigned long)(lo - a), L->buf_names[i]);
                return s;
            }
        }
    }
    snprintf(s, sizeof s, "address %#lx, outside every buffer argument (a wild pointer, or an index far out of range)", (unsigned long)a);
    return s;
}

static void* fault_pc(void* uctx) {
#if defined(__x86_64__)
    // +1: sites are return addresses elsewhere, and the name lookup steps back one byte
    return (void*)(((ucontext_t*)uctx)->uc_mcontext.gregs[REG_RIP] + 1);
#else
    (void)uctx;
    return nullptr;
#endif
}

static void on_signal(int sig, siginfo_t* info, void* uctx) {
    worker* w = W;
    if (w && sig == SIGUSR2) {
        // the watchdog's stop: jump out of a kernel that is running; a worker that has already
        // left it ignores the late signal (its default action would end the whole process)
        if (w->in_kernel.load() && w->running) {
            if (hook_site) {
                // inside the detector's bookkeeping (it allocates): stop when the hook returns
                w->stop_pc = (void*)hook_site;
                stop_pending = 1;
                return;
            }
            w->stop_pc = fault_pc(uctx);
            siglongjmp(w->jmp, 1);
        }
        return;
    }
    if (w && w->in_kernel.load()) {
        const clemu_thread* t = clemu_cur;
        std::string at = at_site(fault_pc(uctx));
        fiber_thread* ft = me();
        if (sig == SIGFPE && info->si_code == FPE_FLTINV && ft && !ft->inflight.empty())
            set_failure(CLEMU_RACE, "read of a wgmma accumulator%s by %s while the wgmma at %s that computes into it "
                        "is still in flight: its value exists only after the wgmma_wait<N>() that covers its commit "
                        "group (until then the emulator leaves a signalling NaN there). Put wgmma_commit() and "
                        "wgmma_wait<0>() (or a smaller N that covers that group) before this line", at.c_str(),
                        where(t).c_str(), file_line(ft->inflight[0].file, ft->inflight[0].line).c_str());
        else if (sig == SIGFPE)
            set_failure(CLEMU_FPE, "integer division fault%s in %s: a division or remainder by zero, or INT_MIN / -1 "
                        "(signed division overflow). A GPU does not stop there: it computes an unspecified number",
                        at.c_str(), where(t).c_str());
        else if (sig == SIGILL || sig == SIGTRAP)
            set_failure(CLEMU_FAULT, "the CPU stopped on a trap instruction%s in %s: the compiler puts one where the "
                        "program's behaviour is undefined, most often a function that can reach its end without "
                        "`return` (a __device__ function that returns a value must return one on every path), or a "
                        "__builtin_trap()", at.c_str(), where(t).c_str());
        else if (uintptr_t app; sig == SIGSEGV && guard_in_shadow((uintptr_t)info->si_addr, &app)) {
            // the guard's inline check faulted on the shadow itself: an address the launch owns nothing near
            int status;
            std::string d = guard_what(app, 1, false, &status);
            // the check cannot tell a load from a store: say "access"
            for (const char* w : {"out-of-range load", "out-of-range store"})
                if (d.rfind(w, 0) == 0) d = "out-of-range access" + d.substr(strlen(w));
            if (d.rfind("load ", 0) == 0 || d.rfind("store ", 0) == 0) d = "access " + d.substr(d.find(' ') + 1);
            set_failure(status, "%s%s by %s", d.c_str(), at.c_str(), where(t).c_str());
        } else {
            std::string d = describe_address((uintptr_t)info->si_addr);
            bool stack = d.rfind("a stack overflow", 0) == 0;
            set_failure(stack ? CLEMU_STACK : CLEMU_SEGV, "%s%s in %s: %s",
                        stack ? "stack overflow" : "invalid memory access", stack ? "" : at.c_str(), where(t).c_str(), d.c_str());
        }
        siglongjmp(w->jmp, 1);
    }
    struct sigaction* old = sig == SIGSEGV ? &old_segv : sig == SIGBUS ? &old_bus : sig == SIGFPE ? &old_fpe
                          : sig == SIGILL ? &old_ill : sig == SIGTRAP ? &old_trap : &old_usr2;
    if (old->sa_flags & SA_SIGINFO) { if (old->sa_sigaction) old->sa_sigaction(sig, info, uctx); return; }
    if (old->sa_handler == SIG_IGN) return;
    if (old->sa_handler == SIG_DFL) { sigaction(sig, old, nullptr); raise(sig); return; }
    old->sa_handler(sig);
}

static void install_signals() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &old_segv);
    sigaction(SIGBUS, &sa, &old_bus);
    sigaction(SIGFPE, &sa, &old_fpe);
    sigaction(SIGILL, &sa, &old_ill);
    sigaction(SIGTRAP, &sa, &old_trap);
    sigaction(SIGUSR2, &sa, &old_usr2);
}

// ----------------------------------------------------------------------------------------
static void* worker_main(void* arg) {
    worker* w = (worker*)arg;
    W = w;
    stack_t ss;
    w->altstack = (char*)malloc(1 << 16);
    ss.ss_sp = w->altstack; ss.ss_size = 1 << 16; ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    w->dyn_shared = (unsigned char*)aligned_alloc(1024, MAX_DYN_SHARED);   // as aligned as a GPU's (WMMA needs 32 B)
    guard_allow(&clemu_cur, sizeof clemu_cur);   // kernels read threadIdx through it
    pthread_attr_t at;
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
        void* lo; size_t bytes;
        pthread_attr_getstack(&at, &lo, &bytes);
        w->stack_lo = (char*)lo;
        w->stack_hi = (char*)lo + bytes;
        pthread_attr_destroy(&at);
    }
    unsigned long long seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> g(pool_mu);
            pool_cv.wait(g, [&] { return launch_gen != seen; });
            seen = launch_gen;
            if (w->index >= workers_active) continue;
        }
        int n = L->block[0] * L->block[1] * L->block[2];
        if ((int)w->threads.size() < n) w->threads.resize(n);
        w->warp_slots.assign((size_t)((n + 31) / 32) * 64, 0);
        w->warp_regs.assign((size_t)((n + 31) / 32) * 64 * CLEMU_XCHG_REGS, 0);
        if ((int)w->cp_pending.size() < n) w->cp_pending.resize(n);
        w->blk.dim = dim3(L->block[0], L->block[1], L->block[2]);
        w->blk.grid = dim3(L->grid[0], L->grid[1], L->grid[2]);
        w->blk.dyn_shared = w->dyn_shared;
        w->blk.dyn_bytes = L->shared_bytes;
        w->shared_limit = L->shared_limit;
        if (L->use_fibers) {
            ensure_stacks(w, n, L->stack_bytes);
            if (!w->stacks) set_failure(CLEMU_LAUNCH, "could not allocate %d fiber stacks", n);
        }
        own_launch_fields(w, n, true);
        if (sigsetjmp(w->jmp, 0) != 0) _mm_setcsr(0x1F80);   // a fault in a wgmma's window left its trap on
        else {
            w->in_kernel.store(1);
            for (;;) {
                if (failed.load()) break;
                long long b = next_block.fetch_add(1);
                if (b >= n_blocks) break;
                run_block(w, b);
            }
        }
        w->in_kernel.store(0);
        w->running = nullptr;
        w->sched_sp = nullptr;
        clemu_cur = nullptr;
        own_launch_fields(w, n, false);
        {
            std::lock_guard<std::mutex> g(pool_mu);
            workers_done++;
        }
        done_cv.notify_all();
    }
    return nullptr;
}

static void grow_pool(int n) {
    static bool signals = false;
    if (!signals) { install_signals(); signals = true; }
    while ((int)pool.size() < n) {
        worker* w = new worker();
        w->index = (int)pool.size();
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 8 << 20);
        pthread_create(&w->tid, &attr, worker_main, w);
        pthread_attr_destroy(&attr);
        pool.push_back(w);
    }
}

// A launch is started, waited for in short slices (so Python can show progress and take
// Jupyter's interrupt, SIGINT, between them) and stopped when Python decides (timeout, interrupt).
static std::atomic<int> busy{0};   // one launch at a time

static void finish(clemu_launch* launch) {
    prof_on = false;
    clemu_count_on = 0;
    clemu_hook_on = detect_on ? 1 : 0;
    if (detect_on) {
        detect_on = false;
        clemu_hook_on = 0;
        int n = (int)(launch->block[0] * launch->block[1] * launch->block[2]);
        for (auto& r : race_notes) {
            if (!race_text.empty()) race_text += "\n";
            race_text += r.head + (r.sa ? barrier_fix(r, n) : "");
        }
        if (launch->status == CLEMU_OK && n_races) {
            launch->status = CLEMU_RACE;
            std::string more;
            if ((long long)races_seen.size() > MAX_RACE_REPORTS)
                more = "\n(more accesses race too: fix these first)";
            snprintf(launch->message, sizeof launch->message, "%s%s", race_text.c_str(), more.c_str());
        }
        shadow.clear();
        serial_block.clear();
        races_seen.clear();
        race_text.clear();
        race_notes.clear();
        site_seen.clear();
        cp_issue_sites.clear();
    }
    guard_unstage();
    L = nullptr;
    busy.store(0);
}

extern "C" __attribute__((visibility("default"))) int clemu_start(clemu_launch* launch) {
    int expected = 0;
    launch->status = CLEMU_OK;
    launch->message[0] = 0;
    if (!busy.compare_exchange_strong(expected, 1)) {
        launch->status = CLEMU_LAUNCH;
        snprintf(launch->message, sizeof launch->message, "another emulator launch is still running (one at a time)");
        return launch->status;
    }
    if (launch->shared_bytes > MAX_DYN_SHARED) {
        launch->status = CLEMU_LAUNCH;
        snprintf(launch->message, sizeof launch->message, "dynamic shared memory of %lld bytes is over the %lld a GPU can give a block",
                 launch->shared_bytes, MAX_DYN_SHARED);
        busy.store(0);
        return launch->status;
    }
    // the buffers go to the guard's arena for the launch (copied back in finish)
    if (guard_stage(launch->bufs, launch->n_bufs, launch->message, sizeof launch->message) != 0) {
        launch->status = CLEMU_LAUNCH;
        busy.store(0);
        return launch->status;
    }
    long long blocks = (long long)launch->grid[0] * launch->grid[1] * launch->grid[2];
    int n_workers = launch->n_workers < 1 ? 1 : launch->n_workers;
    if (launch->detect) n_workers = 1;
    if (blocks < n_workers) n_workers = (int)blocks;
    std::unique_lock<std::mutex> g(pool_mu);
    grow_pool(n_workers);
    L = launch;
    detect_on = launch->detect != 0;
    async_on = launch->async_proxy != 0;
    n_races = 0;
    if (detect_on) clemu_hook_on = 1;
    prof_on = launch->profile != 0;
    clemu_count_on = prof_on ? 1 : 0;
    if (prof_on) {
        clprof_reset();
        clemu_hook_on = 1;
    }
    next_block.store(0);
    threads_done.store(0);
    blocks_done.store(0);
    n_blocks = blocks;
    failed.store(0);
    workers_done = 0;
    workers_active = n_workers;
    for (int i = 0; i < n_workers; i++) { pool[i]->stop_pc = nullptr; pool[i]->last_site = nullptr; }
    launch_gen++;
    pool_cv.notify_all();
    return 0;
}

// 1 when the launch has finished (its status and message are set), 0 while it still runs.
extern "C" __attribute__((visibility("default"))) int clemu_wait(clemu_launch* launch, double seconds) {
    std::unique_lock<std::mutex> g(pool_mu);
    if (!done_cv.wait_for(g, std::chrono::duration<double>(seconds), [&] { return workers_done == workers_active; }))
        return 0;
    g.unlock();
    finish(launch);
    return 1;
}

// How far the launch is: blocks started and finished, CUDA threads finished (the watchdog tells a
// launch that progresses from one that does not).
extern "C" __attribute__((visibility("default"))) void clemu_progress(long long* started, long long* blocks,
                                                                      long long* threads) {
    long long b = next_block.load();
    *started = b < n_blocks ? b : n_blocks;
    *blocks = blocks_done.load();
    *threads = threads_done.load();
}

// Stop a running launch with `status`; its message says where the running threads were
// ("thread (..) of block (..) at {{site:..}}", or nothing when none could be told).
extern "C" __attribute__((visibility("default"))) int clemu_stop(clemu_launch* launch, int status) {
    std::unique_lock<std::mutex> g(pool_mu);
    std::string at;
    std::vector<std::string> who(workers_active);
    for (int i = 0; i < workers_active; i++) {
        worker* w = pool[i];
        fiber_thread* t = w->running;
        if (w->in_kernel.load() && t) who[i] = where(&t->pub);
    }
    failed.store(1);
    for (int i = 0; i < workers_active; i++)
        if (pool[i]->in_kernel.load()) pthread_kill(pool[i]->tid, SIGUSR2);
    if (!done_cv.wait_for(g, std::chrono::seconds(1), [&] { return workers_done == workers_active; })) {
        // a worker that does not come back (blocked outside the kernel): abandon it
        for (int i = 0; i < workers_active; i++) pool[i] = nullptr;
        pool.clear();
    }
    for (int i = 0; i < (int)who.size(); i++) {
        if (who[i].empty()) continue;
        if (!at.empty()) at += "; ";
        at += who[i];
        if (i < (int)pool.size() && pool[i]) {
            // under the detector the signal mostly lands in its bookkeeping (the runtime, the C
            // library): the last access the hook saw is then the kernel's place
            at += at_site(pool[i]->last_site ? pool[i]->last_site : pool[i]->stop_pc);
        }
    }
    launch->status = status;
    snprintf(launch->message, sizeof launch->message, "%s", at.c_str());
    g.unlock();
    finish(launch);
    return status;
}

extern "C" __attribute__((visibility("default"))) long long clemu_take_output(char* dst, long long cap) {
    std::lock_guard<std::mutex> g(out_mu);
    if (out_truncated) { out_buf += "\n[printf output truncated at 4 MB]\n"; out_truncated = false; }
    long long n = (long long)out_buf.size();
    if (!dst) return n;
    if (n > cap) n = cap;
    memcpy(dst, out_buf.data(), (size_t)n);
    out_buf.erase(0, (size_t)n);
    return n;
}

extern "C" __attribute__((visibility("default"))) int clemu_abi_version() { return 4; }
