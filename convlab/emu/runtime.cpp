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

#include <atomic>
#include <chrono>
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
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

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
    int order;                 // 0 forward, 1 reverse, 2 shuffled
    unsigned seed;
    double timeout_s;
    int n_workers;
    int use_fibers;
    long long stack_bytes;
    void (*body)(void** args); // calls the kernel once, for clemu_cur
    void** args;
    int n_bufs;
    clemu_buf* bufs;           // buffer arguments, for fault messages
    const char** buf_names;
    // results
    int status;
    char message[4096];
};

enum { T_RUN, T_BAR, T_WARP, T_DONE, T_FAULT };

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
};

static const long long MAX_DYN_SHARED = 232448;   // an H100/H200's opt-in maximum (227 KB)

struct worker {
    pthread_t tid;
    int index;
    // per-launch state
    std::atomic<int> in_kernel{0};
    clemu_block blk;
    std::vector<fiber_thread> threads;
    std::vector<unsigned long long> warp_slots;   // [warp][parity][32]
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
static long long n_blocks = 0;
static std::atomic<int> failed{0};
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
    const char* name = (L && arg >= 0 && arg < L->n_bufs) ? L->buf_names[arg] : "?";
    char hint[200] = "";
    if (elem == n) snprintf(hint, sizeof hint, " (one past the end: a bounds check `if (i < n)` missing or off by one?)");
    else if (elem < 0) snprintf(hint, sizeof hint, " (before the start: a negative index, e.g. a halo row or column above or left of the input that needs a bounds check)");
    set_failure(CLEMU_OOB,
        "out-of-range access: %s[%lld] by %s, but %s has %lld elements of %lld bytes (valid indices 0..%lld)%s",
        name, elem, where(clemu_cur).c_str(), name, n, esize, n - 1, hint);
    throw clemu_fault_exc();
}

