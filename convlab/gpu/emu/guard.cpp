// guard.cpp — what a kernel may touch. Every load and store a kernel module makes is checked
// against the memory its launch owns, whatever pointer it goes through (a parameter, a local
// pointer, a __device__ function's argument, a struct member, a cast): the modules are compiled
// with -fsanitize=kernel-address, which puts an inline check of this shadow before each access
// (convlab/emu/__init__.py), and report calls into runtime.cpp when the check fails.
//
// Unlike AddressSanitizer, which marks only what is forbidden, the shadow exists only where the
// launch owns memory: its buffers (staged here), its shared memory, the threads' stacks, the
// module's own data, the device heap's blocks, and the few runtime fields kernel code reads
// (threadIdx, the warp exchange). Everywhere else the shadow page is not mapped, so the check's
// own load faults and the signal handler reports the access (runtime.cpp). What a kernel touches
// is a list, and nothing off it — Python's heap least of all — can be read or written.
#include "guard.h"
#include "clemu_abi.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

namespace {

const uintptr_t SHADOW_SPAN = 1ull << 44;          // shadow of the user address space (2^47 bytes)
const uintptr_t PAGE = 4096;
const signed char NOT_OWNED = (signed char)0xF9;   // what an owned byte's neighbours read as
const uintptr_t GAP = 64ull << 20;                 // unmapped between two staged buffers
const uintptr_t MARGIN = 64 << 10;                 // around a buffer: shadow mapped, not owned

std::mutex mu;
uintptr_t shadow_off = 0;                          // 0: the software shadow below
std::unordered_map<uintptr_t, signed char*> soft;  // software shadow: page index -> 4 KB of shadow
std::unordered_set<uintptr_t> mapped;              // fixed shadow: its pages made writable

inline uintptr_t shadow_addr(uintptr_t a) { return (a >> 3) + shadow_off; }

// The shadow byte of app address a, creating its page (filled NOT_OWNED) when `create`; nullptr
// where no page exists. mu is held.
signed char* shadow_byte(uintptr_t a, bool create) {
    uintptr_t s = a >> 3;
    if (shadow_off) {
        uintptr_t sa = s + shadow_off, page = sa & ~(PAGE - 1);
        auto it = mapped.find(page);
        if (it == mapped.end()) {
            if (!create) return nullptr;
            if (mprotect((void*)page, PAGE, PROT_READ | PROT_WRITE) != 0) return nullptr;
            memset((void*)page, NOT_OWNED, PAGE);
            mapped.insert(page);
        }
        return (signed char*)sa;
    }
    uintptr_t page = s / PAGE;
    auto it = soft.find(page);
    if (it == soft.end()) {
        if (!create) return nullptr;
        signed char* p = (signed char*)malloc(PAGE);
        memset(p, NOT_OWNED, PAGE);
        it = soft.emplace(page, p).first;
    }
    return it->second + s % PAGE;
}

// Set the shadow of [lo, hi) (8-byte granules) to v, creating pages (create) or only where they exist.
void fill(uintptr_t lo, uintptr_t hi, signed char v, bool create) {
    for (uintptr_t a = lo & ~(uintptr_t)7; a < hi;) {
        signed char* s = shadow_byte(a, create);
        // the rest of this shadow page, in one memset
        uintptr_t page_end_app = ((((a >> 3) / PAGE) + 1) * PAGE) << 3;
        uintptr_t end = std::min(hi, page_end_app);
        uintptr_t granules = (end - a + 7) >> 3;
        if (s) memset(s, v, granules);
        a += granules << 3;
    }
}

}  // namespace

