"""Chapter 12's computations behind its glued numbers and figures (convlab/chapters/ch12_tf32.py):
the split drawn bit by bit, and the error of each way of adding a sum, on the emulator."""
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from convlab.chapters import ch12_tf32 as ch12


def test_bits_are_the_float32_encoding():
    assert ch12.bits(1.0) == 0x3F800000 and ch12.bits(-2.0) == 0xC0000000 and ch12.bits(0.0) == 0


def test_the_split_of_a_third_keeps_19_bits_twice():
    fig = ch12.bit_figure()
    plt.close(fig)
    d = fig.convlab_data
    x, hi, lo = d["x"], d["hi"], d["lo"]
    assert ch12.bits(hi) & 0x1FFF == 0 and ch12.bits(lo) & 0x1FFF == 0    # both TF32: low 13 bits zero
    assert abs(x - hi) <= 2.0 ** -11 * abs(x)                            # hi: x to 10 mantissa bits
    assert d["rest"] == pytest.approx(x - hi - lo, abs=0) and abs(d["rest"]) < 2.0 ** -21 * abs(x)
    assert d["shift"] == math.frexp(hi)[1] - math.frexp(lo)[1] >= 11


def test_the_error_sweep_orders_the_ways_of_adding():
    """Small sums: TF32's error is about its derived 2^-11 sqrt(2/3), fp32's and 3xTF32's far below it."""
    fig = ch12.error_sweep(ks=(64, 256))
    plt.close(fig)
    d = fig.convlab_data
    assert d["n"] == [64, 256] and set(d["errors"]) == set(ch12.SWEEP_WAYS)
    tf32, fp32, split = (np.array(d["errors"][k]) for k in ("TF32", "fp32 (CUDA cores)", "3xTF32"))
    assert np.all((tf32 > 0.3 * 2.0 ** -11 * math.sqrt(2 / 3)) & (tf32 < 3 * 2.0 ** -11 * math.sqrt(2 / 3)))
    assert np.all(fp32 < tf32 / 100) and np.all(split < tf32 / 100)
