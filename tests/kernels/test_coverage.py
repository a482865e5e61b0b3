"""Every registered lowering, scalar op and reduction kind is exercised by the shared
kernel cases (``cases.CASES``, which the C++, Triton-interpreter and GPU tests all run
against eager).

The cases are lowered (not compiled: fast) under a recorder: a lowering counts when it
returned a value for some node; a scalar op or reduction kind counts when it appears in
the lowered buffers. What the cases cannot reach is in ``NOT_IN_CASES``, with the test
that covers it instead.
"""
import pytest
import torch
import torch.fx as fx

from kiln.kernels import ir
from kiln.kernels.lowering import LOWERINGS, GraphLowering
from kiln.kernels.ops import OPS
from kiln.kernels.reductions import KINDS

from .cases import CASES

aten = torch.ops.aten

#: registered lowerings no shared case reaches, and why
NOT_IN_CASES = {
    aten.as_strided.default: "needs a value that is its whole eager storage: "
                             "test_view_scatter_lowerings.py",
    aten.as_strided_scatter.default: "as as_strided: test_view_scatter_lowerings.py",
    aten.convolution.default: "lowered only for bf16/fp16 on the GPU (channels-last): "
                              "test_triton_gpu.py",
}


def record(cases):
    """(lowerings that returned, scalar ops, reduction kinds) of lowering ``cases``."""
    lowered, ops, kinds = set(), set(), set()
    saved = dict(LOWERINGS)

    def recording(target, fn):
        def lower(*args, **kwargs):
            out = fn(*args, **kwargs)
            lowered.add(target)
            return out
        return lower

    LOWERINGS.update({t: recording(t, f) for t, f in saved.items()})
    try:
        for name, fn, make, _ in cases:
            torch.manual_seed(0)
            gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
            lo = GraphLowering(gm, make(), "cpp").run()
            for b in lo.buffers:
                if isinstance(b, ir.Reduction):
                    kinds.add(b.red_type)
                body = getattr(b, "body", None)
                if isinstance(body, ir.Expr):
                    ops.update(e.name for e in ir.walk(body) if isinstance(e, ir.Op))
    finally:
        LOWERINGS.clear()
        LOWERINGS.update(saved)
    return lowered, ops, kinds


@pytest.fixture(scope="module")
def exercised():
    return record(CASES)


def test_every_lowering_is_exercised(exercised):
    lowered = exercised[0]
    missing = {t for t in LOWERINGS if t not in lowered} - set(NOT_IN_CASES)
    assert not missing, sorted(map(str, missing))


def test_the_allow_list_is_honest(exercised):
    """Each entry is registered and really not reached (else it leaves the list)."""
    for t in NOT_IN_CASES:
        assert t in LOWERINGS, t
        assert t not in exercised[0], f"{t} is exercised now: drop it from NOT_IN_CASES"


def test_every_scalar_op_is_exercised(exercised):
    assert not set(OPS) - exercised[1], sorted(set(OPS) - exercised[1])


def test_every_reduction_kind_is_exercised(exercised):
    assert not set(KINDS) - exercised[2], sorted(set(KINDS) - exercised[2])


def test_the_recorder_tells_what_a_case_reaches():
    """Not vacuous: one pointwise case reaches exp but no sum, no reduction kind."""
    before = dict(LOWERINGS)
    lowered, ops, kinds = record([c for c in CASES if c[0] == "unary_contig"])
    assert aten.exp.default in lowered and "exp" in ops
    assert aten.sum.dim_IntList not in lowered and not kinds
    assert LOWERINGS == before                                  # the table is restored