int guard_init() {
    std::lock_guard<std::mutex> g(mu);
    if (shadow_off) return 1;
    if (getenv("CONVLAB_EMU_SOFT_GUARD")) return 0;
    // AddressSanitizer's offset first (the range is free in a usual process: executables and
    // libraries live above 0x5000_0000_0000, the low heap of a non-PIE program below 2 GB)
    static const uintptr_t tries[] = {0x7fff8000ull, 0x200000000000ull, 0x300000000000ull, 0x100000000000ull};
    for (uintptr_t off : tries) {
        void* p = mmap((void*)off, SHADOW_SPAN, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                       -1, 0);
        if (p == MAP_FAILED) continue;
        if ((uintptr_t)p != off) { munmap(p, SHADOW_SPAN); continue; }   // a kernel without MAP_FIXED_NOREPLACE
        shadow_off = off;
        return 1;
    }
    return 0;
}

uintptr_t guard_offset() { return shadow_off; }

void guard_allow(const void* p, size_t bytes) {
    if (!bytes) return;
    std::lock_guard<std::mutex> g(mu);
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)7, hi = (uintptr_t)p + bytes;
    fill(lo, hi & ~(uintptr_t)7, 0, true);
    if (hi & 7) {
        signed char* s = shadow_byte(hi & ~(uintptr_t)7, true);
        if (s && *s != 0 && (*s < 0 || *s < (signed char)(hi & 7))) *s = (signed char)(hi & 7);
    }
}

void guard_forbid(const void* p, size_t bytes) {
    if (!bytes) return;
    std::lock_guard<std::mutex> g(mu);
    fill((uintptr_t)p, (uintptr_t)p + bytes, NOT_OWNED, false);
}

bool guard_owned(uintptr_t a, size_t bytes) {
    std::lock_guard<std::mutex> g(mu);
    for (uintptr_t x = a; x < a + bytes; x++) {
        signed char* s = shadow_byte(x, false);
        if (!s || (*s != 0 && (*s < 0 || (signed char)(x & 7) >= *s))) return false;
    }
    return true;
}

bool guard_in_shadow(uintptr_t a, uintptr_t* app) {
    if (!shadow_off || a < shadow_off || a >= shadow_off + SHADOW_SPAN) return false;
    *app = (a - shadow_off) << 3;
    return true;
}

// ---- staging ---------------------------------------------------------------------------------
namespace {
struct group { uintptr_t orig, bytes, staged, page_lo, page_hi; };
struct member { uintptr_t orig, bytes, staged; int group; };
char* arena = nullptr;
uintptr_t arena_bytes = 0;
std::vector<group> groups;
std::vector<member> members;   // one per buffer argument of the launch, in argument order

bool arena_reserve() {
    if (arena) return true;
    for (uintptr_t bytes : {1ull << 40, 1ull << 36, 1ull << 32}) {
        void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p != MAP_FAILED) { arena = (char*)p; arena_bytes = bytes; return true; }
    }
    return false;
}
}  // namespace

