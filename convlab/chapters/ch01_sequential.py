"""Chapter 1, the sequential convolution (book/01_sequential.ipynb, kernels/01_sequential/): its
exercise's answers.

    from convlab.chapters import ch01_sequential as ch1
    ch1.check_answer("01.flops", flops, "lenet_c1")     # a number against the answer kept here
"""
from __future__ import annotations

from functools import partial

from ..measuring import workloads
from ..teach import checks

#: The exercises' answers, kept out of the exercise pages: key -> (what the verdict calls it, answer(*args)).
ANSWERS = {
    "01.flops": ("FLOPs of {0}", lambda name: workloads.get(name).flops),
    "01.bytes": ("bytes of {0}", lambda name: workloads.get(name).bytes),
}

check_answer = partial(checks.check_answer, ANSWERS)
