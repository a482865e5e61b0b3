"""Kernels that differ only in their sizes, one kernel: run by Triton's interpreter
against eager (``test_size_args_dedupe.py`` runs this file in a child pytest with
TRITON_INTERPRET=1 set before triton is imported)."""
import os

import pytest
import torch

from kiln.kernels.codegen.triton import launcher
from kiln.kernels.compile import build

from .size_dedupe_cases import FIVE, graph, inputs, sum_graph, sum_inputs

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_size_args_dedupe.py)")


def _run(numels, seed=0):
    gm = graph(numels)
    args = inputs(numels, seed)
    rt, art = build(gm, [a.clone() for a in args], "triton")
    got = rt(*[a.clone() for a in args])
    expect = gm(*[a.clone() for a in args])
    assert len(got) == len(expect)
    for g, e in zip(got, expect):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    return rt, art


def test_dedupe_one_update_kernel_runs_every_size():
    """Five parameter sizes, one update kernel launched five times, each launch with
    its own sizes (a launch reading another's would leave elements unwritten or write
    past its tensor's end): every output equals eager's."""
    rt, art = _run(FIVE)
    assert len(art["kinfo"]) == 2, [k[0] for k in art["kinfo"]]


def test_dedupe_new_sizes_reuse_the_module():
    """Other sizes of the same classes: the same module text (no load), new values in
    the device array only; the results follow the new sizes."""
    keep = [_run(FIVE)]
    before = launcher.stats["loaded"]
    keep.append(_run([k + 16 for k in FIVE], seed=1))
    keep.append(_run(list(reversed(FIVE)), seed=2))
    assert launcher.stats["loaded"] == before


def test_dedupe_classes_stay_apart():
    """A size that is no multiple of 16 (or equal to another inside a kernel) is
    another class: its own kernel, still run with its own values."""
    rt, art = _run([528, 530, 640, 531])
    assert len(art["kinfo"]) == 3, [k[0] for k in art["kinfo"]]


def test_dedupe_reductions_with_named_accumulators():
    """Two column sums of different sizes, one kernel (its accumulators renamed with
    its parameters in the dedupe key), each launch summing its own columns."""
    gm, args = sum_graph(), sum_inputs()
    rt, art = build(gm, args, "triton")
    for g, e in zip(rt(*args), gm(*args)):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert len(art["kinfo"]) == 2, [k[0] for k in art["kinfo"]]
