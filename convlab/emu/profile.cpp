// The emulator's profiler: counts global and shared-memory requests the way Nsight Compute does,
// from the accesses each CUDA thread makes (clemu_profile.h says what it is given).
//
// Global memory: a request's sectors are the distinct 32-byte segments its lanes touch.
// Shared memory: 32 banks of 4-byte words; a request needs as many wavefronts as the most
// distinct words it touches in one bank (lanes reading the same word share it: a broadcast).
// Its bank conflicts are the wavefronts beyond the fewest its bytes could take.
#include "clemu_profile.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <dlfcn.h>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace {

struct record { uint64_t addr; int site; int bytes; };

struct site_info { unsigned long long key; int kind; };

std::mutex mu;                                   // guards the site table and the workers' list
std::vector<site_info> sites;
std::unordered_map<unsigned long long, int> site_ids[6];   // per kind: key -> id

struct worker_state {
    std::vector<std::vector<record>> pending;    // per thread of the running block, since the last epoch
    std::vector<std::vector<long long>> counts;  // per site
    long long barriers = 0;                      // barrier instructions, one per warp at each
    unsigned long long gen = 0;                  // the reset it belongs to
    std::vector<int> kind;                       // per site, copied from the table as sites appear
    // scratch, kept between epochs so counting allocates nothing
    struct item { uint32_t site, k; uint64_t addr; int bytes; };
    std::vector<item> items;
    std::vector<int> k_next;
    std::vector<uint64_t> units;
};
std::vector<worker_state*> workers;
std::atomic<unsigned long long> reset_gen{1};

thread_local worker_state* me = nullptr;

worker_state* state() {
    if (!me) {
        me = new worker_state();                 // lives as long as the OS thread's pool entry
        std::lock_guard<std::mutex> g(mu);
        workers.push_back(me);
    }
    if (me->gen != reset_gen) {
        std::lock_guard<std::mutex> g(mu);
        me->counts.clear();
        me->barriers = 0;
        for (auto& p : me->pending) p.clear();
        me->gen = reset_gen;
    }
    return me;
}

long long* counts_of(worker_state* w, int site) {
    if ((int)w->counts.size() <= site) w->counts.resize(site + 1, std::vector<long long>(CLPROF_N_COUNTERS, 0));
    return w->counts[site].data();
}

int kind_of(worker_state* w, int site) {
    if ((int)w->kind.size() <= site) {
        std::lock_guard<std::mutex> g(mu);
        w->kind.resize(sites.size());
        for (size_t i = 0; i < sites.size(); i++) w->kind[i] = sites[i].kind;
    }
    return w->kind[site];
}

// The distinct units (32-byte sectors: shift 5; 4-byte words: shift 2) a request's lanes touch.
void distinct_units(worker_state* w, const worker_state::item* a, const worker_state::item* end, int shift) {
    auto& u = w->units;
    u.clear();
    for (; a != end; ++a)
        for (uint64_t x = a->addr >> shift; x <= (a->addr + a->bytes - 1) >> shift; x++) u.push_back(x);
    std::sort(u.begin(), u.end());
    u.erase(std::unique(u.begin(), u.end()), u.end());
}

// One request: the lanes' accesses of one site's k-th execution, [a, end).
void count_request(worker_state* w, long long* c, int kind, const worker_state::item* a, const worker_state::item* end) {
    switch (kind) {
    case CLPROF_GLOBAL_LD: case CLPROF_GLOBAL_ST: {
        distinct_units(w, a, end, 5);
        bool ld = kind == CLPROF_GLOBAL_LD;
        c[ld ? CLPROF_GLD_REQ : CLPROF_GST_REQ] += 1;
        c[ld ? CLPROF_GLD_SECT : CLPROF_GST_SECT] += (long long)w->units.size();
        return;
    }
    case CLPROF_GLOBAL_ATOM: c[CLPROF_GATOM_REQ] += 1; return;
    case CLPROF_SHARED_ATOM: c[CLPROF_SATOM_REQ] += 1; return;
    default: {
        distinct_units(w, a, end, 2);
        int per_bank[32] = {0};
        int wave = 0;
        for (uint64_t word : w->units) wave = std::max(wave, ++per_bank[word & 31]);
        long long least = std::max<long long>(1, ((long long)w->units.size() + 31) / 32);
        bool ld = kind == CLPROF_SHARED_LD;
        c[ld ? CLPROF_SLD_REQ : CLPROF_SST_REQ] += 1;
        c[ld ? CLPROF_SLD_WAVE : CLPROF_SST_WAVE] += wave;
        c[ld ? CLPROF_SLD_CONFL : CLPROF_SST_CONFL] += wave - least;
    }
    }
}

}  // namespace

extern "C" int clprof_site(unsigned long long key, int kind) {
    std::lock_guard<std::mutex> g(mu);
    auto& ids = site_ids[kind];
    auto it = ids.find(key);
    if (it != ids.end()) return it->second;
    int id = (int)sites.size();
    sites.push_back({key, kind});
    ids.emplace(key, id);
    return id;
}

