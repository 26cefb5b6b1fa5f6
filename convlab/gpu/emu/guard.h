// guard.h — the emulator's memory guard (guard.cpp), as runtime.cpp uses it. Not a kernel header.
#pragma once
#include <cstddef>
#include <cstdint>

struct clemu_buf;

// The shadow: one byte per 8 bytes of the address space, at shadow_offset + address / 8, as
// AddressSanitizer keeps it. 0: the launch owns all 8 bytes; 1..7: the first k; anything else: no.
// Only what the launch owns (and a margin around it) has shadow pages at all.
int guard_init();                     // once; 1 with the shadow at a fixed address, 0 in software
uintptr_t guard_offset();             // the compilers' -fasan-shadow-offset (0: software checks)
void guard_allow(const void* p, size_t bytes);
void guard_forbid(const void* p, size_t bytes);
bool guard_owned(uintptr_t a, size_t bytes);         // every byte of [a, a+bytes) is owned
bool guard_in_shadow(uintptr_t a, uintptr_t* app);   // a lies in the shadow: the address it stands for

// Staging: the launch's buffers are copied into an arena of their own, each between unmapped gaps,
// so a pointer run past one buffer never reaches another, nor Python's memory. Buffers that
// overlap (one tensor passed twice, views of one storage) share one staged copy.
struct guard_place { int buf; long long offset; };   // the staged buffer an address is nearest, and where
int guard_stage(clemu_buf* bufs, int n, char* err, size_t errlen);   // rewrites bufs[i].p; 0 or -1 (err)
void guard_unstage();                                 // copies back and releases the arena's pages
bool guard_near_buffer(uintptr_t a, guard_place* out);   // a lies in a staged buffer or in its gap
const void* guard_staged(const void* original);      // a TMA map's global address, as the kernel sees it

// The device heap (malloc, free, new, delete in device code): heap_bytes as cudaLimitMallocHeapSize.
void* guard_malloc(size_t bytes);
bool guard_free(void* p);             // false: p is no block malloc returned (or freed already)
bool guard_heap_place(uintptr_t a, long long* block_start, long long* block_bytes, bool* freed);   // start: an address, -1 for none
int guard_heap_limit(long long bytes);   // 0, or -1 while blocks are still allocated
long long guard_heap_bytes();
