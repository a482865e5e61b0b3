"""The shared cases through the Triton path, run under TRITON_INTERPRET=1.

Not collected by the normal run (the name has no ``test_`` prefix): ``test_triton.py``
runs this file in a child pytest with the interpreter switched on before triton is
imported.
"""
import os

import pytest

from kiln.kernels import compile_aten_graph

from .cases import CASES, run_case

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_triton.py)")

# The interpreter runs every program in Python: the large reduction case (thousands of
# programs) is left to the C++ run; the rest keep the C++ tolerances.
TRITON_CASES = [c for c in CASES if c[0] != "reductions_large"]


@pytest.mark.parametrize("case", TRITON_CASES, ids=[c[0] for c in TRITON_CASES])
def test_case_triton(case):
    name, fn, make, tol = case
    compiled = run_case(name, fn, make, tol, "triton", compile_aten_graph)
    assert compiled.target == "triton"
    assert "@triton.jit" in compiled.artefacts["source"]


# --- reduction mappings (kernels/codegen/triton/heuristics.py plan_reduction) -------------------------
import torch
import torch.fx as fx

from kiln.kernels.codegen.triton import heuristics
from kiln.kernels.compile import build

aten = torch.ops.aten


def _check(fn, inputs, tol=(1e-5, 1e-5), ref_dtype=None):
    gm = fx.symbolic_trace(fn)
    rt, art = build(gm, inputs, "triton")
    got = rt(*inputs)
    ref_in = [t.to(ref_dtype) if ref_dtype and t.is_floating_point() else t for t in inputs]
    expect = gm(*ref_in)
    for g, e in zip(got, expect):
        assert g.shape == e.shape and g.dtype == (e.dtype if not ref_dtype or not e.is_floating_point() else g.dtype)
        if e.is_floating_point():
            torch.testing.assert_close(g.to(e.dtype), e, rtol=tol[0], atol=tol[1], equal_nan=True)
        else:
            assert torch.equal(g, e), (g, e)
    return rt, art


def _toy(a, b):
    x = aten.div.Tensor(a, aten.add.Tensor(aten.abs.default(a), 1))
    s = aten.sum.default(b)
    return (x, aten.lt.Scalar(s, 0), s)


def _few_outputs(x, m):
    return (aten.sum.dim_IntList(x, [1]), aten.amax.default(x, [1]), aten.amin.default(x, [1]),
            aten.any.dim(aten.gt.Scalar(x, 2.5), 1), aten.mean.dim(x, [1]),
            aten.prod.dim_int(aten.add.Tensor(aten.mul.Tensor(x, 1e-3), 1.0), 1),
            aten.sum.dim_IntList(m, [0]))


def test_split_reduction(monkeypatch):
    """Few outputs, long reductions: partial results per chunk, then a combining kernel.
    (Without the split the toy example's sum is one program looping over 2^26 values.)"""
    monkeypatch.setattr(heuristics, "SPLIT_MIN_RNUM", 256)
    monkeypatch.setattr(heuristics, "PERSISTENT_MAX", 64)
    monkeypatch.setattr(heuristics, "SPLIT_TARGET_PROGRAMS", 12)
    monkeypatch.setattr(heuristics, "LOOP_RBLOCK", 64)
    a, b = torch.randn(3001), torch.randn(3001)
    rt, art = _check(_toy, [a, b])
    assert "kernel0_split" in art["source"] and "ws0_" in art["source"]
    x = torch.randn(3, 1999)
    x[1, 7] = float("nan")
    m = torch.randn(1003, 2)
    rt, art = _check(_few_outputs, [x, m], tol=(1e-4, 1e-5))
    assert art["source"].count("_split") >= 2
    # a bf16 sum splits too, its partials in float32
    rt, art = _check(lambda t: (aten.sum.default(t),), [torch.randn(4097).bfloat16()],
                     tol=(2e-2, 2e-2), ref_dtype=torch.float32)
    assert "dtype=torch.float32" in art["source"]