extern "C" void clprof_access(int thread, int site, const void* addr, int bytes) {
    worker_state* w = state();
    if ((int)w->pending.size() <= thread) w->pending.resize(thread + 1);
    w->pending[thread].push_back({(uint64_t)(uintptr_t)addr, site, bytes});
}

// The emulator's per-access hook, as clemu_abi.h describes its op bits (read 1, write 2, atomic 4,
// shared 8): a read-modify-write (x[i] += v) is a load and a store, as on a GPU.
extern "C" void clprof_hook(unsigned op, const void* addr, unsigned bytes, const void* pc, int thread) {
    struct slot { unsigned long long key; int site; };
    static thread_local slot cache[256];                        // (pc, kind) -> site, direct-mapped
    bool shared = op & 8;
    int kinds[2], n = 0;
    if (op & 4) kinds[n++] = shared ? CLPROF_SHARED_ATOM : CLPROF_GLOBAL_ATOM;
    else {
        if (op & 1) kinds[n++] = shared ? CLPROF_SHARED_LD : CLPROF_GLOBAL_LD;
        if (op & 2) kinds[n++] = shared ? CLPROF_SHARED_ST : CLPROF_GLOBAL_ST;
    }
    for (int i = 0; i < n; i++) {
        unsigned long long key = ((unsigned long long)(uintptr_t)pc << 3) | (unsigned)kinds[i];
        slot& s = cache[(key ^ (key >> 11)) & 255];
        if (s.key != key + 1) s = {key + 1, clprof_site((uintptr_t)pc, kinds[i])};   // +1: 0 is empty
        clprof_access(thread, s.site, addr, (int)bytes);
    }
}

extern "C" void clprof_epoch(int n_threads, int barrier) {
    worker_state* w = state();
    if ((int)w->pending.size() < n_threads) w->pending.resize(n_threads);
    auto& items = w->items;
    auto& k_next = w->k_next;
    for (int warp = 0; warp * 32 < n_threads; warp++) {
        items.clear();
        for (int t = warp * 32; t < warp * 32 + 32 && t < n_threads; t++) {
            auto& mine = w->pending[t];
            for (const record& r : mine) {
                if ((int)k_next.size() <= r.site) k_next.resize(r.site + 1, 0);
                items.push_back({(uint32_t)r.site, (uint32_t)k_next[r.site]++, r.addr, r.bytes});
            }
            for (const record& r : mine) k_next[r.site] = 0;
            mine.clear();
        }
        // the lanes' k-th executions of one site side by side: each run is one request
        std::sort(items.begin(), items.end(), [](const worker_state::item& x, const worker_state::item& y) {
            return x.site != y.site ? x.site < y.site : x.k < y.k; });
        for (size_t i = 0; i < items.size();) {
            size_t j = i + 1;
            while (j < items.size() && items[j].site == items[i].site && items[j].k == items[i].k) j++;
            int site = (int)items[i].site;
            count_request(w, counts_of(w, site), kind_of(w, site), &items[i], &items[0] + j);
            i = j;
        }
        if (barrier) w->barriers += 1;
    }
}

extern "C" void clprof_reset() {
    std::lock_guard<std::mutex> g(mu);
    reset_gen++;
}

extern "C" int clprof_totals(long long* out) {
    std::lock_guard<std::mutex> g(mu);
    memset(out, 0, sizeof(long long) * CLPROF_N_COUNTERS);
    for (worker_state* w : workers) {
        if (w->gen != reset_gen) continue;
        for (auto& c : w->counts)
            for (int i = 0; i < CLPROF_N_COUNTERS; i++) out[i] += c[i];
        out[CLPROF_BARRIER] += w->barriers;
    }
    return (int)sites.size();
}

extern "C" int clprof_site_info(int site, unsigned long long* key, int* kind, long long* out) {
    std::lock_guard<std::mutex> g(mu);
    if (site < 0 || site >= (int)sites.size()) return 0;
    *key = sites[site].key;
    *kind = sites[site].kind;
    memset(out, 0, sizeof(long long) * CLPROF_N_COUNTERS);
    for (worker_state* w : workers) {
        if (w->gen != reset_gen || (int)w->counts.size() <= site) continue;
        for (int i = 0; i < CLPROF_N_COUNTERS; i++) out[i] += w->counts[site][i];
    }
    return 1;
}

extern "C" int clprof_site_where(int site, char* buf, int cap) {
    unsigned long long key;
    {
        std::lock_guard<std::mutex> g(mu);
        if (site < 0 || site >= (int)sites.size()) return 0;
        key = sites[site].key;
    }
    Dl_info info;
    if (!dladdr((void*)(uintptr_t)key, &info) || !info.dli_fname) return 0;
    return snprintf(buf, (size_t)cap, "{{site:%s+%#lx}}", info.dli_fname, (unsigned long)(key - (uintptr_t)info.dli_fbase));
}
