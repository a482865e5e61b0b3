"""Graphs compiled at several sizes, shared by the C++ test (``test_size_generic.py``) and
the Triton one (``size_generic_triton_cases.py``, under TRITON_INTERPRET=1).

Each case: (name, function, input factory of a size, sizes of one size class). A case
compiles the function's aten graph (traced at each size, as the autograd stage hands
it over while it is specialised per size) once per size, compares each result with
eager, and counts the compiler runs each size cost: with sizes and strides passed as
kernel arguments (``kiln/kernels/codegen/size_args.py``) only the first size of a
class compiles anything.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from kiln import config
from kiln.kernels import compile_aten_graph


def pointwise(x, y):
    return (torch.sigmoid(x * 2.5 + y) * x - 1).relu(), x.exp() / (y.abs() + 1)


def reductions(x, y):
    return (torch.softmax(x * 2 + y, -1), F.layer_norm(x, x.shape[-1:]), x.sum(0),
            x.amax(-1), x.mean())


def views(x, y):
    t = x.t()
    return (t[1:-1] * 2 + t[:-2].exp(), x[:, ::2].sum(-1), x.reshape(-1)[3:] + 1,
            y.unsqueeze(0).expand(x.shape[0], -1) * x)


def padding(x, y):
    return F.pad(x, (1, 2, 0, 3)) * 2, F.pad(y, (2, 2)) + 1


def matmul_epilogue(x, w, b):
    return torch.relu(x @ w + b), torch.tanh(x @ w)


def _xy(rows, cols):
    return torch.randn(rows, cols), torch.randn(cols)


def _mm(rows, cols):
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, cols, generator=g), torch.randn(cols, 24, generator=g),
            torch.randn(24, generator=g))


#: sizes of one class for both code generators: more than 1024 elements and at most
#: 2048 (Triton's blocks), less than the C++ parallel threshold, rows of 33..64 (one
#: Triton RBLOCK); no size derived from them a multiple of 16 (Triton's divisibility
#: hint) and no two equal (equal values share one argument): either is another class
SIZES = [(34, 39), (43, 38), (33, 42)]
CASES = [
    ("pointwise", pointwise, _xy, SIZES),
    ("reductions", reductions, _xy, SIZES),
    ("views", views, _xy, SIZES),
    ("padding", padding, _xy, SIZES),
    # products above config.small_matmul_macs: library calls (smaller ones are C++ loops)
    ("matmul_epilogue", matmul_epilogue, _mm, [(49, 40), (57, 40), (69, 40)]),
]


def trace(fn, args):
    return make_fx(fn)(*args)


def compare(out, ref):
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)


def run_sizes(fn, make, sizes, target, builds):
    """Compile ``fn`` at each size, check it against eager; per size, the compiler runs
    (``builds()``, a running count) it cost. The compiled graphs stay alive together,
    as a program's size variants do."""
    costs, alive = [], []
    for sz in sizes:
        args = make(*sz)
        before = builds()
        cg = compile_aten_graph(trace(fn, args), list(args), target, perf_fallback=False)
        compare(cg(*args), fn(*args))
        costs.append(builds() - before)
        alive.append(cg)
    return costs, alive


def odd_inputs():
    """Inputs of awkward layouts, each (name, args): one row, no rows, no columns,
    transposed, expanded (stride 0)."""
    g = torch.Generator().manual_seed(0)
    return [("one_row", (torch.randn(1, 37, generator=g), torch.randn(37, generator=g))),
            ("empty", (torch.randn(0, 37, generator=g), torch.randn(37, generator=g))),
            ("no_columns", (torch.randn(23, 0, generator=g), torch.randn(0, generator=g))),
            ("transposed", (torch.randn(41, 29, generator=g).t(), torch.randn(41, generator=g))),
            ("expanded", (torch.randn(1, 39, generator=g).expand(27, 39),
                          torch.randn(39, generator=g)))]


def run_odd(fn, target):
    for name, args in odd_inputs():
        if fn is views and args[0].shape[1] == 0:
            continue              # t[1:-1] of no rows: nothing size-generic to check
        try:
            ref = fn(*args)
        except Exception as e:    # noqa: BLE001  (eager's error: kiln raises it too)
            with pytest.raises(type(e)):
                cg = compile_aten_graph(trace(fn, args), list(args), target,
                                        perf_fallback=False)
                cg(*args)
            continue
        cg = compile_aten_graph(trace(fn, args), list(args), target, perf_fallback=False)
        compare(cg(*args), ref)


def lifting(on: bool):
    return config.patch(kernel_size_args=on)


def mlp_training_step_costs(builds, **settings) -> list:
    """A small MLP's training step through ``kiln.compile`` (capture, autograd and
    kernels) at three batch sizes, loss and gradients compared with eager's; returns
    the builds (``builds()``: a count) each size cost."""
    import kiln
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.GELU(), torch.nn.Linear(32, 5))
    ref = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.GELU(), torch.nn.Linear(32, 5))
    ref.load_state_dict(model.state_dict())

    def step(m, x, t):
        loss = F.cross_entropy(m(x), t)
        loss.backward()
        return loss

    compiled = kiln.compile(step)
    costs = []
    with kiln.config.patch(recompile_limit=64, **settings):
        for b in (34, 41, 47):
            x, t = torch.randn(b, 20), torch.randint(0, 5, (b,))
            before = builds()
            loss = compiled(model, x, t)
            costs.append(builds() - before)
            torch.testing.assert_close(loss, step(ref, x, t))
            for p, q in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6)
    return costs
