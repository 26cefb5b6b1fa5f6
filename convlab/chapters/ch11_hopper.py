"""Chapter 11, Hopper (book/11_hopper.ipynb, kernels/11_hopper/, convlab.ops.wgmma): exercise
11.1's check of a TMA + wgmma ring of mbarriers, and the classic mistake behind each of the
emulator's ring faults.

    from convlab.chapters import ch11_hopper as ch11
    ch11.check_ring(my_ring)      # the %%cuda module of the ring's kernel
"""
from __future__ import annotations

import re

import convlab as cl

from ..teach.checks import Case, run_cases, say
from ..teach.verdict import Verdict

#: Exercise 11.1's check runs K of 1, 2 and 5 rounds of the ring, so each stage's mbarriers go
#: through phases of both parities and the parity wraps (a wait two phases behind shows).
RING_ROUNDS = (1, 2, 5)


#: The ring exercise's kernel: Y (128 x 64, float) = A (128 x K) . B^T, A and B half, K = 64 * steps;
#: a producer warpgroup and two consumer warpgroups; a stage holds A's 128 x 64 box and B's 64 x 64.
RING_BLOCK = 384


RING_STAGE_BYTES = 128 * 64 * 2 + 64 * 64 * 2


_RING_DEADLOCK = re.compile(r"deadlock in block .*?: thread \((\d+),0,0\) waits at mbar_wait at .*? for the phase of "
                            r"parity \d of the mbarrier __shared__ (\w+)\[(\d+)\] \(current phase (\d+)")


def _ring_stages(module) -> int:
    """STAGES as the kernel's cell defines it (the -D of %%cuda first)."""
    if "STAGES" in (getattr(module, "defines", None) or {}):
        return int(module.defines["STAGES"])
    m = re.search(r"^\s*#define\s+STAGES\s+(\d+)", getattr(getattr(module, "src", None), "text", ""), re.M)
    return int(m[1]) if m else 2


def ring_diagnosis(error: BaseException, steps: int, stages: int = 2) -> str:
    """The classic mistake of a producer/consumer ring behind an emulator fault of the ring
    exercise's kernel (steps: its K / 64, over `stages` stages), in one line; "" when it knows none."""
    msg = str(error)
    if "bytes fewer than announced" in msg:
        return ("mbar_arrive_expect_tx announced more bytes than the stage's copies bring: the two boxes, A's "
                "128 x 64 halves and B's 64 x 64, 2 bytes a half")
    if "transaction count would go negative" in msg:
        return ("the copies brought more bytes than mbar_arrive_expect_tx announced: announce, before the "
                "tma_load calls, the bytes of BOTH boxes that land in the stage (A's and B's)")
    if "have completed since this thread last knew it" in msg:
        return ("the producer ran two phases ahead: it refilled a stage without waiting for the consumers to "
                "release it (mbar_wait on empty[s] before each refill from round 1 on)")
    if "still reads (no wgmma_wait covers" in msg and "tma_load" in msg:
        return ("a stage was refilled while a wgmma still read it: it was released (mbar_arrive on empty[s]) "
                "before the wgmma_wait that covers its MMAs. wgmma_wait<1>() leaves the newest group, this "
                "stage's, in flight: after it, release the previous stage")
    if "read of a wgmma accumulator" in msg:
        return ("the epilogue read acc while the last stage's MMAs were in flight: after the loop, "
                "wgmma_wait<0>() (wgmma_wait<1> leaves the newest group running)")
    if "before this thread has waited for the copy" in msg:
        return ("a consumer read the stage before its wait for this round's copy returned: mbar_wait on "
                "full[s] with the round's parity, before the wgmma")
    if "one arrival too many" in msg:
        return ("a barrier got more arrivals in a phase than mbar_init counts: full[s] takes the producer's "
                "one mbar_arrive_expect_tx a round, empty[s] one mbar_arrive per consumer warpgroup")
    m = _RING_DEADLOCK.search(msg)
    if m is None:
        return ""
    producer, bar, s, phase = int(m[1]) < 128, m[2], int(m[3]), int(m[4])
    if bar == "empty" and not producer:
        return ("a consumer waits on empty[s]: consumers wait on full[s] (the stage's boxes have landed) and "
                "arrive on empty[s] when they are done with it")
    if bar == "empty" and phase > steps:
        return (f"empty[{s}] completed {phase} phases, more than the {steps} stages of K there are to release: "
                "it gets too many arrivals. mbar_init(&empty[s], 2) counts one arrival per consumer warpgroup: "
                "one thread of each arrives (t == 0), not all 128")
    if bar == "empty" and phase == 0:
        return ("no consumer has released this stage yet: in the producer's first round (k < STAGES) the stages "
                "are empty and need no wait; round r >= 1 waits for phase r - 1 of empty[s], parity (r - 1) & 1")
    if bar == "empty":
        return ("the producer waits for a release that never comes: round r >= 1 waits for phase r - 1 of "
                "empty[s] (parity (r - 1) & 1), and each consumer warpgroup arrives on empty[s] once a round")
    rounds = len(range(s, steps, stages))      # the rounds of stage s: one phase of full[s] each
    if bar == "full" and phase > rounds:
        return (f"full[{s}] completed {phase} phases, more than the {rounds} round{'s' if rounds > 1 else ''} of "
                f"stage {s}: it gets more than one arrival a round. One mbar_arrive_expect_tx per round announces "
                "the bytes of both boxes; the copies bring bytes, not arrivals")
    if bar == "full" and phase >= 2:
        return (f"full[{s}] completed {phase} phases while the consumers still wait for an earlier one: the "
                f"producer refilled stage {s} before the consumers released it. Before each refill (round "
                "r >= 1) it waits on empty[s] for parity (r - 1) & 1; a wait with the other parity returns at once")
    if bar == "full":
        return ("the consumers' wait on full[s] has the wrong parity: round r of stage s is phase r of full[s], "
                "parity r & 1")
    return ""


