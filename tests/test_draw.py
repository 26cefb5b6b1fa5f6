"""cl.trace and cl.draw: the recorded accesses of a block, and the pictures drawn from them, match
what the kernels do (by hand) and what the profiler counts."""
from pathlib import Path

import matplotlib
import numpy as np
import pytest

import convlab as cl
import convlab.ops.naive
import convlab.ops.tiled
from convlab.measuring.trace import request_sectors, request_wavefronts

matplotlib.use("Agg")
pytestmark = pytest.mark.emu_only
PATTERNS = Path(__file__).resolve().parent / "features" / "profile_patterns.cu"


def _window(r0, r1, c0, c1, K, pad, stride, H, W):
    """The input cells under output rows [r0, r1) and columns [c0, c1), clipped to the image."""
    want = np.zeros((H, W), dtype=bool)
    want[max(r0 * stride - pad, 0):min((r1 - 1) * stride - pad + K, H),
         max(c0 * stride - pad, 0):min((c1 - 1) * stride - pad + K, W)] = True
    return want


@pytest.mark.parametrize("block_id", [(0, 0, 0), (1, 1, 0)])
def test_naive_z_footprint_is_the_tile_and_its_halo(block_id):
    # 20x20 outputs (pad 1): block (1, 1) is a clipped 4x4 tile at the corner
    x, w = cl.randn(1, 2, 20, 20), cl.randn(3, 2, 3, 3)
    fig = cl.draw(cl.ops.naive.conv2d_naive_z, x, w, padding=1, block_id=block_id)
    d = fig.convlab_data
    bx, by, _ = block_id
    r0, r1, c0, c1 = by * 16, min(by * 16 + 16, 20), bx * 16, min(bx * 16 + 16, 20)
    assert d["buffer"] == "x" and d["output"] == "y"
    assert np.array_equal(d["read"], _window(r0, r1, c0, c1, 3, 1, 1, 20, 20))
    tile = np.zeros((20, 20), dtype=bool)
    tile[r0:r1, c0:c1] = True
    assert np.array_equal(d["written"], tile)
    # the halo: read cells outside the output tile shifted by -pad
    own = np.zeros((20, 20), dtype=bool)
    own[max(r0 - 1, 0):r1 - 1, max(c0 - 1, 0):c1 - 1] = True
    assert np.array_equal(d["halo"], d["read"] & ~own)
    # an interior cell of the block is read by all K*K = 9 outputs around it
    assert d["reads"][r0 + 2, c0 + 2] == 9


def test_tiled_footprint_is_the_input_tile():
    # TILE 8, 3 output tiles a side (18x18 outputs of a 20x20 image, K=3, no padding); block 4 is
    # the middle tile: rows and columns 8..15 of the output, 8..17 of the input
    x, w = cl.randn(1, 2, 20, 20), cl.randn(2, 2, 3, 3)
    fig = cl.draw(cl.ops.tiled.conv2d_tiled_halo_multi_pass, x, w, TILE=8, block_id=(4, 1, 0))
    d = fig.convlab_data
    assert np.array_equal(d["read"], _window(8, 16, 8, 16, 3, 0, 1, 20, 20))
    assert d["output"] == "y" and d["written"].sum() == 64 and d["written"][8:16, 8:16].all()
    # each input cell is loaded into shared memory once
    assert d["reads"].max() == 1
    assert d["halo"].sum() == 10 * 10 - 8 * 8


