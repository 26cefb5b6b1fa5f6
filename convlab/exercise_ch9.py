"""Checks for chapter 9's exercises beyond convlab.exercise's (built on its public helpers: Verdict,
describe_error, check_value), printing a verdict a student can act on and never raising.

    import convlab.exercise_ch9 as ch9
    ch9.check_swizzle(module)          # exercise 9b.2: swz() of a %%cuda module (BK=64 and BK=32 builds)
    ch9.check_stage_budget(stage_bytes, stages_fit, blocks_per_sm)   # exercise 9b.2, part 2
    ch9.swizzle_targets()              # the bank conflicts chapter 9b's own swizzle leaves (the target)

The swizzle is graded on the emulator's counters: the shared-memory bank conflicts of a warp's
ldmatrix reads of a tile stored through the student's swz(), against the count chapter 9b's own
swz() (kernels/09_general/conv2d_mma.cu) gives in the same harness, and the data read back must be
the tile's (a swizzle that sends two chunks of a row to one slot loses one of them).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

import convlab as cl

from ._paths import path
from .book import Source
from .exercise import Verdict, check_value, describe_error
from .ops import tensor_core as tc
from .workloads import get as workload

#: The tile the harness stores and reads back: ROWS rows of BK halves, each read by ldmatrix.x4
#: phases of 8 rows at one 16-byte chunk column, as chapter 9b's main loop reads its A tile.
ROWS = 32
BKS = (64, 32)
CONFLICTS = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"

HARNESS = r"""
// Requires sm_80 or newer: ldmatrix
#include "09_general/tensor_core.cuh"
#define TILE_ROWS %(rows)d
constexpr int CHUNKS = BK / 8;   // 16-byte chunks in a shared row

%(swz)s

__device__ int at(int row, int chunk) { return row * BK + swz(row, chunk) * 8; }

// One warp stores the tile row by row (16 bytes a lane), then reads it back as chapter 9b's main
// loop does: per 16 rows and 16 columns an ldmatrix.x4, lane l giving row l & 15, chunk
// 2kk + (l >> 4). regs gets what every lane received.
__global__ void tile_reads(const unsigned short* A, unsigned* regs)
{
    __shared__ __align__(16) unsigned short s[TILE_ROWS * BK];
    const int l = threadIdx.x;
    for (int i = l; i < TILE_ROWS * CHUNKS; i += 32) {
        const int row = i / CHUNKS, chunk = i %% CHUNKS;
        *(uint4*)&s[at(row, chunk)] = *(const uint4*)&A[row * BK + chunk * 8];
    }
    __syncthreads();
    for (int r0 = 0; r0 < TILE_ROWS; r0 += 16)
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned a[4];
            ldmatrix_x4(a, &s[at(r0 + (l & 15), 2 * kk + (l >> 4))]);
            for (int i = 0; i < 4; i++)
                regs[((r0 / 16 * (BK / 16) + kk) * 32 + l) * 4 + i] = a[i];
        }
}
"""


def _chapters_swz() -> str:
    """Chapter 9b's swz(), as conv2d_mma.cu has it, with its swizzle on."""
    src = Source("kernels/09_general/conv2d_mma.cu::swz")
    return "#define SWIZZLE 1\n" + "\n".join(src.lines)


