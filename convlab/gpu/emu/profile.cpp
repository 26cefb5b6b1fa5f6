// The emulator's profiler: counts global and shared-memory requests the way Nsight Compute does,
// from the accesses each CUDA thread makes (clemu_profile.h says what it is given).
//
// A request: one warp's lanes' accesses at one site (one instruction) in the same iteration of
// the same loops (the loop tag each access carries, cuda_emu.h), between two barriers. Where a
// lane makes more than one such access (a loop the emulator does not tag: while, do, goto), its
// k-th goes with the other lanes' k-th.
// Global memory: a request's sectors are the distinct 32-byte segments its lanes touch.
// Constant memory (__constant__ arrays): the distinct 4-byte words a request's lanes read, each an
// address the constant cache serves in turn (one for a broadcast). Not in the trace.
// Shared memory: 32 banks of 4-byte words; a request of 4-byte (or narrower) accesses needs as
// many wavefronts as the most distinct words it touches in one bank (lanes reading the same word
// share it: a broadcast). 8- and 16-byte accesses go in 2 or 4 phases (half-warps, quarter-warps:
// 128 bytes each), each as many wavefronts as its own most distinct words in one bank; where
// every pair of lanes (l, l^1 or l, l^2) uses one address, as in a broadcast, the pairs share their
// data and the phases halve. Bank conflicts are the wavefronts beyond one per phase.
// The trace (cl.trace, convlab/trace.py): for the blocks asked for, every access as it came, with
// the array it went to; Python groups it into the same requests.
#include "clemu_profile.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <dlfcn.h>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct record { uint64_t addr; uint64_t loop; int site; int bytes; };

struct site_info { unsigned long long key; int kind; };

std::mutex mu;                                   // guards the site table and the workers' list
std::vector<site_info> sites;
std::unordered_map<unsigned long long, int> site_ids[7];   // per kind: key -> id

struct worker_state {
    std::vector<std::vector<record>> pending;    // per thread of the running block, since the last epoch
    std::vector<std::vector<long long>> counts;  // per site
    long long barriers = 0;                      // barrier instructions, one per warp at each
    unsigned long long epochs = 0;               // barriers and block ends this OS thread has seen (the trace's phase)
    unsigned long long gen = 0;                  // the reset it belongs to
    std::vector<int> kind;                       // per site, copied from the table as sites appear
    // scratch, kept between epochs so counting allocates nothing
    struct item { uint32_t site, lane, k, order; uint64_t loop, addr; int bytes; };
    std::vector<item> items;
    std::vector<uint64_t> units;
};
std::vector<worker_state*> workers;
std::atomic<unsigned long long> reset_gen{1};

thread_local worker_state* me = nullptr;

// The trace (cl.trace): every access of the blocks asked for, in the order the emulator made them.
// Set before a launch and read after it; during the launch only the blocks' own worker appends.
std::vector<std::array<unsigned, 3>> traced;    // the blocks to record (empty: none)
std::vector<clprof_trace_rec> trace_recs;
std::vector<std::string> trace_arrays;           // array and buffer names, by clprof_trace_rec.array
std::mutex trace_mu;

// The access's block when it is one of those traced, and where its address lies: its index in
// `traced`, or -1. (profile.cpp compiled alone, for count_trace, has no runtime: none.)
int traced_block(const void* addr, const char** name, const char** lo, long long* elem, long long* size) {
    unsigned idx[3];
    if (!clemu_trace_place || !clemu_trace_place(addr, idx, name, lo, elem, size)) return -1;
    for (size_t i = 0; i < traced.size(); i++)
        if (traced[i][0] == idx[0] && traced[i][1] == idx[1] && traced[i][2] == idx[2]) return (int)i;
    return -1;
}