def test_the_figure_marks_exactly_the_recorded_cells():
    x, w = cl.randn(1, 2, 12, 12), cl.randn(2, 2, 3, 3)
    fig = cl.draw(cl.ops.naive.conv2d_naive_z, x, w, block=(8, 8), block_id=(1, 0, 1))
    d, t = fig.convlab_data, fig.convlab_trace
    a = t.of_block((1, 0, 1))
    xs = a[(a.buffer == "x") & (a.access == "read")]
    H, W = 12, 12
    plane = xs["index"] // (H * W)
    assert d["plane"] == plane.min()
    sel = xs[plane == plane.min()]
    cells = np.zeros((H, W), dtype=int)
    np.add.at(cells, ((sel["index"] // W) % H, sel["index"] % W), 1)
    assert np.array_equal(d["reads"], cells)
    ys = a[(a.buffer == "y") & (a.access == "write")]
    assert d["output_plane"] == 1            # blockIdx.z = b*M + m = 1: image 0, map 1
    assert d["written"].sum() == len(ys) == 2 * 8
    # the threads view: each thread of the block wrote its own cell, warp = thread // 32
    fig = cl.draw(cl.ops.naive.conv2d_naive_z, x, w, block=(8, 8), block_id=(1, 0, 1), what="threads")
    tv = fig.convlab_data
    on = tv["thread"] >= 0
    assert on.sum() == 16 and set(tv["outputs_per_thread"].values()) == {1}
    assert np.array_equal(tv["warp"][on], tv["thread"][on] // 32)


def test_recorded_requests_and_sectors_are_the_profilers():
    # one block only, so the launch's per-line counts are this block's
    x, w = cl.randn(1, 2, 10, 10), cl.randn(2, 2, 3, 3)
    t = cl.trace(cl.ops.naive.conv2d_naive_z, x, w, padding=1, block=(8, 6), blocks=[(0, 0, 0)])
    assert t.grid[0] * t.grid[1] * t.grid[2] == 2 * 2 * 2
    one = cl.trace(cl.ops.naive.conv2d_naive_z, x, w, padding=1, block=(8, 6),
                   blocks=[(i, j, k) for i in range(2) for j in range(2) for k in range(2)])
    a = one.accesses
    lines = cl.ProfileCard([one.profile], "emulator").lines()
    for (line, what), row in lines.iterrows():
        space, op = what.split()
        sel = a[(a.line == line) & (a.space == space) & (a.access == ("read" if op == "load" else "write"))]
        reqs = [g for _, g in sel.groupby("request")]
        assert len(reqs) == row["requests"], (line, what)
        sectors = sum(len(request_sectors(g)) for g in reqs)
        assert sectors == pytest.approx(row["sectors per request"] * row["requests"]), (line, what)
    # and the sectors view states the same numbers for one warp
    fig = cl.draw(cl.ops.naive.conv2d_naive_z, x, w, padding=1, block=(8, 6), what="sectors", warp=1)
    d = fig.convlab_data
    sel = fig.convlab_trace.accesses
    sel = sel[(sel.warp == 1) & (sel.line == d["line"]) & (sel.access == "read")]
    assert d["requests"] == sel.request.nunique() > 0
    assert d["sectors"] == sum(len(request_sectors(g)) for _, g in sel.groupby("request"))


@pytest.mark.parametrize("pad,conflicts", [(0, 31), (1, 0)])
def test_banks_view_shows_conflicts_where_the_profiler_counts_them(pad, conflicts):
    k = cl.load(PATTERNS, defines={"PAD": pad}).kernel("tile_transpose")
    args = (cl.randn(1024), cl.empty(1024))
    fig = cl.draw(k, *args, grid=1, block=(32, 8), what="banks")
    d = fig.convlab_data
    first = d["first_request"]
    assert first["conflicts"] == conflicts
    assert max(len(v) for v in first["bank_words"].values()) == conflicts + 1
    # the banks drawn red: those with several words (bank 0: column tx of tile[tx][0], tx = 0..31)
    assert first["conflict_banks"] == ([0] if pad == 0 else [])
    card = cl.profile(k, *args, grid=1, block=(32, 8))
    lines = card.lines()
    row = lines.loc[(d["line"], "shared load")]
    # 8 warps, the same pattern each: the view's warp is an eighth of the launch
    assert d["conflicts"] * 8 == row["bank conflicts"]
    assert d["wavefronts"] * 8 == row["wavefronts per request"] * row["requests"]
    # the rows written (no conflicts either way)
    fig = cl.draw(k, *args, grid=1, block=(32, 8), what="banks", line="tile[r][tx] = v")
    assert fig.convlab_data["conflicts"] == 0
    ws = fig.convlab_trace.accesses
    ws = ws[(ws.space == "shared") & (ws.warp == 0) & (ws.access == "write")]
    assert all(request_wavefronts(g) == (1, 1) for _, g in ws.groupby("request"))


def test_shared_view_knows_who_wrote_each_cell():
    k = cl.load(PATTERNS, defines={"PAD": 1}).kernel("tile_transpose")
    fig = cl.draw(k, cl.randn(1024), cl.empty(1024), grid=1, block=(32, 8), what="shared")
    d = fig.convlab_data
    assert d["writer_warp"].shape == (32, 33)
    # row r is written by threadIdx.y = r % 8, i.e. warp r % 8; the padding column never
    assert all((d["writer_warp"][r, :32] == r % 8).all() for r in range(32))
    assert not d["written"][:, 32].any() and not d["read_unwritten"].any()


MISSING_HALO = r"""
__global__ void blur3(const float* x, float* y, int n) {
    __shared__ float s[34];
    int i = blockIdx.x * 32 + threadIdx.x;
    s[threadIdx.x + 1] = x[i];          // the halo s[0] and s[33] is never loaded
    __syncthreads();
    y[i] = s[threadIdx.x] + s[threadIdx.x + 1] + s[threadIdx.x + 2];
}
"""


def test_shared_view_marks_reads_of_cells_never_written(tmp_path):
    k = cl.load_source(MISSING_HALO, name="blur3", directory=tmp_path).kernel("blur3")
    fig = cl.draw(k, cl.randn(64), cl.empty(64), 64, grid=2, block=32, block_id=(1,), what="shared")
    d = fig.convlab_data
    # 34 floats in rows of 32 words: s[0] is (0, 0), s[33] is (1, 1)
    assert d["read_unwritten"].shape == (2, 32)
    assert sorted(zip(*np.nonzero(d["read_unwritten"]))) == [(0, 0), (1, 1)]
    assert d["written"].sum() == 32 and (d["writer_warp"][d["written"]] == 0).all()


def test_a_block_outside_the_grid_is_named():
    x, w = cl.randn(1, 1, 8, 8), cl.randn(1, 1, 3, 3)
    with pytest.raises(cl.ConvlabError, match=r"block \(5, 0, 0\).*made no memory access"):
        cl.draw(cl.ops.naive.conv2d_naive_z, x, w, block_id=(5, 0, 0))


# a loop the emulator does not tag (while): a lane's k-th access goes with the other lanes' k-th
WHILE_LOOP = r"""
__global__ void copy_while(const float* x, float* y) {
    int t = threadIdx.x, k = 0;
    while (k < 3) {
        y[k * 32 + t] = x[k * 64 + 2 * t];
        ++k;
    }
}
"""


def _pattern_cases(tmp_path):
    pat, pad1 = cl.load(PATTERNS), cl.load(PATTERNS, defines={"PAD": 1})
    loop = cl.load_source(WHILE_LOOP, name="copy_while", directory=tmp_path).kernel("copy_while")
    return {
        "while loop": (loop, (cl.randn(192), cl.empty(96)), 1, 32),
        "stride 2": (pat.kernel("copy_strided"), (cl.randn(2 * 300), cl.empty(300), 300, 2), 2, 256),
        "tile, no padding": (pat.kernel("tile_transpose"), (cl.randn(2048), cl.empty(2048)), 2, (32, 8)),
        "tile, padded": (pad1.kernel("tile_transpose"), (cl.randn(2048), cl.empty(2048)), 2, (32, 8)),
        "broadcast": (pat.kernel("broadcast"), (cl.randn(64), cl.empty(128)), 2, 64),
        "float4": (pat.kernel("copy_float4"), (cl.randn(4 * 300), cl.empty(4 * 300), 300), 2, 256),
        "shared float4, stride 2": (pat.kernel("shared_float4"), (cl.randn(4 * 64), cl.empty(4 * 32), 2), 1, 32),
        "branch in a loop": (pat.kernel("branch_in_loop"), (cl.randn(256), cl.empty(32)), 1, 32),
    }


@pytest.mark.parametrize("case", ["stride 2", "tile, no padding", "tile, padded", "broadcast", "float4",
                                  "shared float4, stride 2", "branch in a loop", "while loop"])
def test_every_block_traced_the_profilers_numbers_per_line(case, tmp_path):
    # the trace of every block, grouped into requests, gives the profiler's counts line by line
    k, args, blocks, block = _pattern_cases(tmp_path)[case]
    t = cl.trace(k, *args, grid=blocks, block=block, blocks=[(b,) for b in range(blocks)])
    a = t.accesses
    for (line, what), row in cl.ProfileCard([t.profile], "emulator").lines().iterrows():
        space, op = what.split()
        sel = a[(a.line == line) & (a.space == space) & (a.access == ("read" if op == "load" else "write"))]
        reqs = [g for _, g in sel.groupby("request")]
        assert len(reqs) == row["requests"], (line, what)
        if space == "global":
            units = sum(len(request_sectors(g)) for g in reqs)
            assert units == pytest.approx(row["sectors per request"] * row["requests"]), (line, what)
        else:
            waves = [request_wavefronts(g) for g in reqs]
            assert sum(w for w, _ in waves) == pytest.approx(row["wavefronts per request"] * row["requests"])
            assert sum(w - l for w, l in waves) == row["bank conflicts"], (line, what)
