"""Lowerings of indexing by tensors: ``embedding``, ``index.Tensor`` (one index tensor),
``index_select`` and ``gather`` — gathers, written as loads with an indirect term (``ir.Load.gather``):
``buf[affine index + value * stride]``. They fuse like any load: the embedding lookup
of a transformer becomes part of the kernel that adds the position embeddings.

Eager raises on an out-of-range index. So does kiln: each index tensor first goes
through ``IndexCheck`` (``torch._assert_async``: an error on the CPU, a device-side
assert on a GPU, nothing to synchronise in a CUDA graph), and the loads themselves are
masked to the valid range so that no kernel ever reads outside its buffer.

``index_select`` is a one-tensor index; ``slice_scatter`` (a slice assignment,
functionalized) is an affine choice between two loads. Scatters by tensors
(``index_put``, ``scatter_add``, ``embedding_dense_backward``) still fall back.
"""
from __future__ import annotations

import torch

from . import ir
from .lowering import Lazy, Unsupported, View, _dim, add_mask, is_box, register
from .ops import cast, const, op, within

aten = torch.ops.aten
_I64 = torch.int64
INDEX_DTYPES = {torch.int64, torch.int32}


class IndexCheck:
    """``(index) -> a copy of it``, after asserting every value is in range, as eager
    does. (A copy: the result is a library result with its own memory, as the runtime
    assumes of externs.)"""

    def __init__(self, size: int, allow_negative: bool, what: str):
        self.size, self.allow_negative, self.what = int(size), allow_negative, what

    def __call__(self, idx):
        if idx.numel():
            low = -self.size if self.allow_negative else 0
            torch._assert_async(((idx >= low) & (idx < self.size)).all(),
                                f"{self.what}: index out of range for a dimension of size "
                                f"{self.size}")
        return torch.empty(idx.shape, dtype=idx.dtype, device=idx.device).copy_(idx)

    def __repr__(self):
        return f"index_check({self.size})"


def _checked(lo, node, index, size, allow_negative) -> View:
    if not is_box(index) or index.dtype not in INDEX_DTYPES:
        raise Unsupported("index tensor of this dtype")
    v = index if isinstance(index, View) else lo.realize(index, origin=node.name)
    name = lo.new_name()
    strides = ir.contiguous_strides(tuple(v.sizes))
    lo.add(ir.Extern(name, tuple(v.sizes), strides, v.dtype,
                     op=IndexCheck(size, allow_negative, str(node.target)),
                     args=(ir.ExternArg(v.buf, tuple(v.sizes), tuple(v.strides), v.offset),),
                     origin=node.name))
    return View(name, tuple(v.sizes), strides, 0, v.dtype)


def _stored(lo, node, x) -> View:
    if not is_box(x):
        raise Unsupported("not a tensor")
    return x if isinstance(x, View) else lo.realize(x, origin=node.name)


def _gather_load(src: View, idx, d, e, n):
    """``src`` at index ``idx`` with dim ``d`` replaced by the value ``e`` (masked)."""
    index = ir.Affine.c(src.offset)
    for k, (i, st) in enumerate(zip(idx, src.strides)):
        if k != d:
            index = index + i * st
    return ir.Load(src.buf, index, src.dtype, within(e, 0, n), ((e, src.strides[d]),))


@register(aten.embedding.default)
def _embedding(lo, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False,
               sparse=False):
    w = _stored(lo, node, weight)
    if len(w.sizes) != 2:
        raise Unsupported("embedding weight of rank != 2")
    V = int(w.sizes[0])
    ix = _checked(lo, node, indices, V, False)
    m = lo.out_meta(node)

    def body(idx):
        e = cast(ix.load(list(idx[:-1])), _I64)
        return _gather_load(w, [None, idx[-1]], 0, e, V)
    return Lazy(tuple(m.shape), w.dtype, body)


@register(aten.index.Tensor)
def _index(lo, node, x, indices):
    pos = [i for i, t in enumerate(indices) if t is not None]
    if len(pos) != 1:
        raise Unsupported("several index tensors")
    return _index_dim(lo, node, x, pos[0], indices[pos[0]], True)


@register(aten.index_select.default)
def _index_select(lo, node, x, dim, index):
    if not is_box(x) or not x.sizes:
        raise Unsupported("index_select of a 0-d tensor")
    return _index_dim(lo, node, x, _dim(dim, len(x.sizes)), index, False)


def _index_dim(lo, node, x, d, index, allow_negative):
    """``x`` with dim ``d`` replaced by the dims of ``index`` (its values pick along d)."""
    xv = _stored(lo, node, x)
    n = int(xv.sizes[d])
    ix = _checked(lo, node, index, n, allow_negative)
    k = len(ix.sizes)
    m = lo.out_meta(node)
    sizes = tuple(xv.sizes[:d]) + tuple(ix.sizes) + tuple(xv.sizes[d + 1:])
    if tuple(m.shape) != sizes:
        raise Unsupported("result shape differs from the one-index-tensor rule")

    def body(idx):
        e = cast(ix.load(list(idx[d:d + k])), _I64)
        e = op("where", op("lt", e, const(0, _I64)), op("add", e, const(n, _I64)), e)
        src = list(idx[:d]) + [None] + list(idx[d + k:])
        return _gather_load(xv, src, d, e, n)
    return Lazy(sizes, xv.dtype, body)


@register(aten.gather.default)
def _gather(lo, node, x, dim, index, sparse_grad=False):
    xv = _stored(lo, node, x)
    if not xv.sizes:
        raise Unsupported("gather from a 0-d tensor")
    d = _dim(dim, len(xv.sizes))
    n = int(xv.sizes[d])
    ix = _checked(lo, node, index, n, False)
    m = lo.out_meta(node)

    def body(idx):
        e = cast(ix.load(list(idx)), _I64)
        return _gather_load(xv, list(idx), d, e, n)
    return Lazy(tuple(m.shape), xv.dtype, body)


@register(aten.slice_scatter.default)
def _slice_scatter(lo, node, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``src`` written over ``x[start:end]`` along ``dim`` (an in-place slice
    assignment, functionalized): a pointwise choice, ``src`` read at an affine index."""
    if not (is_box(x) and is_box(src)) or step != 1:
        raise Unsupported("slice_scatter with a step")
    n = len(x.sizes)
    d = _dim(dim, n)
    size = int(x.sizes[d])
    start = 0 if start is None else (start + size if start < 0 else start)
    start = min(max(start, 0), size)
    length = int(src.sizes[d])
    m = lo.out_meta(node)
    dtype = m.dtype

    def body(idx):
        inside = within(ir.Index(idx[d]), start, start + length)
        sub = list(idx)
        sub[d] = idx[d] + (-start)
        return op("where", inside, cast(add_mask(src.load(sub), inside), dtype),
                  cast(x.load(list(idx)), dtype))
    return Lazy(tuple(m.shape), dtype, body)