void trace_access(int block, const char* name, const char* lo, long long elem, long long size, int thread, int kind, int site,
                  const void* addr, int bytes, unsigned long long loop, unsigned long long epoch) {
    std::string n = name ? name : "";
    std::lock_guard<std::mutex> g(trace_mu);
    int array = -1;
    for (size_t i = 0; i < trace_arrays.size() && array < 0; i++)
        if (trace_arrays[i] == n) array = (int)i;
    if (array < 0) { array = (int)trace_arrays.size(); trace_arrays.push_back(n); }
    trace_recs.push_back({(unsigned long long)(uintptr_t)addr, loop, epoch,
                          lo ? (long long)((const char*)addr - lo) : -1, elem, size, block, thread, kind, site, bytes, array});
}

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

// Whether every lane's partner (lane ^ bit) is absent or uses the same address.
bool paired(const worker_state::item* a, const worker_state::item* end, unsigned bit) {
    uint64_t at[32];
    bool on[32] = {false};
    for (const worker_state::item* i = a; i != end; ++i) { at[i->lane] = i->addr; on[i->lane] = true; }
    for (int l = 0; l < 32; l++)
        if (on[l] && on[l ^ bit] && at[l] != at[l ^ bit]) return false;
    return true;
}

// A shared-memory request's wavefronts and the least it could take (one per phase with a lane).
void shared_wavefronts(worker_state* w, const worker_state::item* a, const worker_state::item* end,
                       long long& wave, long long& least) {
    int bytes = 0;
    for (const worker_state::item* i = a; i != end; ++i) bytes = std::max(bytes, i->bytes);
    int phases = bytes > 8 ? 4 : bytes > 4 ? 2 : 1;
    if (phases > 1 && (paired(a, end, 1) || paired(a, end, 2))) phases /= 2;
    int width = 32 / phases;                      // lanes per phase
    wave = least = 0;
    static thread_local std::vector<worker_state::item> phase;
    for (int ph = 0; ph < phases; ph++) {
        phase.clear();
        for (const worker_state::item* i = a; i != end; ++i)
            if ((int)i->lane / width == ph) phase.push_back(*i);
        if (phase.empty()) continue;
        distinct_units(w, phase.data(), phase.data() + phase.size(), 2);
        int per_bank[32] = {0}, most = 0;
        for (uint64_t word : w->units) most = std::max(most, ++per_bank[word & 31]);
        wave += most;
        least += 1;
    }
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
    case CLPROF_CONST_LD:
        distinct_units(w, a, end, 2);
        c[CLPROF_CLD_REQ] += 1;
        c[CLPROF_CLD_ADDR] += (long long)w->units.size();
        return;
    case CLPROF_GLOBAL_ATOM: c[CLPROF_GATOM_REQ] += 1; return;
    case CLPROF_SHARED_ATOM: c[CLPROF_SATOM_REQ] += 1; return;
    default: {
        long long wave, least;
        shared_wavefronts(w, a, end, wave, least);
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

extern "C" void clprof_access(int thread, int site, const void* addr, int bytes, unsigned long long loop) {
    worker_state* w = state();
    if ((int)w->pending.size() <= thread) w->pending.resize(thread + 1);
    w->pending[thread].push_back({(uint64_t)(uintptr_t)addr, (uint64_t)loop, site, bytes});
}

// The emulator's per-access hook, as clemu_abi.h describes its op bits (read 1, write 2, atomic 4,
// shared 8, constant 64): a read-modify-write (x[i] += v) is a load and a store, as on a GPU.
extern "C" void clprof_hook(unsigned op, const void* addr, unsigned bytes, const void* pc, int thread,
                            unsigned long long loop) {
    struct slot { unsigned long long key; int site; };
    static thread_local slot cache[256];                        // (pc, kind) -> site, direct-mapped
    bool shared = op & 8;
    int kinds[2], n = 0;
    if (op & 64) kinds[n++] = CLPROF_CONST_LD;   // CLEMU_CONST: a read of a __constant__ array
    else if (op & 4) kinds[n++] = shared ? CLPROF_SHARED_ATOM : CLPROF_GLOBAL_ATOM;
    else {
        if (op & 1) kinds[n++] = shared ? CLPROF_SHARED_LD : CLPROF_GLOBAL_LD;
        if (op & 2) kinds[n++] = shared ? CLPROF_SHARED_ST : CLPROF_GLOBAL_ST;
    }
    for (int i = 0; i < n; i++) {
        unsigned long long key = ((unsigned long long)(uintptr_t)pc << 3) | (unsigned)kinds[i];
        slot& s = cache[(key ^ (key >> 11)) & 255];
        if (s.key != key + 1) s = {key + 1, clprof_site((uintptr_t)pc, kinds[i])};   // +1: 0 is empty
        clprof_access(thread, s.site, addr, (int)bytes, loop);
        const char *name = nullptr, *lo = nullptr;
        long long elem = 0, size = 0;
        int b = traced.empty() || kinds[i] == CLPROF_CONST_LD ? -1 : traced_block(addr, &name, &lo, &elem, &size);
        if (b >= 0) trace_access(b, name, lo, elem, size, thread, kinds[i], s.site, addr, (int)bytes, loop, state()->epochs);
    }
}

extern "C" void clprof_epoch(int n_threads, int barrier) {
    worker_state* w = state();
    if ((int)w->pending.size() < n_threads) w->pending.resize(n_threads);
    auto& items = w->items;
    using item = worker_state::item;
    for (int warp = 0; warp * 32 < n_threads; warp++) {
        items.clear();
        for (int t = warp * 32; t < warp * 32 + 32 && t < n_threads; t++) {
            auto& mine = w->pending[t];
            for (const record& r : mine)
                items.push_back({(uint32_t)r.site, (uint32_t)(t - warp * 32), 0, (uint32_t)items.size(), r.loop, r.addr, r.bytes});
            mine.clear();
        }
        // the lanes' accesses at one site in one loop iteration side by side, each lane's in its order
        std::sort(items.begin(), items.end(), [](const item& x, const item& y) {
            return x.site != y.site ? x.site < y.site : x.loop != y.loop ? x.loop < y.loop : x.order < y.order; });
        for (size_t i = 0; i < items.size();) {
            size_t j = i + 1;
            while (j < items.size() && items[j].site == items[i].site && items[j].loop == items[i].loop) j++;
            // a lane's k-th access in this run goes with the other lanes' k-th (usually k is 0 only)
            uint32_t seen[32] = {0}, most = 0;
            for (size_t e = i; e < j; e++) most = std::max(most, items[e].k = seen[items[e].lane]++);
            if (most) std::stable_sort(items.begin() + i, items.begin() + j, [](const item& x, const item& y) { return x.k < y.k; });
            int site = (int)items[i].site;
            for (size_t e = i; e < j;) {
                size_t f = e + 1;
                while (f < j && items[f].k == items[e].k) f++;
                count_request(w, counts_of(w, site), kind_of(w, site), &items[e], &items[0] + f);
                e = f;
            }
            i = j;
        }
        if (barrier) w->barriers += 1;
    }
    w->epochs += 1;
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

extern "C" void clprof_trace_blocks(const unsigned* xyz, int n) {
    std::lock_guard<std::mutex> g(trace_mu);
    traced.clear();
    for (int i = 0; i < n; i++) traced.push_back({xyz[3 * i], xyz[3 * i + 1], xyz[3 * i + 2]});
    trace_recs.clear();
    trace_arrays.clear();
}

extern "C" long long clprof_trace_take(clprof_trace_rec* out, long long cap) {
    std::lock_guard<std::mutex> g(trace_mu);
    long long n = (long long)trace_recs.size();
    if (out) memcpy(out, trace_recs.data(), sizeof(clprof_trace_rec) * (size_t)std::min(n, cap));
    return n;
}

extern "C" int clprof_trace_array(int i, char* buf, int cap) {
    std::lock_guard<std::mutex> g(trace_mu);
    if (i < 0 || i >= (int)trace_arrays.size()) return -1;
    return snprintf(buf, (size_t)cap, "%s", trace_arrays[i].c_str());
}
