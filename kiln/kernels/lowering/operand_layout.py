"""The memory order a computed matrix-product operand is stored in.

A library matrix product (``mm``, ``addmm``, ``bmm``, ``baddbmm``) reads a row-major or
a column-major operand alike: cuBLAS and CPU BLAS take a transposed matrix as a flag
and a leading dimension, with no copy. An operand that is a window on a stored buffer
is passed as that window (``GraphLowering._as_view``). One that must be computed first
(a cast, an activation) is stored by a kernel; stored in the operand's own index order,
a transposed operand (``x.t()`` of a Linear's weight gradient, the ``W.t()`` of a
weight cast to bf16) makes that kernel read its input across rows, a strided read per
element, then write the copy the library needs no more than a view of.

``store_for_library`` stores such an operand in the order its reads run instead: when
its loads are contiguous along the matrix's row index (dim -2) rather than its column
index (dim -1), the kernel loops over the transposed sizes (reads and writes both
contiguous, the order its input's producer wrote in) and the library gets the
transposed view, a column-major matrix. The batch dim of a ``bmm`` operand stays
outermost, which the batched library calls require of neither layout but keeps the
batch stride the largest.
"""
from __future__ import annotations

from .. import ir
from ..ir import loop_vars
from .base import Lazy, View


def _contiguous_loads(e: ir.Expr, var: str, other: str) -> int:
    """How many of ``e``'s direct (non-gather) loads of a matrix — varying along both
    loop variables — read consecutive elements along ``var``. A load constant along one
    of them (a per-row scale, a bias) reads well in either order and has no say."""
    return sum(1 for x in ir.walk(e) if isinstance(x, ir.Load) and not x.gather
               and abs(x.index.coef(var)) == 1 and x.index.coef(other) != 0)


def reads_transposed(box: Lazy) -> bool:
    """Whether more of ``box``'s loads run contiguously along its dim -2 than along its
    dim -1 (then it is stored transposed)."""
    sizes = tuple(int(s) for s in box.sizes)
    if len(sizes) < 2 or sizes[-1] <= 1 or sizes[-2] <= 1:
        return False
    idx = loop_vars(sizes)
    row, col = idx[-2].terms[0][0], idx[-1].terms[0][0]
    e = box.load(idx)
    return _contiguous_loads(e, row, col) > _contiguous_loads(e, col, row)


def store_for_library(lo, box, origin: str):
    """``box`` (a library product's operand, not a window) stored in the order its reads
    run; the view of it the library reads. None when that order is its own (the caller
    stores it as usual)."""
    if not isinstance(box, Lazy) or box.layout is not None or not reads_transposed(box):
        return None
    n = len(box.sizes)
    perm = list(range(n - 2)) + [n - 1, n - 2]           # stored dim j is box dim perm[j]
    sizes = tuple(int(s) for s in box.sizes)

    def body(idx):
        orig = [None] * n
        for j, d in enumerate(perm):
            orig[d] = idx[j]
        return box.load(orig)
    stored = lo.realize(Lazy(tuple(sizes[d] for d in perm), box.dtype, body), origin=origin)
    strides = [0] * n
    for j, d in enumerate(perm):
        strides[d] = stored.strides[j]
    return View(stored.buf, sizes, tuple(strides), stored.offset, box.dtype)
