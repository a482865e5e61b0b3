"""Small matrix products on the CPU as kiln's own loops, not library calls.

A BLAS call from the runtime costs several microseconds of Python and dispatch before
any arithmetic; a Linear(16, 16) on one row is 256 multiply-adds, under a microsecond of
work. Lowered as a sum over the shared dimension, such a product joins the graph's C++
code: its bias and activation fuse into the same kernel as a reduction epilogue, and a
stack of small layers becomes one call into the shared library instead of a library
call per layer (``benchmarks/small_layers.py``).

Only on the C++ target, for float32/float64, and only up to ``config.small_matmul_macs``
multiply-adds: beyond that the library's blocked kernels win, so the lowering declines
and the op stays a library call (not a fallback). The sum runs in kiln's reduction
order, not BLAS's, so results differ from eager by rounding only.
"""
from __future__ import annotations

import torch

from ... import config
from .base import Lazy, Unsupported, is_box, pointwise, reduce, register
from ..ops import cast, const, op

aten = torch.ops.aten
_DTYPES = (torch.float32, torch.float64)


def _product_sum(lo, node, a, b, dtype):
    """``a @ b`` for boxes [M, K] and [K, N]: a sum over K of a lazy [M, N, K] product."""
    if lo.target != "cpp" or dtype not in _DTYPES:
        raise Unsupported("K0211", "small matmuls are lowered for the C++ target only")
    if not (is_box(a) and is_box(b)) or len(a.sizes) != 2 or len(b.sizes) != 2:
        raise Unsupported("K0205", "mm of non-matrices")
    m, k = (int(s) for s in a.sizes)
    n = int(b.sizes[1])
    if m * n * k > config.small_matmul_macs or k == 0:
        raise Unsupported("K0211", "large enough for the library")

    def body(idx):
        i, j, r = idx
        return op("mul", cast(a.load([i, r]), dtype), cast(b.load([r, j]), dtype))
    return reduce(lo, node, Lazy((m, n, k), dtype, body), [2], False, "sum", dtype)


@register(aten.mm.default)
def _mm(lo, node, a, b):
    return _product_sum(lo, node, a, b, lo.out_meta(node).dtype)


@register(aten.addmm.default)
def _addmm(lo, node, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b): the product first, then the scaled bias added to
    it, as BLAS adds C after the dot products."""
    dtype = lo.out_meta(node).dtype
    prod = _product_sum(lo, node, a, b, dtype)

    def combine(c, p):
        if alpha != 1:
            p = op("mul", p, const(alpha, dtype))
        if beta == 0:
            return p
        if beta != 1:
            c = op("mul", c, const(beta, dtype))
        return op("add", p, c)
    return pointwise(lo, node, [bias, prod], combine)

