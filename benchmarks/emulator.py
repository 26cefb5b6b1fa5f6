"""How fast is the CPU emulator? Prints the figures the course promises students on a 2-core
machine: one launch of a teaching-size tiled conv2d (B=4, C=3, M=8, 64x64, K=5, 16x16 tiles with
halo and __syncthreads), the same launch without a barrier, an exercise-size check (the six
awkward shapes of convlab.teach.checks through chapter 3's tiled kernel) with and without the race
detector, a cached module load and a cold compile. Emulator times say nothing about a GPU.

    python benchmarks/emulator.py
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["CONVLAB_BACKEND"] = "emu"
os.environ["CONVLAB_CACHE"] = tempfile.mkdtemp(prefix="convlab-bench-")   # so the first load is cold
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import convlab as cl  # noqa: E402
import convlab.teach.checks as ex  # noqa: E402
import convlab.teach.verdict as vd  # noqa: E402
from convlab.ops import tiled  # noqa: E402

KERNEL = Path(__file__).with_name("emulator_tiled.cu")
B, C, M, H, W, K, TILE = 4, 3, 8, 64, 64, 5, 16


def median_ms(fn, reps=7):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def exercise_check(detect: bool):
    """What ex.check_kernel does for a tiled kernel: fresh inputs, one launch and a verdict per
    awkward shape (3,000 to 12,000 CUDA threads each), with the race detector on or off."""
    for shape in ex.AWKWARD_SHAPES:
        x, w = cl.randn(shape.B, shape.C, shape.H, shape.W), cl.randn(shape.M, shape.C, shape.K, shape.K)
        y = cl.empty(shape.B, shape.M, shape.Ho, shape.Wo)
        with cl.detect_races(detect):
            tiled.conv2d_tiled_input_block(x, w, y, stride=shape.stride, padding=shape.padding, IN_TILE=16)
        ok, text = vd.verdict(y, cl.ref.conv2d(x, w, stride=shape.stride, padding=shape.padding))
        assert ok, text


def main():
    print(cl.device())
    t0 = time.perf_counter()
    cl.emu.runtime_library()
    runtime_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    mod = cl.load(KERNEL, defines={"TILE": TILE})
    cold_ms = (time.perf_counter() - t0) * 1e3
    cl.runtime.clear_module_cache()                       # forget the in-memory module, keep the disk cache
    cached = []
    for _ in range(5):
        cl.runtime.clear_module_cache()
        t0 = time.perf_counter()
        mod = cl.load(KERNEL, defines={"TILE": TILE})
        cached.append((time.perf_counter() - t0) * 1e3)

    Ho, Wo = H - K + 1, W - K + 1
    x, w = cl.randn(B, C, H, W), cl.randn(M, C, K, K)
    y = cl.empty(B, M, Ho, Wo)
    grid = ((Wo + TILE - 1) // TILE, (Ho + TILE - 1) // TILE, B * M)
    tiled = lambda: mod.conv2d_tiled(x, w, y, C, M, H, W, K, grid=grid, block=(TILE, TILE))  # noqa: E731
    direct = lambda: mod.conv2d_direct(x, w, y, C, M, H, W, K, grid=grid, block=(TILE, TILE))  # noqa: E731
    tiled()
    cl.check(y, cl.ref.conv2d(x, w))
    y.fill_(float("nan"))
    direct()
    cl.check(y, cl.ref.conv2d(x, w))
    t_med, t_min, t_max = median_ms(tiled)
    d_med, d_min, d_max = median_ms(direct)
    threads = B * M * grid[0] * grid[1] * TILE * TILE
    print(f"workload: B={B} C={C} M={M} {H}x{W} K={K}, {TILE}x{TILE} tiles, {grid[0] * grid[1] * grid[2]} blocks, "
          f"{threads:,} CUDA threads")
    print(f"{'tiled launch (2 barriers per channel)':44s} {t_med:7.1f} ms  (min {t_min:.1f}, max {t_max:.1f})")
    print(f"{'same launch, no barrier (plain loop)':44s} {d_med:7.1f} ms  (min {d_min:.1f}, max {d_max:.1f})")
    c_med, c_min, c_max = median_ms(lambda: exercise_check(detect=True), reps=5)
    n_med, n_min, n_max = median_ms(lambda: exercise_check(detect=False), reps=5)
    print(f"{'exercise-size check, race detector on':44s} {c_med:7.1f} ms  (min {c_min:.1f}, max {c_max:.1f})")
    print(f"{'exercise-size check, race detector off':44s} {n_med:7.1f} ms  (min {n_min:.1f}, max {n_max:.1f})")
    print(f"{'cached module load':44s} {statistics.median(cached):7.1f} ms")
    print(f"{'cold compile (g++, kernel file)':44s} {cold_ms:7.1f} ms")
    print(f"{'cold compile (runtime, once per machine)':44s} {runtime_ms:7.1f} ms")
    print(f"per CUDA thread: tiled {t_med * 1e6 / threads:.0f} ns, direct {d_med * 1e6 / threads:.0f} ns")


if __name__ == "__main__":
    main()