int guard_stage(clemu_buf* bufs, int n, char* err, size_t errlen) {
    groups.clear();
    members.clear();
    if (!arena_reserve()) { snprintf(err, errlen, "the emulator could not reserve address space for the launch's buffers"); return -1; }
    // buffers that overlap share one copy (sorted by start, merged while they overlap)
    std::vector<int> order;
    for (int i = 0; i < n; i++) order.push_back(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return (uintptr_t)bufs[a].p < (uintptr_t)bufs[b].p; });
    members.resize(n);
    uintptr_t cursor = (uintptr_t)arena + GAP;
    for (size_t k = 0; k < order.size();) {
        int i = order[k];
        uintptr_t lo = (uintptr_t)bufs[i].p, hi = lo + (uintptr_t)bufs[i].nbytes;
        size_t j = k + 1;
        if (lo) {   // a null buffer (an empty tensor) stays null: every access through it faults
            while (j < order.size() && (uintptr_t)bufs[order[j]].p < hi) {
                hi = std::max(hi, (uintptr_t)bufs[order[j]].p + (uintptr_t)bufs[order[j]].nbytes);
                j++;
            }
        }
        group gr{lo, hi - lo, 0, 0, 0};
        if (lo) {
            // the same address modulo a page as the tensor's, so alignment (and the profiler's
            // sectors) are as Python allocated them
            uintptr_t start = ((cursor + PAGE - 1) & ~(PAGE - 1)) + (lo & (PAGE - 1));
            gr.staged = start;
            gr.page_lo = start & ~(PAGE - 1);
            gr.page_hi = (start + gr.bytes + PAGE - 1) & ~(PAGE - 1);
            if (gr.page_hi + GAP > (uintptr_t)arena + arena_bytes) {
                snprintf(err, errlen, "the launch's buffers (%llu bytes and more) do not fit the emulator's staging "
                         "arena", (unsigned long long)(gr.page_hi - (uintptr_t)arena));
                guard_unstage();
                return -1;
            }
            if (gr.page_hi > gr.page_lo &&
                mprotect((void*)gr.page_lo, gr.page_hi - gr.page_lo, PROT_READ | PROT_WRITE) != 0) {
                snprintf(err, errlen, "the emulator could not map %llu bytes for the launch's buffers (out of memory?)",
                         (unsigned long long)(gr.page_hi - gr.page_lo));
                guard_unstage();
                return -1;
            }
            memcpy((void*)start, (void*)lo, gr.bytes);
            cursor = gr.page_hi + GAP;
        }
        groups.push_back(gr);
        for (size_t m = k; m < j; m++) {
            int b = order[m];
            uintptr_t p = (uintptr_t)bufs[b].p;
            members[b] = {p, (uintptr_t)bufs[b].nbytes, p ? gr.staged + (p - lo) : 0, (int)groups.size() - 1};
        }
        k = j;
    }
    for (auto& gr : groups) {
        if (!gr.orig) continue;
        std::lock_guard<std::mutex> g(mu);
        fill(gr.staged - MARGIN, gr.staged + gr.bytes + MARGIN, NOT_OWNED, true);
    }
    for (auto& gr : groups)
        if (gr.orig) guard_allow((void*)gr.staged, gr.bytes);
    for (int i = 0; i < n; i++) bufs[i].p = (void*)members[i].staged;
    return 0;
}

void guard_unstage() {
    for (auto& gr : groups) {
        if (!gr.orig || !gr.staged) continue;
        memcpy((void*)gr.orig, (void*)gr.staged, gr.bytes);
        guard_forbid((void*)gr.staged, gr.bytes);
        if (gr.page_hi > gr.page_lo) {
            madvise((void*)gr.page_lo, gr.page_hi - gr.page_lo, MADV_DONTNEED);
            mprotect((void*)gr.page_lo, gr.page_hi - gr.page_lo, PROT_NONE);
        }
    }
    groups.clear();
    members.clear();
}

bool guard_near_buffer(uintptr_t a, guard_place* out) {
    int best = -1;
    uintptr_t dist = GAP / 2 + MARGIN;
    for (size_t i = 0; i < members.size(); i++) {
        const member& m = members[i];
        if (!m.staged) continue;
        uintptr_t d = a < m.staged ? m.staged - a : a >= m.staged + m.bytes ? a - (m.staged + m.bytes) + 1 : 0;
        // inside: the smallest buffer that holds a (a view inside a larger one); outside: the nearest
        if (d < dist || (d == 0 && best >= 0 && m.bytes < members[best].bytes)) { dist = d; best = (int)i; }
    }
    if (best < 0) return false;
    out->buf = best;
    out->offset = (long long)(a - members[best].staged);
    return true;
}

const void* guard_staged(const void* original) {
    uintptr_t a = (uintptr_t)original;
    for (auto& gr : groups)
        if (gr.orig && a >= gr.orig && a < gr.orig + gr.bytes) return (const void*)(gr.staged + (a - gr.orig));
    return original;
}

