"""Chapter 7 launchers: single-channel 3D convolution (kernels/07_conv3d/), and a dispatcher.

The LeetGPU 3D challenge: x (D, H, W) float32, a mask (KD, KH, KW), a valid cross-correlation,
y (D-KD+1, H-KH+1, W-KW+1). The launchers also take the 5-D torch shapes (1, 1, D, H, W) and
(1, 1, KD, KH, KW) and then return (1, 1, Do, Ho, Wo).

- conv3d_naive: one thread per output, mask from global memory; sizes at run time.
- conv3d_tiled: a 3D shared-memory tile with halo per block (TX×TY×TZ outputs), the mask in
  __constant__ memory, one output per thread.
- conv3d_cube: step 2's kernel with CX×CY×CZ outputs per thread (a cube, a block's width apart),
  the coarsening that keeps the shared load per FMA.
- conv3d_coarse: warp-wide rows along x, TX×TY outputs per thread, each block walking ZC output
  planes down z with a rolling window of KZ accumulators per output; one input plane (with its x/y
  halo) in shared memory at a time, double-buffered; the mask in registers (MASK_REGS=1) or in
  __constant__ memory (MASK_REGS=0).
- pick(shape) / conv3d_best: the coarsened kernel with coarse_config's tunables.

Every launcher takes stride= and padding= like the 2D ones; the kernels compute the challenge's
valid convolution, so only stride 1 and padding 0.
"""
from __future__ import annotations

from ..gpu._limits import SHARED_DEFAULT_MAX
from ..measuring.workloads import Workload
from . import Impl, ceil_div, output
from ._kernels import Launch, remember

NAIVE_FILE = "kernels/07_conv3d/conv3d_naive.cu"
TILED_FILE = "kernels/07_conv3d/conv3d_tiled.cu"
CUBE_FILE = "kernels/07_conv3d/conv3d_cube.cu"
COARSE_FILE = "kernels/07_conv3d/conv3d_coarse.cu"

CONSTANT_FLOATS = 16384   # 64 KB of __constant__ memory


def conv3d_shapes(x, w, stride: int = 1, padding: int = 0):
    """(D, H, W, KD, KH, KW, Do, Ho, Wo, five_d) for x (D,H,W) or (1,1,D,H,W) and a matching mask."""
    if stride != 1 or padding != 0:
        raise ValueError(f"stride {stride}, padding {padding}: the 3D kernels compute the challenge's valid "
                         f"convolution, stride 1 and padding 0 only")
    five_d = x.dim() == 5
    if five_d:
        if tuple(x.shape[:2]) != (1, 1) or w.dim() != 5 or tuple(w.shape[:2]) != (1, 1):
            raise ValueError(f"one channel in, one out: expected x (1,1,D,H,W) and w (1,1,KD,KH,KW), got "
                             f"{tuple(x.shape)} and {tuple(w.shape)}")
    elif x.dim() != 3 or w.dim() != 3:
        raise ValueError(f"expected x (D,H,W) and w (KD,KH,KW), got {tuple(x.shape)} and {tuple(w.shape)}")
    D, H, W = (int(s) for s in x.shape[-3:])
    KD, KH, KW = (int(s) for s in w.shape[-3:])
    Do, Ho, Wo = D - KD + 1, H - KH + 1, W - KW + 1
    if min(Do, Ho, Wo) < 1:
        raise ValueError(f"no output: input {D}×{H}×{W}, mask {KD}×{KH}×{KW} (valid convolution)")
    if D * H * W > 2**31 - 1:
        raise ValueError(f"x has {D * H * W:,} elements: too many for int indices")
    return D, H, W, KD, KH, KW, Do, Ho, Wo, five_d


def _out_shape(Do, Ho, Wo, five_d):
    return (1, 1, Do, Ho, Wo) if five_d else (Do, Ho, Wo)


def _aligned16(t) -> bool:
    return t.is_meta or t.data_ptr() % 16 == 0


_plans: dict = {}


# ---- step 1: one thread per output ------------------------------------------------------------------

