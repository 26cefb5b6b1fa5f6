"""Chapter 9b, tensor cores below WMMA (book/09b_tensor_cores.ipynb, kernels/09_general/,
convlab.ops.tensor_core): its figures (which lane holds which element of mma.sync m16n8k16's
operands, which lane gives and gets each row of ldmatrix), and its exercises' checks: 9b.1's
fragments lane by lane, 9b.2's swizzle graded on the emulator's bank conflicts and its stage budget.

    from convlab.chapters import ch09b_tensor_cores as ch9b
    fig = ch9b.mma_fragments()
    fig = ch9b.pipeline_figure(stages=3, steps=6)     # what each shared buffer holds, step by step
    ch9b.check_fragment("A fragment", regs, a_element, "A")   # a warp's registers against a layout
    ch9b.check_placement("D", D, d_element)                   # where each lane's d[i] went
    ch9b.check_swizzle(module)          # exercise 9b.2: swz() of a %%cuda module (BK=64 and BK=32 builds)
    ch9b.check_stage_budget(stage_bytes, stages_fit, blocks_per_sm)   # exercise 9b.2, part 2
    ch9b.swizzle_targets()              # the bank conflicts chapter 9b's own swizzle leaves (the target)

The swizzle is graded on the emulator's counters: the shared-memory bank conflicts of a warp's
ldmatrix reads of a tile stored through the student's swz(), against the count chapter 9b's own
swz() (kernels/09_general/conv2d_mma.cu) gives in the same harness, and the data read back must be
the tile's (a swizzle that sends two chunks of a row to one slot loses one of them).
"""
from __future__ import annotations

import functools
import json

import matplotlib.pyplot as plt
import numpy as np
import seaborn as sns
import torch

import convlab as cl

from ..display import plots
from ..display.book import Source
from ..display.diagrams import FONT, PALETTE, by_index, draw_grid, light, new_figure
from ..gpu._paths import path
from ..measuring import workloads
from ..ops import tensor_core as tc
from ..teach.checks import check_value, describe_error, say, unfinished
from ..teach.verdict import Verdict, as_numpy


FRAGMENTS_FILE = "kernels/09_general/mma_fragments.cu"


