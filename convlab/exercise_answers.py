"""The exercises' answers, kept out of the exercise pages: ex.check_answer(key, value) reads them.

Each entry: key -> (what the verdict calls it, answer(*args)). TARGETS: each kernel's counter
targets for ex.check_counters, from the chapter's kernel on the same shape
(tests/test_exercise_mutants.py measures them again); those of 2.1, 5.2 and 5.3 are measured by
ex.check_targets at the student's tunables (TUNABLES: the notebooks' own).
"""
from __future__ import annotations

from .ops.fused import regtile_config
from .workloads import get as _wl

#: The shape a kernel's counters are graded on where ex.COUNTER_SHAPE does not fit its tiles:
#: (B, C, M, H, W, K, stride, pad).
COUNTER_SHAPES = {
    # 32 maps (one BM tile), 16 x 16 pixels (four BN tiles), depth C K^2 = 72 (nine BK steps)
    "05_register_tiles": (1, 8, 32, 16, 16, 3, 1, 1),
    # 2.1: 32 maps, so that a warp whose lanes run over maps instead of columns shows in its sectors
    "02": (1, 2, 32, 24, 40, 5, 1, 2),
}

#: The tunables of the exercises whose counter targets are measured at the student's own
#: (ex.check_targets(key, **tunables)): the exercise notebook's defaults.
TUNABLES = {
    "05_direct_regtile": {"MT": 4, "ROWS": 3, "BLOCK": 64},
    "05_register_tiles": {"BM": 32, "BN": 64, "BK": 8, "TM": 4, "TN": 8},
}


def _direct_reuse(name: str) -> float:
    wl = _wl(name)
    cfg = regtile_config(wl.M, wl.C, wl.K)
    return wl.K * cfg["MT"] * cfg["ROWS"] / ((cfg["ROWS"] - 1) * wl.stride + wl.K)


ANSWERS = {
    "01.flops": ("FLOPs of {0}", lambda name: _wl(name).flops),
    "01.bytes": ("bytes of {0}", lambda name: _wl(name).bytes),
    "02.too_big_for_z": ("the z map's failures", lambda: ["lenet_c3", "fa17"]),
    "02_timing.quartiles": ("the true statements about the quartiles", lambda: ["a", "c", "d"]),
    "03.reuse": ("multiply-adds per global load", lambda: 16 ** 2 * 49 / 22 ** 2),
    # a warp's read of one tap from global memory: one 32-byte sector for 32 multiply-adds
    "03a_constant_mask.saved": ("global load bytes saved per multiply-add", lambda: 1.0),
    "04.u_bytes": ("bytes of U for lenet_c1", lambda: 12_544_000_000),
    "05_implicit_gemm.saved": ("bytes saved on fa17", lambda: 2 * 4 * 10000 * 25 * 24 * 24),
    "05_register_tiles.saved": ("shared loads saved per multiply-add", lambda: 1.625),
    # lenet_c3 with chapter 5's tunables: K * MT * ROWS multiply-adds per (c, kx) from
    # (ROWS - 1) * stride + K loads of x
    "05_direct_regtile.reuse": ("multiply-adds per global load on lenet_c3", lambda: _direct_reuse("lenet_c3")),
    "06_half2.hfma2": ("HFMA2 instructions for lenet_c3", lambda: 10000 * 34 * 34 * 8 * 196),
    "06_wmma_loop.from_global": ("layers whose A fragments can come from global memory",
                                 lambda: ["days100", "resnet"]),
    "07.extra": ("extra planes per block", lambda: 4 / 36),
    "08.per_weight": ("atomics per weight on lenet_c1", lambda: 10000 * 80 * 80),
    "09a_groups_dilation.macs": ("multiply-adds of {0}", lambda name: _wl(name).flops // 2),
    "09a_groups_dilation.window": ("window of {0}",
                                  lambda name: _wl(name).dilation * (_wl(name).K - 1) + 1),
    "10.saved_bytes": ("bytes of the conv output moved by the three-kernel path on lenet_c1",
                       lambda: 4 * 4 * 10000 * 4 * 80 * 80),
}

#: On a GPU, ex.check_counters also times an exercise's kernel on a course layer beside the
#: chapter's own kernel and torch best: key of ex.check_targets -> (workload, module of convlab.ops, the
#: chapter's Impl by its name).
COMPARE = {
    "02": ("lenet_c1", "naive", "naive flat (1D grid)"),
    "03a": ("lenet_c1", "tiled", "tiled, multi-pass halo load"),
    "05_register_tiles": ("resnet", "fused", "implicit GEMM, register-tiled"),
}

#: Exercises 2.1, 5.2 and 5.3 have no entry: ex.check_targets measures theirs when asked for, on the
#: shape and at the student's tunables.
TARGETS: dict[str, dict] = {
    # ex.COUNTER_SHAPE, chapter 3's conv2d_tiled_halo_multi_pass with TILE=8 and the mask in
    # constant memory: 0.608 bytes of global loads per multiply-add, 6.51 sectors per load request
    "03a": {"global load bytes per multiply-add": 0.61, "sectors per load request": 6.52},
    # exercise 3a.2, the same kernel on the same shape: 0.608 bytes with the mask in constant
    # memory, 1.608 with MASK_IN_CONSTANT=0 (the mask read from w); its warps read one address of
    # c_mask per request (a broadcast)
    "03a_constant_mask": {"global load bytes per multiply-add": 0.61, "constant addresses per request": 1},
    # ex.COUNTER_VOLUME, chapter 7's conv3d_coarse with TX=1, TY=1, BY=4, ZC=4: 3.98 sectors per
    # load request (coalesced rows of a plane), no bank conflicts
    "07": {"sectors per load request": 3.98, "shared bank conflicts": 0},
    # ex.COUNTER_SHAPE, chapter 8's conv2d_dx_gather (bp.conv2d_input_grad_gather's config): no
    # atomics, 4.33 sectors per load request (lanes are consecutive dx columns)
    "08_dx_gather": {"global atomics": 0, "sectors per load request": 4.33},
    # exercise 10.2, the model time of its 8-chunk schedule (convlab.streams.Model): chapter 10's
    # own 8 chunks on streams took 6.39 ms, 1.19x the longer of copy and compute (5.39 ms)
    "10_streams": {"time over the longer of copy and compute": 1.2},
    # exercise 3b.1: a warp's 32 consecutive floats (4 sectors); a tile's column with no conflict
    "03b.scale": {"sectors per load request": 4},
    "03b.colsum": {"shared bank conflicts": 0},
}

#: Exercise 11.1 (ex.check_ring): K of 1, 2 and 5 rounds of the ring, so each stage's mbarriers go
#: through phases of both parities and the parity wraps (a wait two phases behind shows).
RING_ROUNDS = (1, 2, 5)