def conv3d_naive(x, w, y=None, *, stride: int = 1, padding: int = 0, BX: int | None = None,
                 BY: int | None = None, BZ: int | None = None):
    """Blocks of BX×BY×BZ threads (default 32×4×2), one output each."""
    def build():
        D, H, W, KD, KH, KW, Do, Ho, Wo, five = conv3d_shapes(x, w, stride, padding)
        grid = (ceil_div(Wo, bx), ceil_div(Ho, by), ceil_div(Do, bz))
        return _out_shape(Do, Ho, Wo, five), Launch(NAIVE_FILE, "conv3d_naive", {"BX": bx, "BY": by, "BZ": bz},
                                                    (D, H, W, KD, KH, KW), grid=grid, block=(bx, by, bz))

    bx, by, bz = int(BX or 32), int(BY or 4), int(BZ or 2)
    shape, launch = remember(_plans, ("naive", x.shape, w.shape, stride, padding, bx, by, bz), build)
    y = output(y, shape, x)
    launch(x, w, y)         # 5-D or 3-D: the kernels see the same contiguous data
    return y


# ---- step 2: 3D shared tile with halo, mask in constant memory ---------------------------------------

def tiled_shared(TX: int, TY: int, TZ: int, KD: int, KH: int, KW: int) -> int:
    return 4 * (TX + KW - 1) * (TY + KH - 1) * (TZ + KD - 1)


def conv3d_tiled(x, w, y=None, *, stride: int = 1, padding: int = 0, TX: int | None = None,
                 TY: int | None = None, TZ: int | None = None):
    """TX×TY×TZ outputs per block (default 32×4×4), the input box in shared memory."""
    def build():
        D, H, W, KD, KH, KW, Do, Ho, Wo, five = conv3d_shapes(x, w, stride, padding)
        if KD * KH * KW > CONSTANT_FLOATS:
            raise ValueError(f"the mask has {KD * KH * KW:,} values, over the {CONSTANT_FLOATS:,} of constant memory")
        if tx * ty * tz > 1024:
            raise ValueError(f"a {tx}x{ty}x{tz} block has over 1024 threads")
        if tiled_shared(tx, ty, tz, KD, KH, KW) > SHARED_DEFAULT_MAX:
            raise ValueError(f"the input box of a {tx}x{ty}x{tz} tile with a {KD}x{KH}x{KW} halo is over 48 KB")
        grid = (ceil_div(Wo, tx), ceil_div(Ho, ty), ceil_div(Do, tz))
        return _out_shape(Do, Ho, Wo, five), Launch(
            TILED_FILE, "conv3d_tiled", {"TX": tx, "TY": ty, "TZ": tz, "KZ": KD, "KY": KH, "KX": KW}, (D, H, W),
            grid=grid, block=(tx, ty, tz))

    tx, ty, tz = int(TX or 32), int(TY or 4), int(TZ or 4)
    shape, launch = remember(_plans, ("tiled", x.shape, w.shape, stride, padding, tx, ty, tz), build)
    y = output(y, shape, x)
    launch.with_mask(w, x, y)
    return y


# ---- step 2b: step 2's tile, a cube of outputs per thread -----------------------------------------

def conv3d_cube(x, w, y=None, *, stride: int = 1, padding: int = 0, TX: int | None = None,
                TY: int | None = None, TZ: int | None = None, CX: int | None = None, CY: int | None = None,
                CZ: int | None = None):
    """TX×TY×TZ threads (default 32×4×4), each CX×CY×CZ outputs (default 2×2×2)."""
    def build():
        D, H, W, KD, KH, KW, Do, Ho, Wo, five = conv3d_shapes(x, w, stride, padding)
        if KD * KH * KW > CONSTANT_FLOATS:
            raise ValueError(f"the mask has {KD * KH * KW:,} values, over the {CONSTANT_FLOATS:,} of constant memory")
        if min(t) < 1 or t[0] * t[1] * t[2] > 1024:
            raise ValueError(f"a {t[0]}x{t[1]}x{t[2]} block: 1 to 1024 threads")
        if min(c) < 1:
            raise ValueError(f"CX, CY, CZ = {c}: at least one output per thread along each axis")
        box = [t[i] * c[i] for i in range(3)]
        if tiled_shared(*box, KD, KH, KW) > SHARED_DEFAULT_MAX:
            raise ValueError(f"the input box of a {box[0]}x{box[1]}x{box[2]} output box with a {KD}x{KH}x{KW} "
                             f"halo is over 48 KB: fewer threads or outputs per thread")
        grid = (ceil_div(Wo, box[0]), ceil_div(Ho, box[1]), ceil_div(Do, box[2]))
        defines = {"TX": t[0], "TY": t[1], "TZ": t[2], "CX": c[0], "CY": c[1], "CZ": c[2], "KZ": KD, "KY": KH, "KX": KW}
        return _out_shape(Do, Ho, Wo, five), Launch(CUBE_FILE, "conv3d_cube", defines, (D, H, W), grid=grid, block=t)

    t = tuple(int(d if v is None else v) for v, d in ((TX, 32), (TY, 4), (TZ, 4)))
    c = tuple(int(2 if v is None else v) for v in (CX, CY, CZ))
    shape, launch = remember(_plans, ("cube", x.shape, w.shape, stride, padding, t, c), build)
    y = output(y, shape, x)
    launch.with_mask(w, x, y)
    return y