def mma_fragment_maps() -> dict:
    """Which element of the m16n8k16 operands each lane holds, found by running
    kernels/09_general/mma_fragments.cu on the backend: A (16×16) loaded by ldmatrix_x4 and B (16×8,
    k-major) by ldmatrix_x2_trans as the course's kernels load them, each element's code (row·cols
    + col) in its 16 bits; then C/D from mma.sync itself: A = identity and B = the codes, so D = B
    arrives in D's layout. Returns {"A": (32, 8, 2), "B": (32, 4, 2), "D": (32, 4, 2)} arrays of
    (row, col) per lane and element (element e is register e//2, its low half first)."""
    import torch
    mod = cl.load(FRAGMENTS_FILE)

    def ldmatrix(rows, variant):
        out = cl.to_device(torch.full((32, 4), -1, dtype=torch.int32))
        mod.ldmatrix_lanes(cl.to_device(torch.from_numpy(rows.astype(np.uint16).view(np.int16))),
                           cl.to_device(torch.arange(32, dtype=torch.int32)), out, variant, grid=1, block=32)
        return out.cpu().numpy().view(np.uint32)

    def halves(regs, n):
        return np.stack([regs[:, :n] & 0xFFFF, regs[:, :n] >> 16], axis=-1).reshape(32, 2 * n)

    # A: lane l passes row l % 16, columns 8·(l / 16) .. +7 (matrices 0..3 = the four 8×8 quarters)
    a_code = np.arange(256).reshape(16, 16)
    rows = np.stack([a_code[l % 16, 8 * (l // 16):8 * (l // 16) + 8] for l in range(32)])
    a = halves(ldmatrix(rows, 2), 4)
    # B (k × n, row-major k-major): lanes 0..15 pass rows k = 0..15; .trans gives the column-major fragments
    b_code = np.arange(128).reshape(16, 8)
    rows = np.concatenate([b_code, np.zeros((16, 8), int)])
    b = halves(ldmatrix(rows, 4), 2)

    def place(regs_map, values):
        """Registers per lane holding values[code] as fp16 where regs_map (32, e) puts each code."""
        h = values.astype(np.float16).view(np.uint16).astype(np.uint32)[regs_map]
        return (h[:, 0::2] | (h[:, 1::2] << 16)).astype(np.uint32)

    ra = place(a, np.eye(16).reshape(-1))
    rb = place(b, np.arange(128, dtype=float))
    d = cl.to_device(torch.zeros((32, 4), dtype=torch.float32))
    mod.mma_lanes(cl.to_device(torch.from_numpy(ra.view(np.int32))), cl.to_device(torch.from_numpy(rb.view(np.int32))),
                  cl.to_device(torch.zeros((32, 4), dtype=torch.float32)), d, 0, grid=1, block=32)
    dcode = d.cpu().numpy().round().astype(int)
    return {"A": np.stack(divmod(a, 16), -1), "B": np.stack(divmod(b, 8), -1), "D": np.stack(divmod(dcode, 8), -1)}


def mma_fragments():
    """Figure: the three operands of mma.sync.m16n8k16 (A 16×16, B 16×8, C/D 16×8), each element
    labelled with the lane that holds it and coloured by the lane's group (lane / 4), as the
    emulator's mma_fragments.cu reports them (the same layout the GPU tests check against). What to
    see: a group of four lanes shares a row of A and of C/D (and rows g and g+8), its lanes taking
    consecutive pairs of columns; in B the roles turn: a group holds a column. WMMA's 16×16×16
    fragments have no documented layout (the emulator keeps each lane a whole copy), which is why
    the course's chapter 9 kernels move to mma.sync."""
    maps = mma_fragment_maps()
    fig, axes = new_figure(1, 3, height=3.7, gridspec_kw={"width_ratios": [16, 8, 8]})
    for ax, name, shape, title in zip(axes, ("A", "B", "D"), ((16, 16), (16, 8), (16, 8)),
                                      ("A (16×16, row × k)", "B (16×8, k × col)", "C and D (16×8)")):
        lane = -np.ones(shape, int)
        for l in range(32):
            for r, c in maps[name][l]:
                lane[r, c] = l
        draw_grid(ax, by_index(lane // 4, [light(c, 0.6) for c in sns.color_palette("colorblind", 8)]), lane.astype(str),
              title=title,
              fontsize=FONT)
    fig.suptitle("mma.sync m16n8k16: the lane that holds each element (colour: lane / 4)", fontsize=FONT + 2)
    fig.convlab_data = maps
    return fig


def ldmatrix_lanes():
    """Figure: ldmatrix as the course's mma kernels use it, from the same run as mma_fragments. Left,
    ldmatrix.x4 loading A (16×16 halves in shared memory): lane l gives the address of one 8-half
    row (row l % 16, the left half for l < 16, the right half otherwise; the tick labels), each
    8×8 quarter is one of the four matrices (colour), and each element is labelled with the lane
    that receives it. Right, ldmatrix.x2.trans loading B (16×8, k-major): lanes 0–15 give the row
    addresses, and .trans hands each lane a column pair instead of a row pair. What to see: the
    lane that names an address is not the lane that gets its data; every lane receives two
    neighbouring halves of one row (x4) or of one column (.trans) per matrix, which is exactly
    the fragment mma.sync expects."""
    maps = mma_fragment_maps()
    fig, (a, b) = new_figure(1, 2, height=4.2, gridspec_kw={"width_ratios": [16, 8]})
    recv = -np.ones((16, 16), int)
    for l in range(32):
        for r, c in maps["A"][l]:
            recv[r, c] = l
    quarter = (np.arange(16)[:, None] // 8) + 2 * (np.arange(16)[None, :] // 8)
    draw_grid(a, [[light(PALETTE[q], 0.6) for q in row] for row in quarter], recv.astype(str),
          title="ldmatrix.x4: A, four 8×8 matrices")
    a.set_yticks(range(16), [f"{r}" for r in range(16)], fontsize=FONT)
    a.tick_params(labelleft=True)
    a.set_ylabel("address from lane (left half)", fontsize=FONT)
    right = a.secondary_yaxis("right")
    right.set_yticks(range(16), [f"{r + 16}" for r in range(16)], fontsize=FONT)
    right.set_ylabel("(right half)", fontsize=FONT)
    recv = -np.ones((16, 8), int)
    for l in range(32):
        for r, c in maps["B"][l]:
            recv[r, c] = l
    draw_grid(b, [[light(PALETTE[r // 8], 0.6) for _ in range(8)] for r in range(16)], recv.astype(str),
          title="ldmatrix.x2.trans: B (k × n)")
    b.set_yticks(range(16), [f"{k}" for k in range(16)], fontsize=FONT)
    b.tick_params(labelleft=True)
    b.set_ylabel("address from lane", fontsize=FONT)
    fig.suptitle("ldmatrix: the lane that receives each element (cell text)", fontsize=FONT + 2)
    fig.convlab_data = maps
    return fig


def _halves(reg: int) -> tuple[int, int]:
    return reg & 0xFFFF, reg >> 16


def check_fragment(name: str, regs, element, matrix: str = "A", *, todo=None) -> Verdict:
    """regs: the (32, R) 32-bit registers each lane of a warp holds after loading a tile whose
    element (row, col) is the number 16 * row + col, so each 16-bit half says where it came from.
    element(lane, j) is the (row, col) the fragment's element j of that lane must be; register i
    holds elements 2i (low half) and 2i+1 (high half). Names the first wrong lane and register.
    todo: the module (or function) the registers came from: "not done yet" while its TODO is left."""
    if regs is None:
        return say(False, f"✗ no registers for {name}: the kernel did not run")
    got = np.ascontiguousarray(as_numpy(regs)).view(np.uint32).reshape(32, -1)

    def at(v):
        return f"{matrix}[{v // 16}][{v % 16}]" if v < 256 else f"0x{v:04x} (no element of the tile: never loaded?)"
    wrong = []
    for lane in range(32):
        for i in range(got.shape[1]):
            want = [16 * r + c for r, c in (element(lane, 2 * i), element(lane, 2 * i + 1))]
            if list(_halves(int(got[lane, i]))) != want:
                wrong.append((lane, i, _halves(int(got[lane, i])), want))
    if not wrong:
        return say(True, f"✓ correct: {name}: all {got.size} registers of the warp hold what the layout says")
    stub = unfinished(todo)
    if stub is not None:
        return stub
    lane, i, has, want = wrong[0]
    return say(False, f"✗ {name}: lane {lane}, register {i} holds {at(has[0])}, {at(has[1])}; the layout needs "
                       f"{at(want[0])}, {at(want[1])} ({len(wrong)} of {got.size} registers wrong)")


def check_placement(name: str, out, element, *, todo=None) -> Verdict:
    """out: the 2-D output a warp wrote, each lane's d[i] holding the number 4 * lane + i; element(lane, i)
    is the (row, col) where d[i] of that lane belongs. Names the first misplaced value. todo: as
    in check_fragment."""
    if out is None:
        return say(False, f"✗ no {name}: the kernel did not run")
    got = as_numpy(out).astype(np.float64)
    if np.isnan(got).all():
        return unfinished(todo) or say(False, f"✗ nothing of {name} was written")
    want = np.full(got.shape, np.nan)
    for lane in range(32):
        for i in range(4):
            want[element(lane, i)] = 4 * lane + i
    bad = np.argwhere(~(got == want))
    if not len(bad):
        return say(True, f"✓ correct: {name}: every lane's d[0..3] is where the layout puts it")
    stub = unfinished(todo)
    if stub is not None:
        return stub
    r, c = (int(v) for v in bad[0])
    has = "nothing (never written)" if np.isnan(got[r, c]) else f"lane {int(got[r, c]) // 4}'s d[{int(got[r, c]) % 4}]"
    belongs = int(want[r, c])
    return say(False, f"✗ {name}[{r}][{c}] holds {has}; the layout puts lane {belongs // 4}'s d[{belongs % 4}] "
                       f"there ({len(bad)} of {got.size} wrong)")


def pipeline_figure(stages: int, steps: int):
    """Figure: which tile each of the `stages` shared buffers holds at each step of
    conv2d_mma.cu's main loop (after its prologue), and whether it is being copied (cp.async in
    flight), multiplied (ldmatrix + mma.sync) or waits, landing or landed. What to see: while one
    buffer is multiplied, stages - 1 tiles are already on their way. convlab_data: cells
    {(buffer, column): (tile, "copy" | "mma" | "wait")}."""
    fig, ax = plt.subplots(figsize=(plots.PAGE_WIDTH_IN, 0.55 * stages + 1.6),
                           layout="constrained")
    copy_c, mma_c = sns.color_palette("colorblind", 2)
    cols = ["prologue"] + [f"step {t}" for t in range(steps)]
    cells = {}
    for b in range(stages):
        for j, _ in enumerate(cols):
            # the step; the prologue copies tiles 0..stages-2
            t = j - 1
            if t < 0:
                tile, what = (b, "copy") if b < stages - 1 else (None, None)
            elif b == t % stages:
                tile, what = t, "mma"
            elif b == (t + stages - 1) % stages:
                tile, what = t + stages - 1, "copy"
            else:                           # a tile copied earlier, landing or landed
                tile = next(k for k in range(t + 1, t + stages) if k % stages == b)
                what = "wait"
            if tile is None:
                continue
            cells[b, cols[j]] = (tile, what)
            color = {"copy": copy_c, "mma": mma_c, "wait": (0.85, 0.85, 0.85)}[what]
            ax.add_patch(plt.Rectangle((j + 0.04, b + 0.08), 0.92, 0.84, color=color))
            label = {"copy": f"copy {tile}", "mma": f"mma {tile}",
                     "wait": f"tile {tile}"}[what]
            ax.text(j + 0.5, b + 0.5, label, ha="center", va="center", fontsize=9,
                    color="white" if what == "mma" else "black")
    ax.set_xlim(0, len(cols))
    ax.set_ylim(stages, 0)
    ax.set_xticks([j + 0.5 for j in range(len(cols))], cols)
    ax.set_yticks([b + 0.5 for b in range(stages)],
                  [f"buffer {b}" for b in range(stages)])
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    ax.set_title(f"{stages}-stage cp.async pipeline: copies issued (blue), tiles multiplied (orange)")
    fig.convlab_data = {"cells": cells}
    return fig


def swizzle_counts() -> None:
    """Prints, as JSON {"True": [...], "False": [...]}, the shared-load bank conflicts and shared-load
    instructions of conv2d_mma on resnet's small twin with the swizzle on and off (SWIZZLE=0), on
    the emulator's counters (run it there: book.on_emulator(swizzle_counts))."""
    s = workloads.get("resnet").small()
    x = cl.randn(*s.x_shape,
                 dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    w = cl.randn(*s.w_shape,
                 dtype=torch.float16).contiguous(memory_format=torch.channels_last)
    out = {}
    for on in (True, False):
        card = cl.profile(tc.MMA.launcher, x, w, **s.conv_kwargs(), swizzle=on)
        k = card.kernel("conv2d_mma")
        out[str(on)] = [
            k.value("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
            k.value("smsp__inst_executed_op_shared_ld.sum")]
    print(json.dumps(out))


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
        return say(False, f"✗ {name}: the cell defines no `__device__ int swz(int row, int chunk)`")
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
            return say(False, f"✗ {name}, BK={bk}: {describe_error(e)}{why}")
        if not np.array_equal(got, want):
            lost = int((got != want).sum())
            return say(False, f"✗ {name}, BK={bk}: {lost:,} of the {got.size:,} values ldmatrix read back are "
                               "not the tile's: two chunks of a row land in one slot (a swizzle must be a "
                               "permutation of each row's CHUNKS slots: XOR the chunk with a number below CHUNKS)")
        good = conflicts <= most
        ok &= good
        parts.append(f"BK={bk}: {conflicts:,.0f} bank conflicts (target ≤ {most:,.0f}){'' if good else ' ✗'}")
    lead = "✓ correct" if ok else "✗ the tile comes back right, but not within the targets"
    return say(ok, f"{lead}: {name}: " + "; ".join(parts))


def stage_budget(tile: dict | None = None) -> dict:
    """The answers of exercise 9b.2's part 2 for a tile (chapter 9b's resnet tile by default): the
    shared bytes of one stage, the most stages a block's opt-in shared memory holds, and the blocks
    of the tile's own depth an SM's shared memory holds (each block also costs the 1 KB the driver
    reserves)."""
    t = tile or tc.mma_config(workloads.get("resnet"))
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
