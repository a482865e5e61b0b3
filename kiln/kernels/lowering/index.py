"""Lowerings of indexing by tensors: ``embedding``, ``index.Tensor`` (one or several
index tensors), ``index_select``, ``gather`` and ``repeat`` — gathers, written as loads
with an indirect term (``ir.Load.gather``): ``buf[affine index + value * stride]``.
They fuse like any load: the embedding lookup of a transformer becomes part of the
kernel that adds the position embeddings.

Eager raises on an out-of-range index. So does kiln: each index tensor first goes
through ``IndexCheck`` (on the CPU the exception eager raises there, ``index_error``;
a device-side assert on a GPU, nothing to synchronise in a CUDA graph), and the loads
themselves are masked to the valid range so that no kernel ever reads outside its
buffer.

``index_select`` is a one-tensor index; ``slice_scatter`` (a slice assignment,
functionalized) is an affine choice between two loads (a gather term when it has a
step); ``repeat`` reads its tiled dims at ``i % size``. The writes by computed position
— ``index_put`` (the backward of indexing), ``scatter_add`` / ``scatter`` /
``scatter_reduce`` (a sum including self) and ``embedding_dense_backward`` — are each
an ``ir.Scatter`` built by ``scatter_buffer``, except a scatter with one index per line
along its dim (``nll_loss``'s backward), which is pointwise; other reductions of
``scatter_reduce`` and an embedding gradient scaled by frequency still fall back.
"""
from __future__ import annotations

import dataclasses
import re

import torch

from .. import ir
from .base import (Lazy, Unsupported, View, as_expr, norm_dim, add_mask, affine_view,
                       is_box, register)
from ..ops import cast, const, op, within
from .reindex import concrete, gather_lazy

aten = torch.ops.aten
_I64 = torch.int64
INDEX_DTYPES = {torch.int64, torch.int32}
#: What a Triton scatter may accumulate with ``tl.atomic_add`` (half precision
#: accumulates in a float32 copy: atomics in it would round at every repeat).
_ATOMIC_DTYPES = {torch.float32, torch.float64, torch.int32}
_HALF = {torch.float16, torch.bfloat16}


#: The exception eager raises on the CPU for an out-of-range index: IndexError but for
#: these ops...
_RUNTIME_ERROR_OPS = {aten.gather.default, aten.scatter_add.default, aten.scatter_reduce.two,
                      aten.scatter.src, aten.scatter.value}
#: ...and but for a node decomposed from one of these calls (its ``meta["source"]``,
#: the torch-level node's name): the error is the call's own (``index_add`` decomposes
#: to ``index_put``, ``nll_loss`` to ``gather``).
_ERROR_OF_CALL = {"index_add": RuntimeError, "index_add_": RuntimeError,
                  "nll_loss": IndexError, "nll_loss2d": IndexError,
                  "cross_entropy": IndexError}


def index_error(node, dim=None) -> type:
    """The exception eager raises for an out-of-range index at ``node`` (``dim``: the
    indexed dim of an ``index_select``, whose CPU kernel checks dim 1 of a tensor of
    several dims apart, raising RuntimeError)."""
    call = re.sub(r"_\d+$", "", str(node.meta.get("source", "")))
    if call in _ERROR_OF_CALL:
        return _ERROR_OF_CALL[call]
    if node.target is aten.index_select.default and dim == 1:
        return RuntimeError
    return RuntimeError if node.target in _RUNTIME_ERROR_OPS else IndexError


class IndexCheck:
    """``(index) -> a copy of it``, after checking every value is in range, as eager
    does: on the CPU raising the exception eager raises there (``error``), on a GPU by
    ``torch._assert_async`` (a device-side assert, as eager's; nothing to synchronise
    in a CUDA graph). (A copy: the result is a library result with its own memory, as
    the runtime assumes of externs.)"""

    def __init__(self, size: int, allow_negative: bool, what: str, error: type = IndexError):
        self.size, self.allow_negative, self.what = int(size), allow_negative, what
        self.error = error

    def __call__(self, idx):
        if idx.numel():
            low = -self.size if self.allow_negative else 0
            ok = ((idx >= low) & (idx < self.size)).all()
            msg = f"{self.what}: index out of range for a dimension of size {self.size}"
            if idx.device.type == "cpu":
                if not ok:
                    raise self.error(msg)
            else:
                torch._assert_async(ok, msg)
        return torch.empty(idx.shape, dtype=idx.dtype, device=idx.device).copy_(idx)

    def __repr__(self):
        return f"index_check({self.size})"