# ---- step 3: z coarsening, warp-wide rows, rolling window ------------------------------------------

def coarse_config(D: int, H: int, W: int, KD: int, KH: int, KW: int) -> dict:
    """Default tunables for conv3d_coarse, from the napkin math of the challenge shape (an H100/H200
    has 132 SMs; see the kernel's comment): TX=4 outputs per thread when the output rows are wider
    than 64 (a warp covers 128 columns: Wo=124 wastes 3%), else 2 or 1; TY=1; BY=8 warps for tall volumes (measured below); ZC=32 output planes per block: (KZ-1)/(ZC+KZ-1) = 11% of the planes read and the
    FMAs wasted on the neighbouring blocks' outputs, and 1 × 31 × 8 = 248 blocks of ~195 registers per thread: all resident at once
    (two 128-thread blocks per SM). MASK_REGS=1: the mask in registers, when it and the accumulators
    stay within 200 values per thread (5×5×5: 125 + 20); larger masks from constant memory."""
    Do, Ho, Wo = D - KD + 1, H - KH + 1, W - KW + 1
    TX = 4 if Wo > 64 else (2 if Wo > 32 else 1)
    regs = int(KD * KH * KW + KD * TX <= 200)      # larger masks: constant memory
    # BY=8 warps where the volume is tall enough: chapter 7's sweep on an H200 (2026-11-22) measured
    # 34.1 us with BY=8 against 40.8 us with BY=4 (TX=4, TY=1, ZC=32): more rows share each plane's halo.
    BY = 8 if Ho >= 64 else 4
    return {"TX": TX, "TY": 1, "BY": BY, "ZC": max(1, min(32, Do)), "MASK_REGS": regs}


def coarse_shared(TX: int, TY: int, BY: int, KH: int, KW: int) -> int:
    vec = 4 if TX % 4 == 0 else (2 if TX % 2 == 0 else 1)
    winv = ceil_div(TX + KW - 1, vec) * vec
    pitch = ceil_div(32 * TX + winv - TX, 4) * 4
    return 2 * (BY * TY + KH - 1) * pitch * 4


def check_coarse_tunables(TX: int, TY: int, BY: int, ZC: int, KD: int, KH: int, KW: int, MASK_REGS: int = 1):
    if TX not in (1, 2, 4, 8) or TY < 1 or BY < 1 or ZC < 1:
        raise ValueError(f"TX must be 1, 2, 4 or 8 and TY, BY, ZC positive; got TX={TX} TY={TY} BY={BY} ZC={ZC}")
    if 32 * BY > 1024:
        raise ValueError(f"BY={BY} warps: over 1024 threads per block")
    smem = coarse_shared(TX, TY, BY, KH, KW)
    if smem > SHARED_DEFAULT_MAX:
        raise ValueError(f"two plane tiles of {BY * TY + KH - 1} rows need {smem:,} bytes of shared memory, over 48 KB")
    taps = KD * KH * KW
    if not MASK_REGS and taps > CONSTANT_FLOATS:
        raise ValueError(f"the mask has {taps:,} values, over the {CONSTANT_FLOATS:,} of constant memory")
    if MASK_REGS and taps + KD * TX * TY > 200:
        raise ValueError(f"MASK_REGS=1 keeps {taps} mask values and {KD * TX * TY} accumulators per thread in "
                         "registers: over 200, use MASK_REGS=0 or fewer outputs per thread")


def conv3d_coarse(x, w, y=None, *, stride: int = 1, padding: int = 0, TX: int | None = None,
                  TY: int | None = None, BY: int | None = None, ZC: int | None = None, MASK_REGS: int | None = None):
    """Tunables left out come from coarse_config."""
    shape, regs, launch = _coarse_plan(x, w, stride, padding, TX, TY, BY, ZC, MASK_REGS, _aligned16(x),
                                       y is None or _aligned16(y))   # a new output starts an allocation
    return _run_coarse(regs, launch, x, w, output(y, shape, x))


