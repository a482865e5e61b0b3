"""Column reductions (the kept dim is the contiguous one) through the Triton path, under
TRITON_INTERPRET=1: the [RBLOCK, XBLOCK] block reduced over axis 0, and the split into
[split, outputs] partials and a second kernel (``codegen/triton/heuristics.py``,
``kernel.py``), against eager.

Not collected by the normal run (no ``test_`` prefix): ``test_column_reductions.py`` runs
this file in a child pytest with the interpreter (and KILN_KERNEL_TARGET=triton) set
before triton is first imported.
"""
import os
import re

import pytest
import torch
import torch.fx as fx

from kiln.kernels.codegen.triton import heuristics, source as triton_source
from kiln.kernels.compile import build

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_column_reductions.py)")

aten = torch.ops.aten


def _compile(fn, inputs):
    gm = fx.symbolic_trace(fn)
    rt, art = build(gm, inputs, "triton")
    return gm, rt, art


def _check(fn, inputs, tol=(1e-5, 1e-5)):
    """Compiled against eager (float32 copies of narrow inputs as the reference): values,
    shapes, dtypes."""
    gm, rt, art = _compile(fn, inputs)
    got = rt(*inputs)
    wide = [t.float() if t.dtype in (torch.bfloat16, torch.float16) else t for t in inputs]
    expect, same = gm(*wide), gm(*inputs)
    for g, e, s in zip(got, expect, same):
        assert g.shape == s.shape and g.dtype == s.dtype, (g.shape, s.shape, g.dtype, s.dtype)
        torch.testing.assert_close(g.to(e.dtype), e, rtol=tol[0], atol=tol[1], equal_nan=True)
    return rt, art


def _plans(rt):
    return [heuristics.plan_reduction(g) for g in rt.sched.groups if g.red]


OPS = {
    "sum": lambda x, k: aten.sum.dim_IntList(x, [0], k),
    "mean": lambda x, k: aten.mean.dim(x, [0], k),
    "amax": lambda x, k: aten.amax.default(x, [0], k),
}