def test_column_reduction_walks_the_kept_dim():
    """Reducing a non-innermost dim: lanes along the contiguous kept dim (coalesced)."""
    def f(x):
        return (aten.sum.dim_IntList(x, [0]), aten.sum.dim_IntList(x, [1]),
                aten.amax.default(x, [0]), aten.argmax.default(x, 1))
    rt, art = _check(f, [torch.randn(37, 19, 45)])
    plans = [heuristics.plan_reduction(g) for g in rt.sched.groups if g.red]
    assert plans and all(p.column and p.xb > 1 for p in plans)


def test_persistent_row_is_one_pass():
    """A row that fits in registers: one kernel, one load of x, no loop (softmax, LN)."""
    def f(x, w, b):
        return (aten._softmax.default(x, -1, False),)

    def g(x, w, b):
        return (aten.native_layer_norm.default(x, [300], w, b, 1e-5)[0],)
    for fn in (f, g):
        rt, art = _check(fn, [torch.randn(7, 300), torch.randn(300), torch.randn(300)])
        assert len(rt.sched.groups) == 1
        assert "for roffset" not in art["source"]
        assert art["source"].count("tl.load(in0") == 1


def test_small_rows_share_a_program():
    rt, art = _check(lambda x: (aten._log_softmax.default(x, 1, False),), [torch.randn(33, 20)])
    p = heuristics.plan_reduction(rt.sched.groups[0])
    assert p.xb > 1 and p.persistent


def test_zero_dim_input_in_masked_rows():
    """A 0-d input read in a reduction whose row block is masked (33 rows) is loaded as a
    block, so the row mask can guard it (Triton rejects a block mask on a scalar pointer)."""
    rt, art = _check(lambda x, s: (aten.sum.dim_IntList(aten.mul.Tensor(x, s), [1]),),
                     [torch.randn(33, 20), torch.tensor(2.5)])
    p = heuristics.plan_reduction(rt.sched.groups[0])
    assert p.xb > 1


def test_long_rows_loop(monkeypatch):
    monkeypatch.setattr(heuristics, "PERSISTENT_MAX", 64)
    monkeypatch.setattr(heuristics, "LOOP_RBLOCK", 128)

    def f(x):
        return (aten._softmax.default(x, -1, False), aten.var.correction(x, [1]),
                aten.argmin.default(x, 1))
    rt, art = _check(f, [torch.randn(5, 1000)], tol=(1e-5, 1e-5))
    assert "for roffset" in art["source"]