def _run_coarse(regs, launch, x, w, y):
    if regs:
        launch(x, w, y)     # 5-D or 3-D: the kernels see the same contiguous data
    else:
        launch.with_mask(w, x, w, y)
    return y


def _coarse_plan(x, w, stride, padding, TX, TY, BY, ZC, MASK_REGS, x_aligned, y_aligned):
    """(output shape, MASK_REGS, Launch) of conv3d_coarse, worked out once per shape, tunables and alignment."""
    def build():
        D, H, W, KD, KH, KW, Do, Ho, Wo, five = conv3d_shapes(x, w, stride, padding)
        cfg = coarse_config(D, H, W, KD, KH, KW)
        tx, ty, by = int(TX or cfg["TX"]), int(TY or cfg["TY"]), int(BY or cfg["BY"])
        zc = int(ZC or cfg["ZC"])
        regs = int(cfg["MASK_REGS"] if MASK_REGS is None else MASK_REGS)
        check_coarse_tunables(tx, ty, by, zc, KD, KH, KW, regs)
        grid = (ceil_div(Wo, 32 * tx), ceil_div(Ho, by * ty), ceil_div(Do, zc))
        defines = {"TX": tx, "TY": ty, "BY": by, "ZC": zc, "MASK_REGS": regs, "KZ": KD, "KY": KH, "KX": KW,
                   "VEC_LOAD": int(W % 4 == 0 and x_aligned), "VEC_STORE": int(Wo % 4 == 0 and y_aligned)}
        return _out_shape(Do, Ho, Wo, five), regs, Launch(COARSE_FILE, "conv3d_coarse", defines, (D, H, W),
                                                          grid=grid, block=(32, by, 1))

    return remember(_plans, ("coarse", x.shape, w.shape, stride, padding, TX, TY, BY, ZC, MASK_REGS, x_aligned,
                             y_aligned), build)


# ---- the implementations and the dispatcher -------------------------------------------------------------

def _config(shape: Workload) -> dict:
    return coarse_config(shape.D, shape.H, shape.W, shape.K, shape.K, shape.K)


def _valid(shape: Workload) -> bool:
    return shape.dims == 3 and shape.B == shape.C == shape.M == 1 and shape.stride == 1 and shape.padding == 0


NAIVE = Impl("naive (one thread per output)", conv3d_naive, op="conv3d", applies=_valid,
             config=lambda s: {"BX": 32, "BY": 4, "BZ": 2}, key="conv3d_naive")
TILED = Impl("shared tile with halo, const mask", conv3d_tiled, op="conv3d",
             applies=lambda s: _valid(s) and s.K ** 3 <= CONSTANT_FLOATS, config=lambda s: {"TX": 32, "TY": 4, "TZ": 4}, key="conv3d_tiled")
CUBE = Impl("shared tile, a 2×2×2 cube per thread", conv3d_cube, op="conv3d",
            applies=lambda s: _valid(s) and s.K ** 3 <= CONSTANT_FLOATS and tiled_shared(64, 8, 8, s.K, s.K, s.K)
            <= SHARED_DEFAULT_MAX, config=lambda s: {"TX": 32, "TY": 4, "TZ": 4, "CX": 2, "CY": 2, "CZ": 2}, key="conv3d_cube")
COARSE = Impl("coarsened along z (rolling window)", conv3d_coarse, op="conv3d", applies=_valid, config=_config, key="conv3d_coarse")
#: The chapter's implementations, by the name the figures use.
IMPLEMENTATIONS = (NAIVE, TILED, CUBE, COARSE)


def pick(shape: Workload) -> Impl:
    """The kernel a single-channel 3D layer gets: always the coarsened kernel, with coarse_config's
    tunables (the others are the steps towards it)."""
    return COARSE


_best: dict = {}


def conv3d_best(x, w, y=None, *, stride: int = 1, padding: int = 0):
    """pick()'s kernel, launched: conv3d_coarse with coarse_config's tunables (its plan kept per shape
    and alignment of x: one lookup per call)."""
    if y is not None:
        return conv3d_coarse(x, w, y, stride=stride, padding=padding)
    key = (x.shape, w.shape, stride, padding, _aligned16(x))
    hit = _best.get(key)
    if hit is None:
        hit = _best[key] = _coarse_plan(x, w, stride, padding, None, None, None, None, None, key[4], True)
    shape, regs, launch = hit
    return _run_coarse(regs, launch, x, w, output(None, shape, x))