def _run(module, bk: int):
    """(what every lane's ldmatrix received, the bank conflicts of the whole harness), on the
    emulator's counters (cl.profile runs there when no GPU is present)."""
    a = torch.arange(ROWS * bk, dtype=torch.int32).to(torch.int16)
    regs = cl.zeros(ROWS // 16 * bk // 16 * 32 * 4, dtype=torch.int32)
    card = cl.profile(module.kernel("tile_reads"), cl.to_device(a), regs, grid=1, block=32)
    return regs.cpu().numpy().copy(), card.kernel("tile_reads").value(CONFLICTS)


def _build(swz_source: str, bk: int, name: str):
    return cl.load_source(HARNESS % {"rows": ROWS, "swz": swz_source}, name=name, defines={"BK": bk},
                          directory=path("kernels"))


@functools.cache
def swizzle_targets() -> dict:
    """{BK: (the data the reads must return, the bank conflicts chapter 9b's swz leaves)}: the
    unswizzled tile read back gives the data (a swizzle only moves chunks), the chapter's swizzle
    the conflicts to meet."""
    out = {}
    for bk in BKS:
        plain, _ = _run(_build("__device__ int swz(int row, int chunk) { (void)row; return chunk; }", bk,
                               f"swz_plain_{bk}"), bk)
        _, conflicts = _run(_build(_chapters_swz(), bk, f"swz_chapter_{bk}"), bk)
        out[bk] = (plain, conflicts)
    return out


def check_swizzle(module, *, name: str = "your swizzle") -> Verdict:
    """module: a %%cuda module whose source defines `__device__ int swz(int row, int chunk)` (the
    slot of 16-byte chunk `chunk` of shared row `row`, rows of BK halves, CHUNKS = BK / 8 of them).
    Built into the harness for BK = 64 and BK = 32: the tile must come back whole through ldmatrix,
    with no more bank conflicts than chapter 9b's own swizzle leaves."""
    text = module.src.text
    if "__device__ int swz" not in text:
        return _say(False, f"✗ {name}: the cell defines no `__device__ int swz(int row, int chunk)`")
    body = text[text.index("__device__ int swz"):]
    depth, end = 0, None
    for i, ch in enumerate(body):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "}" and depth == 0:
            end = i + 1
            break
    swz = body[:end]
    parts = []
    ok = True
    for bk in BKS:
        want, most = swizzle_targets()[bk]
        try:
            got, conflicts = _run(_build(swz, bk, f"{module.path.stem}_swz_{bk}"), bk)
        except Exception as e:  # noqa: BLE001 (a check never stops the notebook)
            why = (" (a slot past the row's end: swz(row, chunk) must stay below CHUNKS = BK / 8, "
                   f"{bk // 8} here)" if isinstance(e, cl.ConvlabError) and "out-of-range" in str(e) else "")
            return _say(False, f"✗ {name}, BK={bk}: {describe_error(e)}{why}")
        if not np.array_equal(got, want):
            lost = int((got != want).sum())
            return _say(False, f"✗ {name}, BK={bk}: {lost:,} of the {got.size:,} values ldmatrix read back are "
                               "not the tile's: two chunks of a row land in one slot (a swizzle must be a "
                               "permutation of each row's CHUNKS slots: XOR the chunk with a number below CHUNKS)")
        good = conflicts <= most
        ok &= good
        parts.append(f"BK={bk}: {conflicts:,.0f} bank conflicts (target ≤ {most:,.0f}){'' if good else ' ✗'}")
    lead = "✓ correct" if ok else "✗ the tile comes back right, but not within the targets"
    return _say(ok, f"{lead}: {name}: " + "; ".join(parts))


def stage_budget(tile: dict | None = None) -> dict:
    """The answers of exercise 9b.2's part 2 for a tile (chapter 9b's resnet tile by default): the
    shared bytes of one stage, the most stages a block's opt-in shared memory holds, and the blocks
    of the tile's own depth an SM's shared memory holds (each block also costs the 1 KB the driver
    reserves)."""
    t = tile or tc.mma_config(workload("resnet"))
    stage = (t["BM"] + t["BN"]) * t["BK"] * 2
    fits = max(s for s in range(2, 64) if tc.shared_bytes(**dict(t, STAGES=s)) <= tc.SHARED_OPTIN_MAX)
    per_sm = SM_SHARED // (tc.shared_bytes(**t) + RESERVED_PER_BLOCK)
    return {"stage bytes": stage, "stages that fit": fits, "blocks per SM": per_sm}


SM_SHARED = 228 * 1024           # an H100/H200 SM's shared memory
RESERVED_PER_BLOCK = 1024        # what the driver keeps of it per resident block


def check_stage_budget(stage_bytes, stages_fit, blocks_per_sm) -> Verdict:
    """Exercise 9b.2, part 2: three numbers about chapter 9b's resnet tile."""
    want = stage_budget()
    verdicts = [check_value("the shared bytes of one stage", stage_bytes, want["stage bytes"]),
                check_value("the most stages one block's shared memory holds", stages_fit, want["stages that fit"]),
                check_value("blocks of the tile per SM, by shared memory", blocks_per_sm, want["blocks per SM"])]
    return Verdict(all(verdicts), "\n".join(v.text for v in verdicts))


def _say(ok: bool, text: str) -> Verdict:
    print(text)
    return Verdict(ok, text)
