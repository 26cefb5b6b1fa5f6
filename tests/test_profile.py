"""Profiling: ncu's CSV parsed from real recorded output, the card's derived rows, what happens when
ncu is missing or refuses the GPU, the SASS helper on recorded cuobjdump output, and the emulator's
counters (requests, sectors, wavefronts, bank conflicts), exact on the simple patterns."""
import os
import stat
import sys
from pathlib import Path

import pytest
import torch

import convlab as cl
from convlab.display import book
from convlab.gpu._errors import ProfileUnavailable
from convlab.measuring import ncu
from convlab.measuring.cards import ATOMICS, NCU_METRICS, SHARED_ATOMICS, KernelProfile, ProfileCard
from convlab.measuring.emu_counters import count_trace
from convlab.measuring.ncu import parse_ncu_csv, refusal, run_ncu, unknown_metric
from convlab.measuring.profile import committed
from convlab.measuring.sass import SassUnavailable, compile_cubin, parse_sass

DATA = Path(__file__).resolve().parent / "data"
NCU = DATA / "ncu"

GLD_REQ, GLD_SECT = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
GST_REQ, GST_SECT = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
SLD_REQ, SLD_WAVE = "smsp__inst_executed_op_shared_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
SLD_CONFL = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
SST_REQ, SST_WAVE = "smsp__inst_executed_op_shared_st.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
SST_CONFL = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
BARRIER = "smsp__inst_executed_op_barrier.sum"


# ---------------------------------------------------------------------------------------------
# ncu's CSV, as an H200 wrote it (tests/data/ncu: `ncu --csv --page raw` and the details page)

def test_raw_page_one_kernel_per_row_with_units():
    ks = parse_ncu_csv((NCU / "ncu_tiny_raw.csv").read_text())
    assert [k.short_name for k in ks] == ["distribution_elementwise_grid_stride_kernel",
                                          "vectorized_elementwise_kernel", "vectorized_elementwise_kernel"]
    k = ks[1]
    assert k.metrics["gpu__time_duration.sum"] == 4128.0                 # ns
    assert k.metrics["launch__grid_size"] == 1024.0
    assert k.metrics[GLD_REQ] == 8192.0 and k.metrics[GLD_SECT] == 131072.0
    assert k.sectors_per_request("ld") == 16.0                            # LDG.128: 512 bytes a request
    assert ks[0].metrics["launch__grid_size"] == 1056.0                   # "1,056": separators dropped
    assert all("Domain" not in m for m in k.metrics)                      # NVTX columns are not metrics


def test_raw_page_of_a_cudnn_kernel():
    (k,) = parse_ncu_csv((NCU / "ncu_conv_raw.csv").read_text())
    assert k.short_name.startswith("sm80_xmma_fprop_implicit_gemm")
    assert k.metrics["gpu__time_duration.sum"] == 362592.0
    assert k.occupancy_limiter() == "registers (2 blocks/SM)"
    assert k.metrics["launch__registers_per_thread"] == 255.0


def test_details_page_one_metric_per_row():
    (k,) = parse_ncu_csv((NCU / "ncu_tiny_details_kernel0.csv").read_text())
    assert k.metrics["Duration"] == 6208.0                                # "usecond" or "nsecond" -> ns
    assert k.metrics["Registers Per Thread"] == 44.0
    assert k.metrics["Grid Size"] == 1056.0


def test_card_table_rows_and_values():
    card = ProfileCard(parse_ncu_csv((NCU / "ncu_tiny_raw.csv").read_text()), "H200 test")
    df = card.table()
    assert list(df.columns) == ["distribution_elementwise_grid_stride_kernel", "vectorized_elementwise_kernel",
                                "vectorized_elementwise_kernel #3"]
    metrics = df.index.get_level_values("ncu metric")
    assert "gpu__time_duration.sum" in metrics and "launch__occupancy_limit_*" in metrics
    assert card["gpu__time_duration.sum"] == pytest.approx(6.08)          # us on the card
    assert card["launch__occupancy_limit_*"] == "registers (5 blocks/SM)"
    assert card.kernel("vectorized").value("l1tex__average_t_sectors_per_request_pipe_lsu_mem_global_op_ld.ratio") == 16
    assert "registers (5 blocks/SM)" in repr(card) and "H200 test" in card._repr_html_()
    with pytest.raises(KeyError, match="no kernel named like 'conv'"):
        card.kernel("conv")


def test_top_stalls_and_atomics_sum():
    k = KernelProfile("k(float*)", {"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": 7.5,
                                    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": 1.25,
                                    "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio": 1.0,
                                    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": 2.0,
                                    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": 0.5,
                                    "smsp__inst_executed_op_global_atom.sum": 3.0,
                                    "smsp__inst_executed_op_global_red.sum": 5.0})
    assert k.top_stalls() == "long_scoreboard 7.5, wait 2, barrier 1.25"   # "selected" is no stall
    assert k.value(ATOMICS) == 8.0