def _ring_where(index) -> str:
    """Who holds Y[i][j] in the ring kernel: wgmma m64n64's accumulator layout, warpgroup 1 rows 0-63."""
    i, j = (int(v) for v in index)
    r = i % 64
    return (f"warpgroup {1 + i // 64}, warp {r // 16}, lane {4 * (r % 8) + (j % 8) // 2}, "
            f"acc[{4 * (j // 8) + 2 * (r % 16 // 8) + j % 2}]")


def check_ring(module, *, kernel: str = "ring_gemm", name: str = "your ring") -> Verdict:
    """Exercise 11.1's pipelined GEMM: module (the %%cuda cell's) has kernel(Y, a_map, b_map, steps)
    for Y (128 x 64, float, poisoned with NaN first) = A (128 x 64*steps) . B^T (B 64 x 64*steps),
    both half, on one block of 384 threads with STAGES stages of RING_STAGE_BYTES. Run with K of 1,
    2 and 5 rounds of the ring (RING_ROUNDS) against fp64, on the emulator with the
    threads in forward order (whatever cl.thread_order says outside); a fault (the emulator
    checks every wait's parity, every arrival and byte count, every stage refilled while in use)
    is printed with ring_diagnosis's line. On the emulator, or an H100/H200 (sm_90a); on another
    GPU it says so in one line. A wrong protocol may hang a GPU: check on the emulator first."""
    import torch


    if cl.backend() == "cuda" and tuple(cl.device().cc or ()) != (9, 0):
        return say(False, f"the ring's kernel needs wgmma and TMA, an H100 or H200 (sm_90a); this GPU is "
                           f"{cl.device().name}: run this notebook on the emulator (CONVLAB_BACKEND=emu)")
    stages = _ring_stages(module)
    shared = stages * RING_STAGE_BYTES + 1024      # + the slack that rounds the tiles up to 1024 bytes
    steps_of = {}

    def cases():
        for rounds in RING_ROUNDS:
            steps = rounds * stages
            A, B = cl.randn(128, 64 * steps).half(), cl.randn(64, 64 * steps).half()
            Y = cl.to_device(torch.full((128, 64), float("nan")))
            ref = A.double().cpu() @ B.double().cpu().T
            first = A[:, :64].double().cpu() @ B[:, :64].double().cpu().T
            mistakes = [
                ("every step multiplied the boxes at column 0: step k's boxes start at column 64 * k (tma_load_2d's "
                 "coordinates go innermost first: the column, then the row)", lambda first=first, steps=steps:
                 steps * first),
                ("only the first step's 64 columns of K count: are tma_load_2d's coordinates swapped? The column "
                 "(64 * k) comes first, then the row (0)", lambda first=first: first)]

            def run(A=A, B=B, Y=Y, steps=steps):
                steps_of["now"] = steps
                # the emulator's forward order runs the producer as soon as a stage is released: a
                # release before the wgmma_wait that covers the stage is then a refill while in use
                # (in reverse order the consumers reach their wait first, and it goes unseen)
                with cl.thread_order("forward"):
                    module.kernel(kernel)(Y, cl.tensor_map(A, (128, 64)), cl.tensor_map(B, (64, 64)), steps,
                                          grid=(1, 1, 1), block=(RING_BLOCK, 1, 1), shared=shared,
                                          max_shared=shared + 1024)   # + the static __shared__: the mbarriers
            yield Case(f"K = {64 * steps} ({rounds} round{'s' if rounds > 1 else ''} of the {stages}-stage ring)",
                        "", run, Y, ref, mistakes=mistakes if steps > 1 else None, locate=_ring_where)

    where = ("on the emulator, which checks every wait's parity, every arrival and byte count and every stage "
             "refilled while in use; on an H100 or H200 this check runs it on the GPU"
             if cl.backend() == "emu" else f"on {cl.device().name}")
    return run_cases(module, cases(), name=name, labels="ij", out_index=None,
                      passed=f"matches the fp64 reference with K of {', '.join(map(str, RING_ROUNDS))} rounds of "
                             f"the ring ({where})",
                      explain=lambda e: ring_diagnosis(e, steps_of.get("now", 0), stages))
