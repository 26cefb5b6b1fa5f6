"""convlab.display.evidence: the chapters' profile cards and SASS, measured on a GPU and committed, shown
from the committed files elsewhere; and the mask's code generation read from SASS."""
import importlib
from pathlib import Path

from convlab.display import evidence
from convlab.measuring.sass import parse_sass

P = importlib.import_module("convlab.measuring.profile")

SASS = """
        Function : _Z4convPKfPf
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   ULDC.64 UR4, c[0x3][0x0] ;
        /*0020*/                   LDC R6, c[0x3][0x8] ;
        /*0030*/                   FFMA R2, R0, UR4, RZ ;
        /*0040*/                   FFMA R2, R3, UR5, R2 ;
        /*0050*/                   FFMA R2, R4, R6, R2 ;
        /*0060*/                   FFMA R2, R5, c[0x3][0xc], R2 ;
        /*0070*/                   EXIT ;
"""


def test_mask_reads_counts_each_way_the_constant_bank_reaches_an_ffma():
    code = parse_sass(SASS).function()
    counts = evidence.mask_reads(code)
    assert counts == {"FFMA": 4, "FFMA with a c[0x3] operand": 1, "ULDC from c[0x3]": 1, "LDC from c[0x3]": 1}
    text = evidence.describe_mask_reads(counts)
    assert text.startswith("1 of its 4 FFMAs read the mask from the constant bank directly")
    assert "1 ULDC (into uniform registers)" in text and "1 LDC (into registers)" in text


def test_describe_mask_reads_all_or_none_direct():
    assert evidence.describe_mask_reads({"FFMA": 8, "FFMA with a c[0x3] operand": 8, "ULDC from c[0x3]": 0,
                                         "LDC from c[0x3]": 0}).startswith("every one of its 8 FFMAs")
    text = evidence.describe_mask_reads({"FFMA": 500, "FFMA with a c[0x3] operand": 0, "ULDC from c[0x3]": 45,
                                         "LDC from c[0x3]": 0})
    assert text == ("none of its 500 FFMAs read the mask from the constant bank directly; "
                    "45 ULDC (into uniform registers) load the mask values first")
    assert evidence.describe_mask_reads(None) is None


def test_without_a_gpu_the_committed_card_or_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "_profiles_dir", lambda: tmp_path)
    monkeypatch.setattr(evidence, "_on_gpu", lambda: False)
    assert evidence.card("ch0_none", print) is None
    assert "no committed profile" in capsys.readouterr().out
    assert evidence.value(None, "k", "launch__registers_per_thread") is None
    sample = Path(__file__).parent / "data" / "ncu" / "ncu_conv_raw.csv"
    (tmp_path / "ch0_k.csv").write_text("# ncu on a GPU, a day: k\n" + sample.read_text())
    card = evidence.card("ch0_k", print)
    assert card is not None and card.source == "ncu on a GPU, a day: k"
    longest = evidence.kernel(card)
    assert longest.value("gpu__time_duration.sum") == max(k.value("gpu__time_duration.sum") for k in card.kernels)
    assert evidence.value(card, "no such kernel", "gpu__time_duration.sum") is None


def test_committed_sass_is_compact_and_reads_the_same():
    from convlab.measuring.sass import compact
    text = (Path(__file__).parent / "data" / "sass" / "conv3d_coarse.sass").read_text()
    small = compact(text)
    assert "/* 0x" not in small and len(small) < len(text)
    full, kept = parse_sass(text), parse_sass(small)
    assert {k: [str(i) for i in v] for k, v in full.functions.items()} == \
           {k: [str(i) for i in v] for k, v in kept.functions.items()}


def test_on_a_gpu_without_ncu_and_nothing_committed_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(P, "_profiles_dir", lambda: tmp_path)
    from convlab.gpu import runtime
    monkeypatch.setattr(runtime, "backend", lambda: "cuda")     # as on a GPU machine
    monkeypatch.setattr(P.ncu, "run_ncu", lambda job, metrics, **kw: ("", "ncu is not installed here"))
    monkeypatch.setattr(P.ncu, "job", lambda fn, args, kwargs: {})
    assert evidence.card("ch0_none", print) is None
    assert "ncu is not installed here" in capsys.readouterr().out