def test_parser_says_what_it_got_when_there_is_no_table():
    with pytest.raises(ValueError, match="ERR_NVGPUCTRPERM"):
        parse_ncu_csv("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission\n")


def test_metric_list_has_the_issues_metrics():
    for m in ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
              "launch__occupancy_limit_registers", "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "l1tex__t_sector_hit_rate.pct", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
              "smsp__inst_executed_op_global_red.sum"):
        assert m in NCU_METRICS
    assert not any("*" in m or " " in m for m in NCU_METRICS)


# ---------------------------------------------------------------------------------------------
# ncu missing, refusing, or not knowing a metric: one clear line, then the committed result

@pytest.mark.parametrize("text, words", [
    ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters",
     "may not read the GPU's performance counters"),
    ("==ERROR== Failed to initialize the profiler: LibraryNotLoaded", "LibraryNotLoaded"),
    ("==WARNING== No kernels were profiled.", "saw no kernel"),
    ("==ERROR== something new", "ncu failed: something new"),
])
def test_refusals_in_words(text, words):
    assert words in refusal(text)


def test_a_normal_run_is_no_refusal():
    assert refusal((NCU / "ncu_tiny_raw.csv").read_text()) is None


def test_unknown_metric_is_named():
    assert unknown_metric('==ERROR== Failed to find metric regex:^smsp__inst_executed_op_barrier.sum$') == \
        "smsp__inst_executed_op_barrier.sum"
    assert unknown_metric("==PROF== Disconnected") is None


def _fake_ncu(tmp_path, script: str) -> str:
    p = tmp_path / "ncu"
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_run_ncu_without_ncu(monkeypatch):
    monkeypatch.setattr(ncu, "ncu_path", lambda: None)
    csv_text, why = run_ncu({"kind": "call"}, ["gpu__time_duration.sum"])
    assert csv_text == "" and "ncu (Nsight Compute) is not installed" in why


def test_run_ncu_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("NCU", _fake_ncu(tmp_path, 'echo "==ERROR== ERR_NVGPUCTRPERM - no permission"; exit 1\n'))
    csv_text, why = run_ncu({"kind": "call"}, ["gpu__time_duration.sum"])
    assert csv_text == "" and "ERR_NVGPUCTRPERM" in why


def test_run_ncu_drops_a_metric_it_does_not_know(tmp_path, monkeypatch):
    # the fake ncu rejects smsp__inst_executed_op_barrier.sum, then prints a recorded result
    script = (f'case "$*" in *smsp__inst_executed_op_barrier.sum*) '
              f'echo "==ERROR== Failed to find metric regex:^smsp__inst_executed_op_barrier.sum$"; exit 1;; esac\n'
              f'cat "{NCU / "ncu_tiny_raw.csv"}"\n')
    monkeypatch.setenv("NCU", _fake_ncu(tmp_path, script))
    csv_text, why = run_ncu({"kind": "call"}, ["gpu__time_duration.sum", "smsp__inst_executed_op_barrier.sum"])
    assert why == "" and len(parse_ncu_csv(csv_text)) == 3


def test_committed_result_when_profiling_is_impossible(tmp_path, monkeypatch, capsys):
    d = tmp_path / "book" / "data" / "profiles"
    d.mkdir(parents=True)
    (d / "tiny.csv").write_text("# ncu on NVIDIA H200, 2026-11-22: tiny.py\n" + (NCU / "ncu_tiny_raw.csv").read_text())
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    card = cl.profile_torch(torch.mul, torch.ones(4), 2.0, name="tiny") if cl.backend() == "emu" else committed("tiny")
    assert len(card) == 3 and card.source == "ncu on NVIDIA H200, 2026-11-22: tiny.py"
    if cl.backend() == "emu":
        out = capsys.readouterr().out.strip().splitlines()
        assert len(out) == 1 and out[0].startswith("cl.profile: no GPU here") and "committed result" in out[0]
    with pytest.raises(ProfileUnavailable, match="no committed result book/data/profiles/other.csv"):
        from convlab.measuring.profile import _fallback
        _fallback("other", "ncu is not installed here")


def test_a_stored_card_names_its_precision(tmp_path, monkeypatch):
    P = sys.modules["convlab.measuring.profile"]
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    monkeypatch.setattr(ncu, "device_name", lambda: "NVIDIA H200")
    raw = (NCU / "ncu_tiny_raw.csv").read_text()
    prec = P.call_precision((torch.ones(2, dtype=torch.float16), 2.0), {})
    P._store("tiny16", raw, "tiny.py", prec)
    card = committed("tiny16")
    assert prec == P.PRECISION_FP16 and card.precision == "fp16" and len(card) == 3
    assert "precision: fp16" in card._repr_html_() and card.source.endswith("tiny.py")
    assert P.call_precision((torch.ones(2),), {"w": torch.ones(1)}) == P.PRECISION_FP32 == "fp32 strict (TF32 off)"
    assert P.call_precision((torch.ones(2, dtype=torch.int32),), {}) == P.PRECISION_INT