// ---- the device heap -------------------------------------------------------------------------
// First fit over a region of its own, its bookkeeping outside it (a kernel that writes past its
// block cannot corrupt it: the write faults first). A freed block stays not-owned until reused,
// so a use after free is a fault.
namespace {
std::mutex heap_mu;
char* heap = nullptr;
long long heap_limit = 8ll << 20;                 // cudaLimitMallocHeapSize's default
std::map<uintptr_t, uintptr_t> blocks;            // start -> bytes, allocated
std::map<uintptr_t, uintptr_t> holes;             // start -> bytes, free
std::map<uintptr_t, uintptr_t> freed;             // start -> bytes, freed since (for messages)
const uintptr_t HEAP_ALIGN = 16;

bool heap_reserve() {
    if (heap) return true;
    void* p = mmap(nullptr, (size_t)heap_limit, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return false;
    heap = (char*)p;
    holes.clear();
    holes[(uintptr_t)heap] = (uintptr_t)heap_limit;
    return true;
}
}  // namespace

void* guard_malloc(size_t bytes) {
    std::lock_guard<std::mutex> g(heap_mu);
    if (!heap_reserve()) return nullptr;
    uintptr_t need = (std::max<size_t>(bytes, 1) + HEAP_ALIGN - 1) & ~(HEAP_ALIGN - 1);
    for (auto it = holes.begin(); it != holes.end(); ++it) {
        if (it->second < need) continue;
        uintptr_t start = it->first, left = it->second - need;
        holes.erase(it);
        if (left) holes[start + need] = left;
        blocks[start] = bytes;
        freed.erase(start);
        guard_allow((void*)start, bytes);
        return (void*)start;
    }
    return nullptr;   // as on a GPU: malloc and new give NULL once the heap is full
}

bool guard_free(void* p) {
    if (!p) return true;
    std::lock_guard<std::mutex> g(heap_mu);
    auto it = blocks.find((uintptr_t)p);
    if (it == blocks.end()) return false;
    uintptr_t start = it->first, bytes = it->second;
    uintptr_t span = (std::max<uintptr_t>(bytes, 1) + HEAP_ALIGN - 1) & ~(HEAP_ALIGN - 1);
    blocks.erase(it);
    guard_forbid((void*)start, bytes);
    freed[start] = bytes;
    holes[start] = span;
    // merge with the neighbouring holes
    auto h = holes.find(start);
    auto next = std::next(h);
    if (next != holes.end() && h->first + h->second == next->first) { h->second += next->second; holes.erase(next); }
    if (h != holes.begin()) {
        auto prev = std::prev(h);
        if (prev->first + prev->second == h->first) { prev->second += h->second; holes.erase(h); }
    }
    return true;
}

bool guard_heap_place(uintptr_t a, long long* block_start, long long* block_bytes, bool* was_freed) {
    std::lock_guard<std::mutex> g(heap_mu);
    if (!heap || a < (uintptr_t)heap || a >= (uintptr_t)heap + (uintptr_t)heap_limit + MARGIN) return false;
    *block_start = -1;
    *block_bytes = 0;
    *was_freed = false;
    // the block at or before a (allocated, else freed)
    auto it = blocks.upper_bound(a);
    auto fr = freed.upper_bound(a);
    uintptr_t best = 0, bb = 0;
    bool bf = false;
    if (it != blocks.begin()) { --it; best = it->first; bb = it->second; }
    if (fr != freed.begin()) { --fr; if (fr->first >= best && a < fr->first + fr->second) { best = fr->first; bb = fr->second; bf = true; } }
    if (best) { *block_start = (long long)best; *block_bytes = (long long)bb; *was_freed = bf; }
    return true;
}

int guard_heap_limit(long long bytes) {
    std::lock_guard<std::mutex> g(heap_mu);
    if (!blocks.empty()) return -1;
    if (heap) { munmap(heap, (size_t)heap_limit); heap = nullptr; }
    freed.clear();
    heap_limit = bytes;
    return 0;
}

long long guard_heap_bytes() { return heap_limit; }