def _bf16_graph(x, w, b, w1):
    h = aten.gelu.default(aten.mm.default(x, w1))
    return (h, aten._softmax.default(x, -1, False),
            aten.native_layer_norm.default(x, [96], w, b, 1e-6)[0],
            aten.sum.dim_IntList(x, [0]), aten.amax.default(x, [1]), aten.argmax.default(x, 1),
            aten._to_copy.default(aten.exp.default(x), dtype=torch.float32),
            aten.tanh.default(x), aten.sigmoid.default(x), aten.rsqrt.default(aten.abs.default(x)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_computes_in_fp32(dtype):
    """bf16/fp16 values are widened at the load and rounded once at the store: results
    match eager on float32 copies of the inputs within the narrow type's rounding."""
    ins = [torch.randn(10, 96), torch.randn(96), torch.randn(96), torch.randn(96, 40)]
    ins = [t.to(dtype) for t in ins]
    rt, art = _check(_bf16_graph, ins, tol=(1.6e-2, 2e-2), ref_dtype=torch.float32)
    src = art["source"]
    assert ".to(tl.float32)" in src
    for line in src.splitlines():
        if "acc_" in line and ("tl.full([XBLOCK, RBLOCK]" in line
                               or "tl.full([RBLOCK, XBLOCK]" in line):
            assert "bfloat16" not in line and "float16" not in line.replace("float32", "")


def _conv_block(x, w1, w2, g, b):
    y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    y = aten.relu.default(aten.add.Tensor(aten.mul.Tensor(y, g), b))
    p = aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0]
    z = aten.convolution.default(p, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    z = aten.relu.default(aten.add.Tensor(z, p))
    return (z, aten.mean.dim(z, [-1, -2]))


def _squeeze_excite(x, w1, b1, w2, b2):
    s = aten.mean.dim(x, [-1, -2], True)
    s = aten.relu.default(aten.convolution.default(s, w1, b1, [1, 1], [0, 0], [1, 1], False,
                                                   [0, 0], 1))
    s = aten.hardsigmoid.default(aten.convolution.default(s, w2, b2, [1, 1], [0, 0], [1, 1],
                                                          False, [0, 0], 1))
    return (aten.mul.Tensor(x, s),)


def test_bf16_convolution_biases_are_added_in_kiln_kernels():
    """A squeeze-excitation block's 1x1 convolutions run without their bias, which the
    kernel reading each product adds (ATen adds it in a kernel of its own per call);
    values as eager's."""
    from kiln.kernels import ir
    torch.manual_seed(0)
    ins = [torch.randn(2, 16, 6, 6), torch.randn(4, 16, 1, 1) / 4, torch.randn(4),
           torch.randn(16, 4, 1, 1) / 2, torch.randn(16)]
    ins = [t.to(torch.bfloat16) for t in ins]
    rt, art = _check(_squeeze_excite, ins, tol=(4e-2, 6e-2), ref_dtype=torch.float32)
    convs = [b for b in rt.lo.buffers if isinstance(b, ir.Extern)
             and b.op is aten.convolution.default]
    # (dropped, the biases would fail the comparison above)
    assert len(convs) == 2 and all(c.args[2] is None for c in convs)


def test_bf16_convolutions_run_channels_last():
    """bf16 convolution chains stay channels-last (no cuDNN transposes around each call):
    our kernels write the NHWC inputs, walk memory in NHWC order, and outputs come back
    in eager's layout."""
    from kiln.kernels import ir
    from kiln.kernels.runtime import runner as runtime
    dt = torch.bfloat16
    torch.manual_seed(0)
    ins = [torch.randn(2, 3, 16, 16), torch.randn(8, 3, 3, 3) / 3, torch.randn(8, 8, 3, 3) / 8,
           torch.randn(1, 8, 1, 1), torch.randn(1, 8, 1, 1)]
    ins = [t.to(dt) for t in ins]
    copies = []
    orig = runtime._fix_layout

    def spy(t, b):
        r = orig(t, b)
        copies.append(r is not t)
        return r
    runtime._fix_layout = spy
    try:
        rt, art = _check(_conv_block, ins, tol=(4e-2, 6e-2), ref_dtype=torch.float32)
    finally:
        runtime._fix_layout = orig
    convs = [b for b in rt.lo.buffers if isinstance(b, ir.Extern)
             and b.op is aten.convolution.default]
    assert len(convs) == 2 and all(b.strides[1] == 1 for b in convs)
    for c in convs:
        src = rt.lo.by_name[c.args[0].buf]
        assert c.args[0].strides[1] == 1, src
        # the 3x3 weights too: given NCHW, ATen would copy them channels-last per call
        w = c.args[1]
        assert isinstance(rt.lo.by_name[w.buf], ir.Pointwise) and w.strides[1] == 1, w
    assert not any(copies)          # the library agreed with the layouts we planned
    pooled = [b for b in rt.lo.buffers if isinstance(b, ir.Pointwise)
              and b.origin.startswith("max_pool2d") and b.dtype == dt]
    assert len(pooled) == 1 and pooled[0].strides[1] == 1, \
        "the pool is written channels-last, in the order it reads its input"
    assert convs[1].args[0].buf == pooled[0].name, "the conv reads it with no copy"
    got = rt(*ins)
    assert got[0].stride() == _conv_block(*ins)[0].stride()
    assert "x1 = xindex % 8" in art["source"]      # channels fastest in the pointwise kernels