def test_a_card_without_a_precision_line_says_none():
    from convlab.measuring.profile import stored_precision
    assert stored_precision("# ncu on NVIDIA H200: x\n" + (NCU / "ncu_tiny_raw.csv").read_text()) == ""
    assert stored_precision("# ncu on X: y\n# precision: fp16\n\"ID\",") == "fp16"


def test_the_worker_turns_tf32_off():
    """In a process of its own, as ncu runs the worker (in this one, a test that imported
    torch.testing may have frozen cuDNN's global flags)."""
    import subprocess
    import sys

    code = ("import torch\n"
            "from convlab.measuring._profile_worker import configure\n"
            "torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True\n"
            "configure({'cudnn_benchmark': True})\n"
            "print(torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,"
            " torch.backends.cudnn.benchmark)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "True"]


def test_every_stall_reason_has_a_meaning():
    from convlab.measuring.cards import STALL_MEANING, STALL_REASONS
    assert set(STALL_MEANING) == set(STALL_REASONS)
    assert all(len(v.split()) >= 4 for v in STALL_MEANING.values())


def test_a_lambda_cannot_be_sent_to_ncu():
    with pytest.raises(ProfileUnavailable, match="instead of a lambda"):
        ncu.job(lambda x: x, (torch.ones(2),), {})


def test_a_kernel_call_is_written_down_with_its_constants():
    mod = cl.load_source("__constant__ float c[4];\n__global__ void k(float* y) { y[threadIdx.x] = c[threadIdx.x]; }\n",
                         name="profile_job_test")
    mod.set_constant("c", torch.arange(4, dtype=torch.float32))
    job = ncu.job(mod.kernel("k"), (cl.empty(4),), {"grid": 1, "block": 4})
    assert job["kind"] == "kernel" and job["kernel"] == "k" and "__constant__ float c[4]" in job["text"]
    assert job["constants"]["c"] == torch.arange(4, dtype=torch.float32).numpy().tobytes()
    assert job["args"][0][0] == "__tensor__" and job["kwargs"] == {"grid": 1, "block": 4}


# ---------------------------------------------------------------------------------------------
# SASS (tests/data/sass: cuobjdump --dump-sass of kernels/07_conv3d/conv3d_coarse.cu on sm_90)

@pytest.fixture(scope="module")
def coarse():
    return parse_sass((DATA / "sass" / "conv3d_coarse.sass").read_text(), "recorded")


def test_sass_functions_and_counts(coarse):
    assert list(coarse.functions) == ["conv3d_coarse"]
    code = coarse.function()
    assert len(code) == 832 and code[0].opcode == "LDC" and code[0].operands == "R1, c[0x0][0x28]"
    c = coarse.counts()
    assert c["FFMA"] == 500 and c["LDG"] == 131 and c["BAR"] == 2 and c["ULDC"] == 7


def test_sass_loop_body(coarse):
    body = coarse.loop()
    assert body[-1].base == "BRA" and int(body[-1].operands.split()[0], 16) == body[0].address
    c = coarse.counts(body)
    assert c["FFMA"] == 500 and c["LDS"] == 10 and c["BAR"] == 1     # every FFMA is inside the loop
    s = coarse.summary(loop=True)
    assert s.loc["FFMA", "innermost loop"] == 500 and s.loc["LDG (global loads)", "function"] == 131
    assert "FFMA with a c[0x3][...] operand" not in s.index             # the mask is not a constant operand here


def test_sass_predicates_and_constant_operands():
    text = ("\tcode for sm_90\n\t\tFunction : k\n"
            "        /*0000*/                   FFMA R4, R2, c[0x3][0x10], R4 ;   /* 0x0 */\n"
            "        /*0010*/               @!P0 BRA 0x0 ;   /* 0x0 */\n"
            "        /*0020*/                   EXIT ;   /* 0x0 */\n")
    s = parse_sass(text)
    ffma, bra, _ = s.function("k")
    assert ffma.constant_bank and bra.predicate == "@!P0" and len(s.loop()) == 2
    assert s.summary().loc["FFMA with a c[0x3][...] operand", "function"] == 1
    with pytest.raises(SassUnavailable, match="no function 'x'"):
        s.function("x")


def test_sass_of_text_that_is_not_sass():
    with pytest.raises(SassUnavailable, match="Function : name"):
        parse_sass("cuobjdump info : File 'k.cubin' does not contain device code")


@pytest.mark.skipif(not any(Path(p, "nvcc").exists() for p in os.environ.get("PATH", "").split(os.pathsep)),
                    reason="no nvcc on this machine")
def test_compile_cubin(tmp_path):
    out = compile_cubin(book.repo_root() / "kernels" / "07_conv3d" / "conv3d_coarse.cu", tmp_path / "k.cubin")
    assert out.read_bytes()[:4] == b"\x7fELF"


# ---------------------------------------------------------------------------------------------
# The emulator's metric math on access traces (one warp of 32 lanes unless said otherwise)

def _warp(kind, addr, nbytes=4, lanes=32, thread0=0, site=None):
    return [(thread0 + t, kind, addr(t), nbytes) + ((site,) if site is not None else ()) for t in range(lanes)]


@pytest.mark.parametrize("addr, sectors", [
    (lambda t: 4096 + 4 * t, 4),          # coalesced floats: 128 bytes, 4 sectors
    (lambda t: 4096 + 4 + 4 * t, 5),      # shifted by one float: 5 sectors
    (lambda t: 4096 + 8 * t, 8),          # every second float
    (lambda t: 4096 + 128 * t, 32),       # a column of a 32-wide row-major matrix
    (lambda t: 4096, 1),                  # broadcast
])
def test_global_sectors_per_request(addr, sectors):
    r = count_trace(_warp("global_ld", addr), 32)
    assert (r[GLD_REQ], r[GLD_SECT]) == (1, sectors)


def test_global_8_and_16_byte_loads():
    assert count_trace(_warp("global_ld", lambda t: 8 * t, 8), 32)[GLD_SECT] == 8
    assert count_trace(_warp("global_st", lambda t: 16 * t, 16), 32)[GST_SECT] == 16


def test_requests_are_per_warp_and_per_execution():
    # 64 threads, each loading twice from one site: 2 warps x 2 executions = 4 requests
    ev = [(t, "global_ld", 4 * t + 1024 * k, 4) for t in range(64) for k in range(2)]
    r = count_trace(ev, 64)
    assert (r[GLD_REQ], r[GLD_SECT]) == (4, 16)


def test_partial_warp_and_two_sites():
    ev = _warp("global_ld", lambda t: 4 * t, lanes=8, site=1) + _warp("global_ld", lambda t: 4 * t + 64, lanes=8, site=2)
    r = count_trace(ev, 8)
    assert (r[GLD_REQ], r[GLD_SECT]) == (2, 2)


@pytest.mark.parametrize("words, wavefronts", [
    (lambda t: t, 1),                     # a row of a tile: 32 banks
    (lambda t: 32 * t, 32),               # a column of tile[32][32]: one bank
    (lambda t: 33 * t, 1),                # a column of tile[32][33]: padded, 32 banks
    (lambda t: 2 * t, 2),                 # stride 2: two words per bank
    (lambda t: 0, 1),                     # broadcast: one word
    (lambda t: t % 4, 1),                 # 4 words, 8 lanes each: broadcasts
])
def test_shared_bank_conflicts(words, wavefronts):
    r = count_trace(_warp("shared_ld", lambda t: 4 * words(t)), 32)
    assert (r[SLD_REQ], r[SLD_WAVE], r[SLD_CONFL]) == (1, wavefronts, wavefronts - 1)


def test_shared_wide_accesses_need_no_conflict_to_take_more_wavefronts():
    r = count_trace(_warp("shared_st", lambda t: 8 * t, 8), 32)                 # 256 bytes: 2 wavefronts
    assert (r[SST_REQ], r[SST_WAVE], r[SST_CONFL]) == (1, 2, 0)
    r = count_trace(_warp("shared_ld", lambda t: 16 * t, 16), 32)               # LDS.128: 4
    assert (r[SLD_WAVE], r[SLD_CONFL]) == (4, 0)


@pytest.mark.parametrize("nbytes, addr, wavefronts, conflicts", [
    (16, lambda t: 16 * (t % 8), 4, 0),       # each quarter-warp reads the same 128 bytes: 4 phases, not merged
    (16, lambda t: 128 * t, 32, 28),          # all on banks 0-3: 8 words a bank in each of 4 phases
    (16, lambda t: 0, 2, 0),                  # a broadcast: lane pairs share their data, 2 phases
    (16, lambda t: 16 * (t // 2), 2, 0),      # lanes 2k and 2k+1 share an address: 2 phases of 16 lanes
    (8, lambda t: 8 * (t % 16), 2, 0),        # each half-warp the same 128 bytes
    (8, lambda t: 0, 1, 0),                   # a 64-bit broadcast: one phase
])
def test_shared_wide_accesses_go_in_phases(nbytes, addr, wavefronts, conflicts):
    r = count_trace(_warp("shared_ld", addr, nbytes), 32)
    assert (r[SLD_REQ], r[SLD_WAVE], r[SLD_CONFL]) == (1, wavefronts, conflicts)


def test_a_loop_iteration_is_one_request():
    """Lanes 0-3 skip a shared load in their first 4 - t iterations (loop tag k): each iteration's
    loads are one request of one row, not the lanes' first, second, ... loads side by side."""
    ev = [(t, "shared_ld", 4 * (33 * k + t), 4, 1, 100 + k) for t in range(32) for k in range(4) if t + k >= 4]
    r = count_trace(ev, 32)
    assert (r[SLD_REQ], r[SLD_WAVE], r[SLD_CONFL]) == (4, 4, 0)
    untagged = [e[:5] for e in ev]      # the same accesses by count: lanes 1-4's first loads share bank 4
    assert count_trace(untagged, 32)[SLD_CONFL] > 0


def test_barriers_split_executions_and_count_per_warp():
    # lane 0 loads twice before the barrier, the others once: the barrier keeps the next load apart
    ev = _warp("shared_ld", lambda t: 4 * t) + [(0, "shared_ld", 512, 4)] + ["barrier"] + _warp("shared_ld", lambda t: 4 * t)
    r = count_trace(ev, 64)
    assert r[SLD_REQ] == 3 and r[BARRIER] == 2


def test_atomics_are_counted_per_warp():
    r = count_trace(_warp("global_atom", lambda t: 0), 32)
    assert r[ATOMICS] == 1 and r[GLD_REQ] == 0


def test_unknown_kind():
    with pytest.raises(ValueError, match="use one of global_ld"):
        count_trace([(0, "texture", 0, 4)], 1)


# ---------------------------------------------------------------------------------------------
# The patterns of tests/features/profile_patterns.cu on the emulator, counted by hand. n = 1000
# threads in blocks of 256: 31 full warps and one of 8 lanes (992..999).

G_ATOM, S_ATOM = ATOMICS, SHARED_ATOMICS
PATTERNS = Path(__file__).resolve().parent / "features" / "profile_patterns.cu"
N = 1000


def _launch_cases():
    pat = cl.load(PATTERNS)
    v = cl.to_device(torch.randint(0, 1000, (N,), dtype=torch.int32))
    return {
        # 31 warps x 4 sectors + 8 floats (one sector)
        "coalesced": ((pat.kernel("copy_coalesced"), cl.randn(N), cl.empty(N), N), {"grid": 4, "block": 256},
                      {GLD_REQ: 32, GLD_SECT: 125, GST_REQ: 32, GST_SECT: 125}),
        # a warp's 32 loads span 256 bytes: 8 sectors; the last warp's 8 loads 64 bytes: 2
        "stride 2": ((pat.kernel("copy_strided"), cl.randn(2 * N), cl.empty(N), N, 2), {"grid": 4, "block": 256},
                     {GLD_REQ: 32, GLD_SECT: 31 * 8 + 2, GST_REQ: 32, GST_SECT: 125}),
        # every lane its own sector
        "stride 32": ((pat.kernel("copy_strided"), cl.randn(32 * N), cl.empty(N), N, 32), {"grid": 4, "block": 256},
                      {GLD_REQ: 32, GLD_SECT: 31 * 32 + 8, GST_REQ: 32, GST_SECT: 125}),
        # 3 blocks x 8 warps x 4 rows: 96 requests each way; a column of tile[32][32] is one bank
        "tile, no padding": ((pat.kernel("tile_transpose"), cl.randn(3 * 1024), cl.empty(3 * 1024)),
                             {"grid": 3, "block": (32, 8)},
                             {GLD_REQ: 96, GLD_SECT: 384, GST_REQ: 96, GST_SECT: 384, SST_REQ: 96, SST_WAVE: 96,
                              SST_CONFL: 0, SLD_REQ: 96, SLD_WAVE: 96 * 32, SLD_CONFL: 96 * 31, BARRIER: 24}),
        "tile, padded": ((cl.load(PATTERNS, defines={"PAD": 1}).kernel("tile_transpose"), cl.randn(3 * 1024),
                          cl.empty(3 * 1024)), {"grid": 3, "block": (32, 8)},
                         {GLD_REQ: 96, GLD_SECT: 384, GST_REQ: 96, GST_SECT: 384, SST_REQ: 96, SST_WAVE: 96,
                          SST_CONFL: 0, SLD_REQ: 96, SLD_WAVE: 96, SLD_CONFL: 0, BARRIER: 24}),
        # per block: warp 0 loads x[0..31] (4 sectors) and stores s; both warps read x[blockIdx.x] and
        # s[5] (broadcasts: 1 sector, 1 wavefront) and store 32 floats
        "broadcast": ((pat.kernel("broadcast"), cl.randn(64), cl.empty(128)), {"grid": 2, "block": 64},
                      {GLD_REQ: 6, GLD_SECT: 12, GST_REQ: 4, GST_SECT: 16, SLD_REQ: 4, SLD_WAVE: 4, SLD_CONFL: 0,
                       SST_REQ: 2, SST_WAVE: 2, BARRIER: 4}),
        # per block: warp 0 zeroes s[0..7] (one wavefront), every warp with a thread below n adds to s,
        # warp 0 reads s and adds it to bins; two barriers for each of the 32 warps
        "histogram": ((pat.kernel("histogram"), v, cl.zeros(8, dtype=torch.int32), N), {"grid": 4, "block": 256},
                      {GLD_REQ: 32, GLD_SECT: 125, S_ATOM: 32, G_ATOM: 4, SST_REQ: 4, SST_WAVE: 4, SLD_REQ: 4,
                       SLD_WAVE: 4, BARRIER: 64}),
        # as "coalesced", from float 3 on: a warp's 128 bytes straddle 5 sectors (the last warp's 8
        # floats, 1003..1010, 2)
        "local pointer": ((pat.kernel("copy_local_pointer"), cl.randn(N + 3), cl.empty(N + 3), N, 3),
                          {"grid": 4, "block": 256}, {GLD_REQ: 32, GLD_SECT: 31 * 5 + 2, GST_REQ: 32, GST_SECT: 31 * 5 + 2}),
        # 64 bytes a warp, 2 sectors; the last warp's 16 bytes 1
        "half": ((pat.kernel("copy_half"), cl.randn(N, dtype=torch.float16), cl.empty(N, dtype=torch.float16), N),
                 {"grid": 4, "block": 256}, {GLD_REQ: 32, GLD_SECT: 31 * 2 + 1, GST_REQ: 32, GST_SECT: 31 * 2 + 1}),
        # 4 bytes a lane, as floats
        "half2": ((pat.kernel("copy_half2"), cl.randn(2 * N, dtype=torch.float16), cl.empty(2 * N, dtype=torch.float16),
                   N), {"grid": 4, "block": 256}, {GLD_REQ: 32, GLD_SECT: 125, GST_REQ: 32, GST_SECT: 125}),
        # 512 bytes a warp, 16 sectors; the last warp's 128 bytes 4
        "float4": ((pat.kernel("copy_float4"), cl.randn(4 * N), cl.empty(4 * N), N), {"grid": 4, "block": 256},
                   {GLD_REQ: 32, GLD_SECT: 31 * 16 + 4, GST_REQ: 32, GST_SECT: 31 * 16 + 4}),
        "shared float4": ((pat.kernel("shared_float4"), cl.randn(4 * 64), cl.empty(4 * 32), 1), {"grid": 1, "block": 32},
                          {GLD_REQ: 2, GLD_SECT: 32, SST_REQ: 2, SST_WAVE: 8, SST_CONFL: 0, SLD_REQ: 1, SLD_WAVE: 4,
                           SLD_CONFL: 0, GST_REQ: 1, GST_SECT: 16, BARRIER: 1}),
        "shared float4, stride 2": ((pat.kernel("shared_float4"), cl.randn(4 * 64), cl.empty(4 * 32), 2),
                                    {"grid": 1, "block": 32},
                                    {GLD_REQ: 2, GLD_SECT: 32, SST_REQ: 2, SST_WAVE: 8, SST_CONFL: 0, SLD_REQ: 1,
                                     SLD_WAVE: 8, SLD_CONFL: 4, GST_REQ: 1, GST_SECT: 16, BARRIER: 1}),
        "shared float4, broadcast": ((pat.kernel("shared_float4"), cl.randn(4 * 64), cl.empty(4 * 32), 0),
                                     {"grid": 1, "block": 32},
                                     {GLD_REQ: 2, GLD_SECT: 32, SST_REQ: 2, SST_WAVE: 8, SST_CONFL: 0, SLD_REQ: 1,
                                      SLD_WAVE: 2, SLD_CONFL: 0, GST_REQ: 1, GST_SECT: 16, BARRIER: 1}),
        # 4 + 4 global loads (4 sectors, then 1), 4 shared stores and loads of a row each
        "branch in a loop": ((pat.kernel("branch_in_loop"), cl.randn(256), cl.empty(32)), {"grid": 1, "block": 32},
                             {GLD_REQ: 8, GLD_SECT: 20, SST_REQ: 4, SST_WAVE: 4, SST_CONFL: 0, SLD_REQ: 4, SLD_WAVE: 4,
                              SLD_CONFL: 0, GST_REQ: 1, GST_SECT: 4, BARRIER: 1}),
    }


PATTERN_CASES = ["coalesced", "stride 2", "stride 32", "tile, no padding", "tile, padded", "broadcast", "histogram",
                 "local pointer", "half", "half2", "float4", "shared float4", "shared float4, stride 2",
                 "shared float4, broadcast", "branch in a loop"]


@pytest.mark.emu_only
@pytest.mark.parametrize("case", PATTERN_CASES)
def test_emulator_counts_the_patterns_exactly(case):
    (fn, *args), launch, want = _launch_cases()[case]
    card = cl.profile(fn, *args, **launch)
    (k,) = card.kernels
    got = {m: k.metrics[m] for m in want}
    assert got == {m: float(v) for m, v in want.items()}
    # and nothing else happened
    rest = {m: v for m, v in k.metrics.items() if m not in want and not m.startswith("launch__") and v}
    assert rest == {}


@pytest.mark.emu_only
def test_emulator_profile_of_a_launcher_lists_every_kernel():
    from convlab.ops import im2col
    x, w = cl.randn(1, 2, 9, 11), cl.randn(3, 2, 3, 3)
    card = cl.profile(im2col.conv2d_im2col_gemm, x, w)
    assert len(card) >= 2 and all(k.metrics[GLD_REQ] > 0 for k in card.kernels)
    assert card.table().shape[1] == len(card)


@pytest.mark.emu_only
def test_profiled_launch_still_computes():
    pat = cl.load(PATTERNS)
    x, y = cl.randn(N), cl.empty(N)
    cl.profile(pat.kernel("copy_coalesced"), x, y, N, grid=4, block=256)
    assert torch.equal(x, y)


@pytest.mark.emu_only
def test_emulator_card_beside_the_committed_ncu_card(tmp_path, monkeypatch):
    d = tmp_path / "book" / "data" / "profiles"
    d.mkdir(parents=True)
    (d / "tiny.csv").write_text((NCU / "ncu_tiny_raw.csv").read_text())
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    pat = cl.load(PATTERNS)
    card = cl.profile(pat.kernel("copy_coalesced"), cl.randn(N), cl.empty(N), N, grid=4, block=256, name="tiny")
    cols = list(card.table().columns)
    assert cols[0] == "copy_coalesced" and cols[1] == "distribution_elementwise_grid_stride_kernel (ncu)"


# nvcc turns a one-line `if (t < K) s[t] = v;` into a predicated store (`@!P0 STS`) that every warp
# of the block issues, with all its lanes off in the warps past K. ncu's instruction count includes
# those issues (they make no wavefront); the emulator runs the `if` and counts the warps that store.
# Per case: the function and how many warps issue its STS on the GPU (blocks x warps per block).
PREDICATED_STS = {"broadcast": ("broadcast", 2 * 2), "histogram": ("histogram", 4 * 8)}


def _ncu_expects(case, want):
    """The emulator's counts, with the shared stores that a predicated STS adds on the GPU."""
    if case not in PREDICATED_STS:
        return want
    function, issues = PREDICATED_STS[case]
    major, minor = torch.cuda.get_device_capability()
    try:
        sts = [i for i in cl.sass(PATTERNS, arch=f"sm_{major}{minor}").function(function) if i.base == "STS"]
    except SassUnavailable as e:
        pytest.skip(f"cannot read the SASS to tell a predicated store from a branch: {e}")
    if sts and all(i.predicate for i in sts):
        return {**want, SST_REQ: issues}
    return want                 # this nvcc branched around the store: only the storing warps issue it


@pytest.mark.gpu_only
@pytest.mark.parametrize("case", PATTERN_CASES)
def test_ncu_counts_the_patterns_as_the_emulator_does(case):
    (fn, *args), launch, want = _launch_cases()[case]
    try:
        card = cl.profile(fn, *args, **launch)
    except ProfileUnavailable as e:
        pytest.skip(str(e))
    want = _ncu_expects(case, want)
    (k,) = card.kernels
    got = {m: k.value(m) for m in want}
    if got.get(BARRIER, 0) is None:        # ncu versions that have no barrier counter under this name
        del got[BARRIER], want[BARRIER]
    assert got == {m: float(v) for m, v in want.items()}


def test_the_worker_repeats_a_kernel_call_with_its_constants():
    """What the ncu subprocess runs, replayed here: the kernel recompiled from its source, the
    __constant__ values set again, the arguments back on their device."""
    from convlab.measuring._profile_worker import prepare
    mod = cl.load_source("__constant__ float c[4];\n__global__ void k(float* y) { y[threadIdx.x] = 2.0f * c[threadIdx.x]; }\n",
                         name="profile_worker_test")
    c = cl.randn(4)
    mod.set_constant("c", c)
    job = ncu.job(mod.kernel("k"), (cl.empty(4),), {"grid": 1, "block": 4})
    fn, args, kwargs = prepare(job)
    fn(*args, **kwargs)
    cl.sync()
    assert args[0].device == c.device and torch.equal(args[0], 2 * c)


def test_the_worker_repeats_a_launcher_call():
    from convlab.measuring._profile_worker import prepare
    from convlab.ops import naive
    x, w = cl.randn(1, 2, 7, 9), cl.randn(3, 2, 3, 3)
    fn, args, kwargs = prepare(ncu.job(naive.conv2d_naive_flat, (x, w), {}))
    cl.check(fn(*args, **kwargs), cl.ref.conv2d(x, w))


@pytest.mark.emu_only
def test_emulator_counts_per_source_line():
    text = PATTERNS.read_text().splitlines()
    line = {s: next(i + 1 for i, t in enumerate(text) if s in t)
            for s in ("x[base + r * 32 + tx]", "tile[r][tx] = v", "tile[tx][r];", "y[base + r * 32 + tx]")}
    k = cl.profile(cl.load(PATTERNS).kernel("tile_transpose"), cl.randn(3 * 1024), cl.empty(3 * 1024),
                   grid=3, block=(32, 8))
    df = k.lines()
    rows = {(src.rsplit(":", 1)[1], what): r for (src, what), r in df.iterrows()}
    assert set(rows) == {(str(line["x[base + r * 32 + tx]"]), "global load"),
                         (str(line["tile[r][tx] = v"]), "shared store"),
                         (str(line["tile[tx][r];"]), "shared load"),
                         (str(line["y[base + r * 32 + tx]"]), "global store")}
    shared_load = rows[(str(line["tile[tx][r];"]), "shared load")]
    assert shared_load["requests"] == 96 and shared_load["wavefronts per request"] == 32
    assert shared_load["bank conflicts"] == 96 * 31
    assert rows[(str(line["x[base + r * 32 + tx]"]), "global load")]["sectors per request"] == 4


def test_ncu_cards_have_no_source_lines():
    card = ProfileCard(parse_ncu_csv((NCU / "ncu_conv_raw.csv").read_text()), "test")
    with pytest.raises(ProfileUnavailable, match="Source page"):
        card.lines()


def test_run_ncu_when_the_repeated_call_fails(tmp_path, monkeypatch):
    script = ('echo "==PROF== Connected to process 1"; echo "Traceback (most recent call last):" >&2; '
              'echo "ValueError: w does not fit x" >&2; exit 1\n')
    monkeypatch.setenv("NCU", _fake_ncu(tmp_path, script))
    csv_text, why = run_ncu({"kind": "call"}, ["gpu__time_duration.sum"])
    assert csv_text == "" and why == "the call failed when it was repeated under ncu (ValueError: w does not fit x)"


def test_sass_falls_back_to_the_committed_disassembly(tmp_path, monkeypatch, capsys):
    d = tmp_path / "book" / "data" / "sass"
    d.mkdir(parents=True)
    (d / "coarse.sass").write_text((DATA / "sass" / "conv3d_coarse.sass").read_text())
    monkeypatch.setenv("CONVLAB_ROOT", str(tmp_path))
    monkeypatch.setattr(sys.modules["convlab.measuring.sass"], "_tool", lambda name: None)   # no nvcc, no cuobjdump
    s = cl.sass(book.repo_root() / "kernels" / "07_conv3d" / "conv3d_coarse.cu", name="coarse")
    assert s.counts()["FFMA"] == 500
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "is not installed here" in out[0] and "committed SASS" in out[0]
    with pytest.raises(SassUnavailable, match="no committed book/data/sass/other.sass"):
        cl.sass(book.repo_root() / "kernels" / "07_conv3d" / "conv3d_coarse.cu", name="other")


# ---- __constant__ reads: requests and the distinct addresses each reads -----------------------

@pytest.mark.parametrize("addr, addresses", [
    (lambda t: 4096, 1),                  # every lane the same tap: a broadcast
    (lambda t: 4096 + 4 * (t % 4), 4),    # four taps across the warp: served in four turns
    (lambda t: 4096 + 4 * t, 32),         # a tap per lane
])
def test_constant_addresses_per_request(addr, addresses):
    from convlab.measuring.cards import EMU_CONSTANT_ADDRESSES, EMU_CONSTANT_REQUESTS

    r = count_trace(_warp("constant_ld", addr), 32)
    assert (r[EMU_CONSTANT_REQUESTS], r[EMU_CONSTANT_ADDRESSES]) == (1, addresses)
    assert r[GLD_REQ] == 0


@pytest.mark.emu_only
def test_constant_reads_of_a_kernel_are_counted_and_its_other_counters_unchanged():
    from convlab.measuring.cards import EMU_CONSTANT_ADDRESSES, EMU_CONSTANT_REQUESTS

    mod = cl.load_source("""
__constant__ float c[8];
__global__ void k(const float* x, float* y, int spread) {
    const int i = threadIdx.x;
    y[i] = x[i] * c[spread ? i % 4 : 2];
}""", name="constant_reads")
    mod.set_constant("c", torch.arange(8, dtype=torch.float32))
    x, y = cl.randn(64), cl.empty(64)
    for spread, addresses in ((0, 1), (1, 4)):
        card = cl.profile(lambda: mod.kernel("k")(x, y, spread, grid=1, block=64))
        m = card.kernels[0].metrics
        assert (m[EMU_CONSTANT_REQUESTS], m[EMU_CONSTANT_ADDRESSES]) == (2, 2 * addresses)
        assert (m[GLD_REQ], m[GLD_SECT]) == (2, 8)        # x alone: the constant reads are no global loads
        want = x.cpu() * (torch.arange(64) % 4 if spread else torch.full((64,), 2)).float()
        assert torch.equal(y.cpu(), want)
        assert "constant" not in " ".join(card.lines().reset_index()["access"])