def _checked(lo, node, index, size, allow_negative, dim=None) -> View:
    if not is_box(index) or index.dtype not in INDEX_DTYPES:
        raise Unsupported("K0205", "index tensor of this dtype")
    v = index if isinstance(index, View) else lo.realize(index, origin=node.name)
    name = lo.new_name()
    strides = ir.contiguous_strides(tuple(v.sizes))
    lo.add(ir.Extern(name, tuple(v.sizes), strides, v.dtype,
                     op=IndexCheck(size, allow_negative, str(node.target),
                                     index_error(node, dim)),
                     args=(ir.ExternArg(v.buf, tuple(v.sizes), tuple(v.strides), v.offset),),
                     origin=node.name))
    return View(name, tuple(v.sizes), strides, 0, v.dtype)


def stored(lo, node, x) -> View:
    if not is_box(x):
        raise Unsupported("K0205", "not a tensor")
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
    w = stored(lo, node, weight)
    if len(w.sizes) != 2:
        raise Unsupported("K0205", "embedding weight of rank != 2")
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
    if len(pos) == 1:
        return _index_dim(lo, node, x, pos[0], indices[pos[0]], True)
    if not pos:
        raise Unsupported("K0205", "no index tensor")
    return _index_many(lo, node, x, pos, [indices[i] for i in pos])


def _index_many(lo, node, x, pos, indices):
    """``x[..., i0, ..., i1, ...]`` with several index tensors: they broadcast together
    into the dims B; the result has B in place of the indexed dims when these are
    adjacent, else B first (numpy's rule). One load with a gather term per index."""
    xv = stored(lo, node, x)
    if not xv.sizes:
        raise Unsupported("K0205", "index of a 0-d tensor")
    ixs = [_checked(lo, node, t, int(xv.sizes[d]), True) for d, t in zip(pos, indices)]
    sizes, position, _, _ = _advanced_indexing(tuple(xv.sizes), pos, ixs)
    m = lo.out_meta(node)
    if tuple(m.shape) != sizes:
        raise Unsupported("K0205", "result shape differs from the advanced-indexing rule")

    def body(idx):
        index, mask, terms = position(idx, xv.strides, xv.offset)
        return ir.Load(xv.buf, index, xv.dtype, mask, terms)
    return Lazy(sizes, xv.dtype, body)


def _advanced_indexing(xsizes, pos, ixs):
    """The shape of ``x[indices]`` (index tensors ``ixs`` at dims ``pos``); a function
    from an index of that shape, and a layout of x (strides, offset), to the position
    it names in x: (affine part, in-range mask, gather terms); and where the index
    tensors' broadcast dims lie in that shape (first, count)."""
    try:
        bshape = tuple(torch.broadcast_shapes(*[tuple(v.sizes) for v in ixs]))
    except RuntimeError:
        raise Unsupported("K0205", "index tensors that do not broadcast") from None
    nb = len(bshape)
    rest = [d for d in range(len(xsizes)) if d not in pos]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    before = [d for d in rest if d < first] if adjacent else []
    after = [d for d in rest if d not in before]
    sizes = (tuple(xsizes[d] for d in before) + bshape + tuple(xsizes[d] for d in after))

    def position(idx, strides, offset):
        bidx = list(idx[len(before):len(before) + nb])
        own = dict(zip(before, idx[:len(before)]))
        own.update(zip(after, idx[len(before) + nb:]))
        index = ir.Affine.c(offset)
        for d, i in own.items():
            index = index + i * strides[d]
        terms, mask = [], None
        for d, ix in zip(pos, ixs):
            k = len(ix.sizes)
            sub = [ir.Affine.c(0) if int(ix.sizes[j]) == 1 else bidx[nb - k + j]
                   for j in range(k)]
            n = int(xsizes[d])
            e = cast(ix.load(sub), _I64)
            e = op("where", op("lt", e, const(0, _I64)), op("add", e, const(n, _I64)), e)
            ok = within(e, 0, n)
            mask = ok if mask is None else op("and", mask, ok)
            terms.append((e, strides[d]))
        return index, mask, tuple(terms)
    return sizes, position, len(before), nb


