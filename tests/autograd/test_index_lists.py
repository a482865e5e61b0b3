"""Indexing with Python lists (``x[[0, 2]]``) and operators eager binds as dunders
(``x << 1``) through ``aot_eager`` and ``kiln``: traced, never run eagerly, and equal
to eager (values, gradients, written inputs)."""
from __future__ import annotations

import warnings

import pytest
import torch

import kiln
from kiln.autograd.backend import aot_eager
from kiln.kernels.backend import kiln_backend

BACKENDS = {"aot_eager": aot_eager, "kiln": kiln_backend}


def _watching(backend, graphs):
    def compile_graph(gm, example_inputs):
        graphs.append(BACKENDS[backend](gm, example_inputs))
        return graphs[-1]
    return compile_graph


def _read(x):
    return x[[0, 2]] * 2


def _read_2d(x):
    return x[[0, 2], [1, 0]] + x[:, [1, 1]].sum()


def _read_nested(x):
    return x[[[0, 1], [1, 0]]] * 3            # read as a tuple of two index lists


def _read_empty(x):
    return x[[]].sum() + x


def _read_negative(x):
    return x[[-1, 0]]


def _write(x):
    x[[0, 2]] = 0
    return x * 1


def _write_2d(x):
    x[[0, 1], [1, 0]] = x[[2, 2], [0, 1]] * 3
    return x * 1


def _shifts(x):
    return (x << 1) + (x >> 1) + (1 << x.clamp(0, 3)) + (x & 3) + (x | 1) + (x ^ 2)


CASES = [
    ("read", _read, True), ("read_2d", _read_2d, True), ("read_nested", _read_nested, True),
    ("read_empty", _read_empty, True), ("read_negative", _read_negative, True),
    ("write", _write, False), ("write_2d", _write_2d, False),
]
#: aot_eager calls ops through eager's bindings: ``__lshift__`` has no module FX can name
BINDING_CASES = [("shifts", _shifts, None)]


@pytest.mark.parametrize("name,fn,grad,backend",
                         [(*c, b) for c in CASES for b in BACKENDS] +
                         [(*c, "aot_eager") for c in BINDING_CASES],
                         ids=[f"{c[0]}-{b}" for c in CASES for b in BACKENDS] +
                         [f"{c[0]}-aot_eager" for c in BINDING_CASES])
def test_traced_and_equal_to_eager(name, fn, grad, backend):
    """``grad``: the argument is a leaf that requires grad (True), a non-leaf made
    from one, written in place (False), or an integer tensor (None)."""
    def make():
        torch.manual_seed(0)
        if grad is None:
            return None, torch.arange(6).view(3, 2)
        leaf = torch.randn(3, 2, requires_grad=True)
        return leaf, (leaf if grad else leaf * 1)
    warnings.simplefilter("ignore", UserWarning)      # eager's list-as-tuple warning
    graphs = []
    compiled = kiln.compile(fn, backend=_watching(backend, graphs))
    (leaf_e, xe), (leaf_c, xc) = make(), make()
    expected = fn(xe)
    got = compiled(xc)
    assert graphs and all(g.eager_calls == 0 for g in graphs), \
        [g.eager_reasons for g in graphs]
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(xc, xe)
    if grad is not None:
        expected.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(leaf_c.grad, leaf_e.grad)
