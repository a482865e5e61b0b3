"""Long fp32 sums against a float64 reference, on data with a large offset.

One fp32 accumulator over a long reduction (a BatchNorm mean over N*H*W = 8192 values of
~100) loses digits as the total grows: the C++ kernels were ~30x further from float64
than eager PyTorch (which sums in cascades), and that error went on through BatchNorm's
output and gradients. The C++ kernels now sum long fp32 reductions in blocks, each
block's partial added into the total with a compensated add; these cases fail on a single
running accumulator. Eager's own error is checked on the same data, so the bound is not
tighter than what PyTorch achieves.
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph
from kiln.kernels.compile import build

aten = torch.ops.aten
OFFSET = 100.0
#: max |got - ref| / max |ref| allowed against float64; a single fp32 accumulator gives
#: 1e-6 to 6e-6 on these cases, blocked summation ~1e-8 to 8e-8
TOL = 3e-7


def _rel(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


def _var_mean_nchw(x):
    return aten.var_mean.correction(x, [0, 2, 3], correction=0)


def _bn_stats_graph(x):
    # what the BatchNorm decomposition computes: batch mean and biased variance per channel
    return (aten.var.correction(x, [0, 2, 3], correction=0, keepdim=True),
            aten.mean.dim(x, [0, 2, 3], True))


CASES = [
    # (name, fn, shape): row reductions (nested loops, one strip-mined innermost loop, a
    # parallel full reduction) and column reductions (threads sharing rows, 2-d rows)
    ("var_mean_nchw", _var_mean_nchw, (8, 64, 32, 32)),
    ("bn_stats_nchw", _bn_stats_graph, (8, 64, 32, 32)),
    ("sum_nchw_7x7", lambda x: (aten.sum.dim_IntList(x, [0, 2, 3]),), (64, 64, 7, 7)),
    ("mean_long_rows", lambda x: (aten.mean.dim(x, [1]),), (4, 1 << 17)),
    ("sum_full", lambda x: (aten.sum.default(x),), (1 << 19,)),
    ("sum_columns", lambda x: (aten.sum.dim_IntList(x, [0]),), (32768, 64)),
    ("sum_columns_2d", lambda x: (aten.sum.dim_IntList(x, [0, 1]),), (128, 256, 64)),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_long_fp32_sum_near_float64_cpp(case):
    name, fn, shape = case
    torch.manual_seed(0)
    x = OFFSET + torch.randn(*shape)
    gm = fx.symbolic_trace(fn)
    compiled = compile_aten_graph(gm, [x], target="cpp")
    got, ref, eager = compiled(x), gm(x.double()), gm(x)
    for k, (g, r, e) in enumerate(zip(got, ref, eager)):
        assert g.dtype == torch.float32
        err, eager_err = _rel(g, r), _rel(e, r)
        assert err <= max(TOL, 2 * eager_err), (name, k, err, eager_err)


def test_batchnorm_training_near_float64_cpp():
    """A BatchNorm2d training step through kiln (decomposed into core aten ops, then the
    C++ kernels): output, running mean and gradients no further from float64 than a
    small multiple of eager fp32's error (before: 20-30x eager's)."""
    import copy

    import kiln
    torch.manual_seed(0)
    x0 = OFFSET + torch.randn(8, 64, 16, 16)
    g0 = torch.randn(8, 64, 16, 16)
    base = torch.nn.BatchNorm2d(64)
    with torch.no_grad():
        base.weight.uniform_(0.5, 1.5)
        base.bias.uniform_(-0.5, 0.5)

    def run(m, x, g, backend):
        f = kiln.compile(m, backend=backend, fullgraph=True) if backend else m
        x = x.clone().requires_grad_()
        y = f(x)
        y.backward(g)
        return [y.detach(), m.running_mean, m.running_var, x.grad, m.weight.grad, m.bias.grad]

    ref = run(copy.deepcopy(base).double(), x0.double(), g0.double(), None)
    eager = run(copy.deepcopy(base), x0, g0, None)
    try:
        with kiln.config.patch(suppress_errors=False):
            got = run(copy.deepcopy(base), x0, g0, "kiln")
    finally:
        kiln.reset()
    names = ["out", "running_mean", "running_var", "grad_input", "grad_weight", "grad_bias"]
    for n, g, e, r in zip(names, got, eager, ref):
        err, eager_err = _rel(g, r), _rel(e, r)
        assert err <= max(4 * eager_err, 1e-7), (n, err, eager_err)


def _special(x):
    return (aten.sum.dim_IntList(x, [1]), aten.sum.dim_IntList(x, [0]))


def test_blocked_sum_keeps_inf_and_nan_cpp():
    """The compensation term must not turn an infinite total into NaN (inf - inf)."""
    x = torch.randn(8, 4096)
    x[0, 100] = float("inf")
    x[1, 5] = float("inf")
    x[1, 4000] = float("-inf")
    x[2, 3000] = float("nan")
    x[3, 7] = 3e38
    x[3, 9] = 3e38            # overflows to inf, as eager's sum does
    x[4, 11] = float("-inf")
    xt = x.t().contiguous()   # the same sums as a column reduction
    gm = fx.symbolic_trace(lambda a, b: (aten.sum.dim_IntList(a, [1]),
                                         aten.sum.dim_IntList(b, [0])))
    compiled = compile_aten_graph(gm, [x, xt], target="cpp")
    assert compiled.artefacts["source"].count("kiln_sum_add(") >= 2
    for g, e in zip(compiled(x, xt), gm(x, xt)):
        assert torch.equal(torch.isnan(g), torch.isnan(e)), (g, e)
        assert torch.equal(torch.isinf(g), torch.isinf(e)) and torch.equal(g[[0, 3, 4]], e[[0, 3, 4]]), (g, e)
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-3, equal_nan=True)


def test_short_sums_are_not_blocked_cpp():
    """Short reductions keep their single accumulator (no extra work where it is not
    needed), in double for fp32 sums; long fp32 ones get the blocked, compensated form
    (float block partials); fp64 ones do not."""
    def f(a, b, c):
        return (aten.sum.dim_IntList(a, [1]), aten.sum.dim_IntList(b, [1]),
                aten.sum.dim_IntList(c, [1]))
    a, b, c = torch.randn(16, 200), torch.randn(16, 5000), torch.randn(16, 5000).double()
    _, art = build(fx.symbolic_trace(f), [a, b, c], "cpp")
    src = art["source"]
    assert len(re.findall(r"float acc_(\w+)_p = ", src)) == 1
    # the short fp32 sum and the fp64 one accumulate in double; the long one's total
    # (with its compensation) stays float
    assert len(re.findall(r"double acc_buf\d+ = ", src)) == 2
    assert len(re.findall(r"float acc_buf\d+ = ", src)) == 1
    assert len(re.findall(r"kiln_sum_add\(acc_", src)) == 1
    assert not re.search(r"double acc_\w+_c", src)


_TRITON_CHILD = textwrap.dedent("""
    import torch, torch.fx as fx
    from kiln.kernels.codegen.triton import heuristics
    from kiln.kernels.compile import build
    aten = torch.ops.aten
    # looped rows with long per-lane chains, as on the GPU for large N*H*W
    heuristics.PERSISTENT_MAX = 256
    heuristics.LOOP_RBLOCK = 64
    torch.manual_seed(0)
    x = 100.0 + torch.randn(4, 8, 32, 32)
    gm = fx.symbolic_trace(lambda t: aten.var_mean.correction(t, [0, 2, 3], correction=0))
    rt, art = build(gm, [x], "triton")
    assert "for roffset" in art["source"]
    for g, r, e in zip(rt(x), gm(x.double()), gm(x)):
        err = ((g.double() - r).abs().max() / r.abs().max()).item()
        eager = ((e.double() - r).abs().max() / r.abs().max()).item()
        assert err <= max(%g, 2 * eager), (err, eager)
    print("TRITON_OK")
""")


@pytest.mark.slow      # the Triton interpreter: minutes of the quick subset's budget
def test_long_fp32_sum_near_float64_triton_interpreter(tmp_path):
    """The Triton path accumulates lane-wise and combines lanes as a tree (tl.sum):
    checked here under the interpreter (a guard; it was not the one that lost digits)."""
    pytest.importorskip("triton")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _TRITON_CHILD % TOL], env=env, cwd=root,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "TRITON_OK" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