extern "C" [[noreturn]] void clemu_fault_shared(const char* name, long long elem, long long n, long long esize) {
    set_failure(CLEMU_OOB,
        "out-of-range access: extern __shared__ %s[%lld] by %s, but the launch gave shared=%lld bytes, "
        "%lld elements of %lld bytes (valid indices 0..%lld): pass a larger shared= (e.g. the tile's "
        "(TILE+K-1)^2 elements times sizeof(float)), or check the index",
        name, elem, where(clemu_cur).c_str(), n * esize, n, esize, n - 1);
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
static void fiber_entry(void* arg) {
    fiber_thread* t = (fiber_thread*)arg;
    clemu_cur = &t->pub;
    try {
        L->body(L->args);
        t->state = T_DONE;
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
    if (w->stacks) munmap(w->stacks, (size_t)w->n_stacks * w->stack_bytes);
    size_t total = (size_t)n * stack_bytes;
    void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { w->stacks = nullptr; w->n_stacks = 0; return; }
    w->stacks = (char*)p;
    w->n_stacks = n;
    w->stack_bytes = stack_bytes;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) mprotect(w->stacks + (size_t)i * stack_bytes, page, PROT_NONE);   // guard
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

// Decide what the parked threads of a block may do next. Returns false on a fault.
static bool release(worker* w, int n, bool& all_done) {
    auto& th = w->threads;
    all_done = true;
    int n_done = 0, n_bar = 0, n_warp = 0;
    for (int i = 0; i < n; i++) {
        int s = th[i].state;
        if (s == T_DONE) n_done++;
        else if (s == T_BAR) n_bar++;
        else if (s == T_WARP) n_warp++;
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
        unsigned exists = (wp * 32 + 32 <= n) ? 0xffffffffu : ((1u << (n - wp * 32)) - 1u);
        need &= exists;
        unsigned exited = need & ~alive;
        if (exited) {
            int l = __builtin_ctz(exited);
            fiber_thread& any = th[wp * 32 + __builtin_ctz(here)];
            set_failure(CLEMU_BARRIER,
                "warp operation at %s:%d in block %s names lane %d of warp %d in its mask, but that thread "
                "(%s) has already returned: every lane in the mask must reach the same warp operation",
                any.site_file, any.site_line, block_str(&w->blk).c_str(), l, wp, tid_str(&th[wp * 32 + l].pub).c_str());
            return false;
        }
        if ((need & here) == need) {
            for (int l = 0; l < 32 && wp * 32 + l < n; l++)
                if (th[wp * 32 + l].state == T_WARP) th[wp * 32 + l].state = T_RUN;
            released = true;
        }
    }
    if (released) return true;
    // 2. the block barrier
    if (n_warp) {
        fiber_thread* a = nullptr; fiber_thread* b = nullptr;
        for (int i = 0; i < n; i++) {
            if (th[i].state == T_WARP && !a) a = &th[i];
            if (th[i].state == T_BAR && !b) b = &th[i];
        }
        if (b)
            set_failure(CLEMU_BARRIER,
                "deadlock in block %s: thread %s waits at a warp operation at %s:%d for lanes that wait at "
                "__syncthreads() at %s:%d (thread %s). Lanes of a warp must reach the same warp operation.",
                block_str(&w->blk).c_str(), tid_str(&a->pub).c_str(), a->site_file, a->site_line,
                b->site_file, b->site_line, tid_str(&b->pub).c_str());
        else
            set_failure(CLEMU_BARRIER,
                "deadlock in block %s: thread %s waits at a warp operation at %s:%d for lanes of its mask "
                "that never reach it", block_str(&w->blk).c_str(), tid_str(&a->pub).c_str(), a->site_file, a->site_line);
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
    for (int i = 0; i < n; i++) { th[i].state = T_RUN; th[i].pred = 0; th[i].bar_op = 0; }
    return true;
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
    if (l->shared_bytes) memset(w->dyn_shared, 0xFF, (size_t)l->shared_bytes);   // NaN: unloaded shared memory shows
    int bx = l->block[0], by = l->block[1];
    int n = l->block[0] * l->block[1] * l->block[2];
    static thread_local std::vector<int> order;
    make_order(order, n, l->order, l->seed ^ (unsigned)(b * 2654435761u));
    auto& th = w->threads;
    for (int i = 0; i < n; i++) {
        th[i].pub.idx = uint3{(unsigned)(i % bx), (unsigned)((i / bx) % by), (unsigned)(i / (bx * by))};
        th[i].pub.blk = &w->blk;
        th[i].pub.linear = i;
    }
    if (!l->use_fibers) {
        for (int k = 0; k < n; k++) {
            fiber_thread& t = th[order[k]];
            clemu_cur = &t.pub;
            w->running = &t;
            try {
                l->body(l->args);
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
        return;
    }
    run_block_fibers(w, order, n);
}

// ----------------------------------------------------------------------------------------
// Signals: SIGUSR2 stops a worker (timeout or another worker's fault); SIGSEGV/SIGBUS/SIGFPE
// inside a kernel become a fault message. Anything outside a kernel goes to the old handler.
static struct sigaction old_segv, old_bus, old_fpe, old_usr2;

static std::string describe_address(uintptr_t a) {
    char s[400];
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

static void on_signal(int sig, siginfo_t* info, void* uctx) {
    worker* w = W;
    if (w && sig == SIGUSR2) {
        // the watchdog's stop: jump out of a kernel that is running; a worker that has already
        // left it ignores the late signal (its default action would end the whole process)
        if (w->in_kernel.load() && w->running) siglongjmp(w->jmp, 1);
        return;
    }
    if (w && w->in_kernel.load()) {
        const clemu_thread* t = clemu_cur;
        if (sig == SIGFPE)
            set_failure(CLEMU_FPE, "arithmetic fault (integer division or remainder by zero?) in %s", where(t).c_str());
        else {
            std::string d = describe_address((uintptr_t)info->si_addr);
            bool stack = d.rfind("a stack overflow", 0) == 0;
            set_failure(stack ? CLEMU_STACK : CLEMU_SEGV, "%s in %s: %s",
                        stack ? "stack overflow" : "invalid memory access", where(t).c_str(), d.c_str());
        }
        siglongjmp(w->jmp, 1);
    }
    struct sigaction* old = sig == SIGSEGV ? &old_segv : sig == SIGBUS ? &old_bus : sig == SIGFPE ? &old_fpe : &old_usr2;
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
        w->blk.dim = dim3(L->block[0], L->block[1], L->block[2]);
        w->blk.grid = dim3(L->grid[0], L->grid[1], L->grid[2]);
        w->blk.dyn_shared = w->dyn_shared;
        w->blk.dyn_bytes = L->shared_bytes;
        if (L->use_fibers) {
            ensure_stacks(w, n, L->stack_bytes);
            if (!w->stacks) set_failure(CLEMU_LAUNCH, "could not allocate %d fiber stacks", n);
        }
        if (sigsetjmp(w->jmp, 0) == 0) {
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

static std::mutex launch_mu;   // one launch at a time

extern "C" __attribute__((visibility("default"))) int clemu_run(clemu_launch* launch) {
    std::lock_guard<std::mutex> one(launch_mu);
    launch->status = CLEMU_OK;
    launch->message[0] = 0;
    if (launch->shared_bytes > MAX_DYN_SHARED) {
        launch->status = CLEMU_LAUNCH;
        snprintf(launch->message, sizeof launch->message, "dynamic shared memory of %lld bytes is over the %lld a GPU can give a block",
                 launch->shared_bytes, MAX_DYN_SHARED);
        return launch->status;
    }
    long long blocks = (long long)launch->grid[0] * launch->grid[1] * launch->grid[2];
    int n_workers = launch->n_workers < 1 ? 1 : launch->n_workers;
    if (blocks < n_workers) n_workers = (int)blocks;
    std::unique_lock<std::mutex> g(pool_mu);
    grow_pool(n_workers);
    L = launch;
    next_block.store(0);
    n_blocks = blocks;
    failed.store(0);
    workers_done = 0;
    workers_active = n_workers;
    launch_gen++;
    pool_cv.notify_all();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(launch->timeout_s);
    if (!done_cv.wait_until(g, deadline, [&] { return workers_done == workers_active; })) {
        // a kernel that never returns: note where the workers are, then stop them
        std::string at;
        for (int i = 0; i < workers_active; i++) {
            worker* w = pool[i];
            fiber_thread* t = w->running;
            if (w->in_kernel.load() && t) { at = where(&t->pub); break; }
        }
        int expected = 0;
        if (failed.compare_exchange_strong(expected, 1)) {
            launch->status = CLEMU_TIMEOUT;
            snprintf(launch->message, sizeof launch->message,
                     "the kernel did not finish within %.3g s and was stopped (%s was still running). "
                     "Look for a loop whose end condition never becomes true, e.g. a grid-stride loop that "
                     "does not advance, or raise the limit with timeout=.",
                     launch->timeout_s, at.empty() ? "no thread identified" : at.c_str());
        }
        for (int i = 0; i < workers_active; i++)
            if (pool[i]->in_kernel.load()) pthread_kill(pool[i]->tid, SIGUSR2);
        if (!done_cv.wait_for(g, std::chrono::seconds(10), [&] { return workers_done == workers_active; })) {
            // a worker that does not come back (blocked outside the kernel): abandon it
            for (int i = 0; i < workers_active; i++) pool[i] = nullptr;
            pool.clear();
        }
    }
    L = nullptr;
    return launch->status;
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

extern "C" __attribute__((visibility("default"))) int clemu_abi_version() { return 1; }