@register(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put(lo, node, x, indices, values, accumulate=False):
    """``x`` with ``values`` written (or, ``accumulate``, added) at ``x[indices]``: an
    ``ir.Scatter`` — a copy of x, then a serial loop over the indexed positions. The
    backward of indexing (``new_zeros`` + accumulate) is most of what the zoo's
    transformers fell back on. On the GPU the writes are atomics (``codegen/triton/scatter.py``)."""
    sizes = _scatter_target(lo, node, accumulate)
    if not is_box(x):
        raise Unsupported("K0205", "index_put into a non-tensor")
    pos = [i for i, t in enumerate(indices) if t is not None]
    if not pos or any(t is not None and not is_box(t) for t in indices):
        raise Unsupported("K0205", "no index tensor")
    if any(t.dtype not in INDEX_DTYPES for t in (indices[d] for d in pos)):
        raise Unsupported("K0205", "boolean or other non-integer index")
    ixs = [_checked(lo, node, indices[d], sizes[d], True) for d in pos]
    rsizes, position, bstart, nb = _advanced_indexing(sizes, pos, ixs)
    if is_box(values):
        try:
            if tuple(torch.broadcast_shapes(tuple(values.sizes), rsizes)) != rsizes:
                raise Unsupported("K0205", "values do not broadcast to the indexed shape")
        except RuntimeError:
            raise Unsupported("K0205", "values do not broadcast to the indexed shape") from None

    def dest(out, ivars):
        index, mask, terms = position(ivars, out.strides, 0)
        return ir.Load(out.buf, index, out.dtype, mask, terms)
    # the dims of x not indexed map one to one to its coordinates: parallel in C++
    own = tuple(i for i in range(len(rsizes)) if not bstart <= i < bstart + nb)
    return scatter_buffer(lo, node, x, rsizes, dest, values, accumulate, own)


def _scatter_target(lo, node, accumulate) -> tuple:
    """The output sizes of a scatter lowering, after declining what its target cannot
    run: a 0-d or bool accumulation, and on Triton an empty one (no launch of zero
    programs) or a dtype ``tl.atomic_add`` lacks. Called before any buffer is added."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(int(s) for s in m.shape), m.dtype
    if not sizes or (accumulate and dtype == torch.bool):
        raise Unsupported("K0205", "a scatter into a 0-d tensor, or accumulating bools")
    if lo.target != "cpp" and (accumulate and _work_dtype(lo, dtype, accumulate)
                               not in _ATOMIC_DTYPES or 0 in sizes):
        raise Unsupported("K0208", "Triton accumulates float32/64 and int32 only (atomics), "
                          "and launches no empty grid")
    return sizes


def _work_dtype(lo, dtype, accumulate):
    """Half precision accumulates in a float32 copy on Triton, rounded once at the end,
    as eager's CUDA kernels sum repeated positions in float before one write (a bf16
    embedding's gradient); atomics in half precision would round at every repeat (as
    eager's ``scatter_add`` does on the GPU: kiln's sum is within one rounding of the
    exact one, eager's not always)."""
    return torch.float32 if lo.target != "cpp" and accumulate and dtype in _HALF else dtype


def scatter_buffer(lo, node, init, iter_sizes, dest, value, accumulate, parallel_dims):
    """The ``ir.Scatter`` every scatter lowering builds: the output (``lo.out_meta``)
    starts as ``init`` (a box of its shape, or a scalar); then, for each index of
    ``iter_sizes`` in order, ``value`` (a box broadcasting to ``iter_sizes``, or a
    scalar) is stored or added at ``dest(out, index)``, a ``Load`` of ``out`` (a View
    of the buffer) used as the address. Returns the output box."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(int(s) for s in m.shape), m.dtype
    if lo.target != "cpp" and 0 in iter_sizes:
        raise Unsupported("K0206", "an empty scatter (no Triton launch of zero programs)")
    wdt = _work_dtype(lo, dtype, accumulate)
    strides = ir.contiguous_strides(sizes)
    out = View(lo.new_name(), sizes, strides, 0, wdt)
    ivars = list(ir.loop_vars(iter_sizes))
    lo.add(ir.Scatter(out.buf, sizes, strides, wdt,
                      init=as_expr(init, list(ir.loop_vars(sizes)), sizes, wdt),
                      iter_sizes=tuple(iter_sizes), dest=dest(out, ivars),
                      value=as_expr(value, ivars, iter_sizes, wdt),
                      accumulate=bool(accumulate), parallel_dims=tuple(parallel_dims),
                      origin=node.name))
    if wdt == dtype:
        return out
    return Lazy(sizes, dtype, lambda idx: cast(out.load(idx), dtype))


@register(aten.scatter_add.default, aten.scatter_reduce.two, aten.scatter.src,
          aten.scatter.value)
def _scatter_dim(lo, node, x, dim, index, src, reduce="sum", include_self=True):
    """``x`` with ``src[i]`` added (``scatter_add``; ``scatter_reduce`` with "sum" over
    ``x`` itself) or stored (``scatter``) at ``i`` with coordinate ``dim`` replaced by
    ``index[i]``, for every position i of ``index`` (smaller than ``src`` maybe). The
    other coordinates map one to one (the C++ loop runs those before ``dim`` in
    parallel), and each element receives its writes in the order of ``dim``, as in
    eager's CPU loop — and in its sorted path, taken for an expanded index: the sort
    is stable."""
    accumulate = node.target in (aten.scatter_add.default, aten.scatter_reduce.two)
    if reduce != "sum" or not include_self:
        raise Unsupported("K0205", "scatter_reduce other than a sum including self")
    sizes = _scatter_target(lo, node, accumulate)
    if not is_box(index) or len(index.sizes) != len(sizes):
        raise Unsupported("K0205", "a 0-d index or one of another rank")
    d = norm_dim(dim, len(sizes))
    ix = _checked(lo, node, index, sizes[d], False)
    rsizes = tuple(int(n) for n in ix.sizes)
    if rsizes[d] == 1 and all(rsizes[k] == sizes[k] for k in range(len(sizes)) if k != d):
        return _one_hot_scatter(lo, node, x, d, ix, src, accumulate, sizes)

    def dest(out, ivars):
        return _gather_load(out, ivars, d, cast(ix.load(ivars), _I64), sizes[d])
    return scatter_buffer(lo, node, x, rsizes, dest, src, accumulate,
                    [k for k in range(len(sizes)) if k != d])


def _one_hot_scatter(lo, node, x, d, ix, src, accumulate, sizes):
    """A scatter with one index per line along ``d`` (the index has size 1 there and the
    output's size in every other dim) writes each output element at most once, so it
    is pointwise: ``where(position == index, value, x)`` (``x + value`` when adding).
    ``nll_loss``'s backward is one: a -1 per row of a [tokens, vocabulary] zeros. As an
    ``ir.Scatter`` that is a buffer of the logits' size, written twice and read again
    by the log-softmax backward; pointwise, it fuses into that backward's kernels and
    is never stored (gpt2's training step: 500 MB less at its peak)."""
    dtype = lo.out_meta(node).dtype

    def body(idx):
        line = list(idx)
        line[d] = ir.Affine.c(0)
        hit = op("eq", ir.Index(idx[d]), cast(ix.load(line), _I64))
        old = as_expr(x, list(idx), sizes, dtype)
        new = as_expr(src, line, tuple(ix.sizes), dtype)
        return op("where", hit, op("add", old, new) if accumulate else new, old)
    return Lazy(sizes, dtype, body)


@register(aten.embedding_dense_backward.default)
def _embedding_dense_backward(lo, node, grad, indices, num_weights, padding_idx,
                              scale_grad_by_freq):
    """The gradient of an embedding's weight: ``grad`` rows added at the rows
    ``indices`` name, but for ``padding_idx`` — and, as in eager's CPU kernel, for
    indices out of range (it raises nothing). Eager's CPU kernel adds the rows in index
    order, as the C++ loop does; its GPU kernel sums a row's repeats in float before
    one write, as ``scatter_buffer`` does for half precision.
    Scaling by frequency would need the counts first: it falls back."""
    if scale_grad_by_freq:
        raise Unsupported("K0205", "scale_grad_by_freq")
    if not (is_box(grad) and is_box(indices)) or indices.dtype not in INDEX_DTYPES:
        raise Unsupported("K0205", "non-tensor gradient, or indices of a non-index dtype")
    sizes = _scatter_target(lo, node, True)
    rsizes = tuple(int(n) for n in grad.sizes)
    if rsizes[:-1] != tuple(int(n) for n in indices.sizes):
        raise Unsupported("K0205", "gradient not of the indices' shape and one feature dim")

    def dest(out, ivars):
        e = cast(indices.load(ivars[:-1]), _I64)
        load = _gather_load(out, [None, ivars[-1]], 0, e, sizes[0])
        keep = op("and", load.mask, op("ne", e, const(int(padding_idx), _I64)))
        return dataclasses.replace(load, mask=keep)
    return scatter_buffer(lo, node, 0, rsizes, dest, grad, True, [len(rsizes) - 1])


@register(aten.index_select.default)
def _index_select(lo, node, x, dim, index):
    if not is_box(x) or not x.sizes:
        raise Unsupported("K0205", "index_select of a 0-d tensor")
    d = norm_dim(dim, len(x.sizes))
    return _index_dim(lo, node, x, d, index, False, d if len(x.sizes) > 1 else None)


def _index_dim(lo, node, x, d, index, allow_negative, error_dim=None):
    """``x`` with dim ``d`` replaced by the dims of ``index`` (its values pick along d)."""
    xv = stored(lo, node, x)
    n = int(xv.sizes[d])
    ix = _checked(lo, node, index, n, allow_negative, error_dim)
    k = len(ix.sizes)
    m = lo.out_meta(node)
    sizes = tuple(xv.sizes[:d]) + tuple(ix.sizes) + tuple(xv.sizes[d + 1:])
    if tuple(m.shape) != sizes:
        raise Unsupported("K0205", "result shape differs from the one-index-tensor rule")

    def body(idx):
        e = cast(ix.load(list(idx[d:d + k])), _I64)
        e = op("where", op("lt", e, const(0, _I64)), op("add", e, const(n, _I64)), e)
        src = list(idx[:d]) + [None] + list(idx[d + k:])
        return _gather_load(xv, src, d, e, n)
    return Lazy(sizes, xv.dtype, body)


@register(aten.gather.default)
def _gather(lo, node, x, dim, index, sparse_grad=False):
    lazy = _gather_from_lazy(lo, node, x, dim, index)
    if lazy is not None:
        return lazy
    xv = stored(lo, node, x)
    if not xv.sizes:
        raise Unsupported("K0205", "gather from a 0-d tensor")
    d = norm_dim(dim, len(xv.sizes))
    n = int(xv.sizes[d])
    ix = _checked(lo, node, index, n, False)
    m = lo.out_meta(node)

    def body(idx):
        e = cast(ix.load(list(idx)), _I64)
        return _gather_load(xv, list(idx), d, e, n)
    return Lazy(tuple(m.shape), xv.dtype, body)


def _gather_from_lazy(lo, node, x, dim, index):
    """A gather of no more elements than a lazy ``x`` has reads ``x`` where it picks,
    unstored (a loss picking each row's target from fp32 logits cast from bf16);
    None: ``x`` is stored first."""
    m = lo.out_meta(node)
    sizes = concrete(x.sizes) if isinstance(x, Lazy) else None
    if not sizes or m.numel() > ir.numel_of(sizes):
        return None
    d = norm_dim(dim, len(sizes))
    n = sizes[d]
    read = gather_lazy(x, d, lambda e: within(e, 0, n))
    if read is None:
        return None
    ix = _checked(lo, node, index, n, False)
    return Lazy(tuple(m.shape), x.dtype,
                lambda idx: cast(read(list(idx), cast(ix.load(list(idx)), _I64)), x.dtype))


@register(aten.slice_scatter.default)
def _slice_scatter(lo, node, x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``src`` written over ``x[start:end:step]`` along ``dim`` (an in-place
    slice assignment, functionalized): a pointwise choice, ``src`` read at an affine
    index. With a step (swin's patch merging: ``x[..., 1::2, 0::2, :]``) the position
    in ``src`` is ``(i - start) // step``, not affine: a gather term on the stored
    ``src``, read where ``i - start`` is a multiple of the step."""
    if not (is_box(x) and is_box(src)) or step < 1:
        raise Unsupported("K0205", "slice_scatter of a non-tensor or with a step below 1")
    n = len(x.sizes)
    d = norm_dim(dim, n)
    size = int(x.sizes[d])
    start = 0 if start is None else (start + size if start < 0 else start)
    start = min(max(start, 0), size)
    length = int(src.sizes[d])
    m = lo.out_meta(node)
    dtype = m.dtype
    if step != 1:
        return _strided_slice_scatter(lo, node, x, src, d, start, length, step, dtype)

    def body(idx):
        inside = within(ir.Index(idx[d]), start, start + length)
        sub = list(idx)
        sub[d] = idx[d] + (-start)
        return op("where", inside, cast(add_mask(src.load(sub), inside), dtype),
                  cast(x.load(list(idx)), dtype))
    return Lazy(tuple(m.shape), dtype, body)


def _strided_slice_scatter(lo, node, x, src, d, start, length, step, dtype):
    sv = stored(lo, node, src)

    def body(idx):
        rel = op("sub", ir.Index(idx[d]), const(start, _I64))
        q = op("floordiv", rel, const(step, _I64))
        inside = op("and", within(q, 0, length),
                    op("eq", op("sub", rel, op("mul", q, const(step, _I64))), const(0, _I64)))
        index = ir.Affine.c(sv.offset)
        for k, (i, st) in enumerate(zip(idx, sv.strides)):
            if k != d:
                index = index + i * st
        new = ir.Load(sv.buf, index, sv.dtype, inside, ((q, sv.strides[d]),))
        return op("where", inside, cast(new, dtype), cast(x.load(list(idx)), dtype))
    return Lazy(tuple(lo.out_meta(node).shape), dtype, body)


@register(aten.repeat.default)
def _repeat(lo, node, x, repeats):
    """``x`` tiled ``repeats`` times along each dim (leading new dims first). A dim that
    is not really tiled (repeat 1, or size 1: a broadcast) is a view; a tiled one reads
    ``x`` at ``i % size``, a gather term on the stored ``x``."""
    if not is_box(x):
        raise Unsupported("K0205", "not a tensor")
    out = tuple(lo.out_meta(node).shape)
    nd = len(x.sizes)
    off = len(out) - nd
    tiled = [i for i in range(nd) if int(repeats[off + i]) != 1 and int(x.sizes[i]) != 1]

    def remap(idx):
        return [ir.Affine.c(0) if int(x.sizes[i]) == 1 or i in tiled else idx[off + i]
                for i in range(nd)]
    if not tiled:
        return affine_view(x, out, remap)
    xv = stored(lo, node, x)

    def body(idx):
        base = ir.linear_index(remap(list(idx)), xv.strides) + xv.offset
        terms = tuple((op("remainder", ir.Index(idx[off + i]), const(int(x.sizes[i]), _I64)),
                       xv.strides[i]) for i in tiled)
        return ir.Load(xv.buf, base, xv.dtype, None, terms)
    return Lazy(out, xv.dtype, body)