SHAPES = [(1, 37), (5, 45), (33, 8), (1031, 45), (2000, 100), (1500, 3, 40)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
def test_column_sum_mean_amax(shape, dtype, keepdim):
    """Sums, means and maxima over dim 0: short (one block), odd, non-power-of-two, and
    long enough to split (1031, 1500 and 2000 rows), one or two kept dims."""
    torch.manual_seed(0)
    x = torch.randn(*shape).to(dtype)
    if shape[0] > 4:
        x[3, 2] = float("nan")          # the max and the sum of that column are NaN
        x[4, 1] = float("-inf")

    def f(t):
        return tuple(op(t, keepdim) for op in OPS.values())
    tol = (1e-5, 1e-4) if dtype == torch.float32 else (1.6e-2, 5e-2)
    rt, _ = _check(f, [x], tol)
    plans = _plans(rt)
    if shape[-1] >= 8 and shape[0] > 1:
        assert plans and all(p.column for p in plans), plans
    if shape[0] >= heuristics.COLUMN_SPLIT_MIN_RNUM:
        assert all(p.split > 1 for p in plans), plans


def _ln_wgrad(a, b):
    """LayerNorm's weight and bias gradients: two sums over (batch, sequence) in one kernel."""
    return (aten.sum.dim_IntList(aten.mul.Tensor(a, b), [0, 1]), aten.sum.dim_IntList(a, [0, 1]))


def test_two_sums_fused_and_split():
    torch.manual_seed(0)
    a, b = torch.randn(4, 300, 96), torch.randn(4, 300, 96)
    rt, art = _check(_ln_wgrad, [a, b], (1e-5, 1e-4))
    src = art["source"]
    # one stage-1 kernel computes both partials, the second stage combines both
    assert src.count("_split(") == 1 and len(re.findall(r"ws\d+_buf\d+ = torch.empty", src)) == 2
    (p,) = _plans(rt)
    assert p.column and p.split > 1


def test_colsum_4096x768_is_coalesced_and_split():
    """The shape of GPT-2's LayerNorm / bias gradients: the block's fast axis is the
    outputs (x on axis 1, rows on axis 0, reduced over axis 0), the rows split over many
    programs whose partials are laid [split, outputs], then combined by a second column
    reduction. Without the feature this is 768/XBLOCK programs each walking 4096 rows."""
    torch.manual_seed(0)
    x = torch.randn(4096, 768).bfloat16()
    rt, art = _check(lambda t: (aten.sum.dim_IntList(aten._to_copy.default(
        t, dtype=torch.float32), [0]),), [x], (1e-4, 1e-3))
    (p,) = _plans(rt)
    assert p.column and p.split >= 32 and p.xb >= 64, p
    programs = -(-768 // p.xb) * p.split
    assert programs >= 512, programs
    src = art["source"]
    stage1 = src[src.index("def kernel0_split("):src.index("def kernel0(")]
    stage2 = src[src.index("def kernel0("):src.index("def kiln_seg0")]
    for k in (stage1, stage2):
        assert "tl.arange(0, XBLOCK)[None, :]" in k and "tl.arange(0, RBLOCK)[:, None]" in k
        assert "tl.full([RBLOCK, XBLOCK], 0, tl.float32)" in k
        assert re.search(r"tl\.sum\(acc_buf0, 0\)\)\[None, :\]", k)
        # the contiguous (coefficient 1) index term is the output's
        assert re.search(r"tl\.load\(\w+ \+ \(x0 \+ ks\d+\*x1\)", k), k
    assert re.search(r"tl\.store\(ws0_buf0 \+ tl\.program_id\(1\) \* ks\d+ \+ xindex", stage1)
    assert "tl.program_id(1)" not in stage2


def test_size_classes_split_soundly():
    """Lengths whose split and chunk differ: each compiled (the text, lifted sizes and
    all, is the specialised one) and right."""
    for rows in (1031, 1100, 2047, 3000):
        torch.manual_seed(rows)
        x = torch.randn(rows, 45)
        rt, _ = _check(lambda t: (aten.sum.dim_IntList(t, [0]),), [x], (1e-5, 1e-4))
        assert _plans(rt)[0].split > 1


def test_split_keeps_fp32_precision():
    """The split changes the order of the sum: against a float64 reference, on data with
    a large offset, no worse than eager's error (bound as in test_reduction_precision)."""
    torch.manual_seed(0)
    x = 100.0 + torch.randn(8192, 64)
    rt, _ = _check(lambda t: (aten.sum.dim_IntList(t, [0]),), [x], (1e-4, 1e-2))
    assert _plans(rt)[0].split > 1
    ref = x.double().sum(0)
    err = ((rt(x)[0].double() - ref).abs().max() / ref.abs().max()).item()
    eager = ((x.sum(0).double() - ref).abs().max() / ref.abs().max()).item()
    assert err <= max(4 * eager, 3e-7), (err, eager)


def test_argmax_column_is_not_split():
    """An arg kind has no combine: the column block, reduced over axis 0, unsplit."""
    torch.manual_seed(0)
    x = torch.randn(1200, 50)
    x[7, 3] = float("nan")
    rt, _ = _check(lambda t: (aten.argmax.default(t, 0), aten.argmin.default(t, 0, True)), [x])
    assert all(p.column and p.split == 1 for p in _plans(rt))


def test_layer_norm_backward_through_the_backend(monkeypatch):
    """A LayerNorm trained through kiln's backend (KILN_KERNEL_TARGET=triton): its weight
    and bias gradients are split column reductions; gradients match eager's."""
    import kiln
    plans = []
    real = triton_source.plan_reduction

    def spy(g, interpret=False):
        p = real(g, interpret)
        plans.append(p)
        return p
    monkeypatch.setattr(triton_source, "plan_reduction", spy)
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(96)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    x = torch.randn(4, 300, 96)
    gy = torch.randn(4, 300, 96)

    def step(fn, t):
        t = t.detach().requires_grad_()
        ln.zero_grad()
        (fn(t) * gy).sum().backward()
        return t.grad, ln.weight.grad.clone(), ln.bias.grad.clone()
    expect = step(ln, x)
    got = step(kiln.compile(lambda t: ln(t), backend="kiln"), x)
    assert any(p.column and p.split > 1 for p in plans), plans
    for g, e in zip(got, expect):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def _gelu_grad_and_bias(g, x):
    """A Linear's input gradient through GELU, stored (bf16) for the next matmul, and
    summed over tokens for the bias (an MLP's backward)."""
    d = aten.gelu_backward.default(g, x)
    return (d, aten.sum.dim_IntList(d, [0], dtype=torch.float32))


def test_stored_value_beside_a_split_sum():
    """A stored bf16 value and its split fp32 column sum: the sum reads the rounded
    values eager sums."""
    torch.manual_seed(0)
    g, x = torch.randn(1100, 72).bfloat16(), torch.randn(1100, 72).bfloat16()
    rt, art = _check(_gelu_grad_and_bias, [g, x], (1.6e-2, 5e-2))
    plans = _plans(rt)
    assert any(p.column and p.split > 1 for p in plans), plans
    # the sum is computed from the same rounded value eager sums: exact up to fp32 order
    got = rt(g, x)
    torch.testing.assert_close(got[1], got[0].float().sum(0), rtol=1e-5, atol=1e-4)


def _ln_wgrad_recomputed(x, mean, rstd, gy):
    """LayerNorm's weight gradient recomputing the normalised input from each row's
    mean and rstd (one value per reduced row: no say in the block's orientation)."""
    xhat = aten.mul.Tensor(aten.sub.Tensor(x, mean), rstd)
    return (aten.sum.dim_IntList(aten.mul.Tensor(gy, xhat), [0]), aten.sum.dim_IntList(gy, [0]))


def test_row_statistics_do_not_make_a_column_a_row():
    torch.manual_seed(0)
    x, gy = torch.randn(1200, 96), torch.randn(1200, 96)
    mean, rstd = torch.randn(1200, 1), torch.rand(1200, 1) + 0.5
    rt, _ = _check(_ln_wgrad_recomputed, [x, mean, rstd, gy], (1e-5, 1e-4))
    (p,) = _plans(rt)
    assert p.column and p.split > 1, p


def _two_pass_var(x):
    mean = aten.mean.dim(x, [0], True)
    d = aten.sub.Tensor(x, mean)
    return (aten.squeeze.dim(mean, 0), aten.mean.dim(aten.mul.Tensor(d, d), [0]))


@pytest.mark.parametrize("layout", ["column", "row"])
def test_loops_apart_two_pass_statistics_split(layout):
    """A batch norm's statistics over few channels: the mean's loop and the variance's
    loop (which reads the mean) were one group, which the generator cannot split, so few
    programs walked every value twice (channels-last bn1 of resnet18 at batch 32: one
    program, 13.6 ms). The scheduler cuts the group per loop; each loop is then split
    over many programs, and the values are eager's."""
    torch.manual_seed(0)
    if layout == "column":      # [rows, channels]: the kept dim contiguous
        x = torch.randn(3000, 8) * 3 + 5
        fn = _two_pass_var
    else:                       # [channels, rows]
        x = torch.randn(8, 40000) * 3 + 5
        fn = lambda t: _two_pass_var(aten.permute.default(t, [1, 0]))  # noqa: E731
    rt, art = _check(fn, [x], (1e-5, 1e-4))
    src = art["source"]
    assert src.count("_split(") == 2, src
    plans = _plans(rt)
    assert len(plans) == 2 and all(p.split > 1 for p in plans), plans
    assert all(p.column == (layout == "column") for p in plans)


def test_short_column_reductions_over_few_outputs_narrow_their_block():
    """A squeeze-excitation block's mean over 14x14 channels-last values of 16x96
    channels: at 64 outputs a program, 24 programs for the whole GPU; the block narrows
    until there are enough programs (or 8 outputs a program), and the reduction, short,
    stays whole in registers. Values as eager's."""
    torch.manual_seed(0)
    x = torch.randn(16, 96, 14, 14).bfloat16().contiguous(memory_format=torch.channels_last)
    rt, _ = _check(lambda t: (aten.mean.dim(t, [2, 3], True),), [x], (1.6e-2, 2e-2))
    (p,) = _plans(rt)
    assert p.column and p.split == 1 and p.persistent, p
    assert p.xb == heuristics.COLUMN_MIN_XBLOCK
    assert -(-16 * 96 // p.xb) >= heuristics.COLUMN_MIN_PROGRAMS
