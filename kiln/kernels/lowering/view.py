"""Lowerings of the ops that address storage or write through views: ``as_strided``,
``as_strided_scatter``, ``new_empty_strided`` and the functional ``copy``.

They are what functionalization (``kiln/autograd/trace.py``) leaves of a write into a
view. PyTorch's autograd engine runs one whenever an in-place op hit a view of a tensor
that needs a gradient (``CopySlices``: ghostnet's in-place ReLU on a channel slice,
swin's relative-position tables): ``new_empty_strided`` + ``copy`` + ``as_strided`` +
``clone`` + ``copy`` + ``as_strided_scatter``, all on small gradients, in every
backward. Lowered, they cost nothing: views stay index arithmetic.

``as_strided`` addresses its argument's *storage*, not its values. kiln knows eager's
storage only for a computed value whose eager tensor is its whole storage (offset 0,
dense, nothing else in it): stored at eager's strides, a storage position is then a
buffer position, and the op is a ``View`` (no copy). Anything else — a graph input,
whose real storage the compiled graph never sees; a view into a larger storage — falls
back to aten, which gets its argument in eager's exact layout or fails loudly
(``GraphLowering._in_eager_storage``).

The functional ``copy`` was once lowered onto graph inputs only: lowered everywhere it
gave ghostnet wrong gradients. The cause was memory, not the copy: its result became a
kernel buffer in a reusable memory slot; an ``as_strided`` that fell back returned a
view *into that slot*; the slot's last direct reader was the ``as_strided`` call, so the
scheduler gave the slot to a later buffer while the view was still read (by
``clone`` / ``as_strided_scatter``) — it read the later buffer's values. Buffers a
fallback's result aliases now keep their own slot (``GraphLowering.pinned``), and
``as_strided`` is no longer a fallback here at all; ``copy`` needs no restriction.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import ir
from ..ir import Index, Load
from .base import (STORAGE_OPS, Lazy, Unsupported, View, is_dense, add_mask, is_box,
                       pointwise, register)
from ..ops import cast, const, op, within

aten = torch.ops.aten


def _meta_of_arg(lo, node, i=0):
    a = node.args[i] if len(node.args) > i else None
    return lo.meta.get(a) if isinstance(a, fx.Node) else None


def _whole_storage(m) -> bool:
    """Whether eager's tensor ``m`` is all of its storage: offset 0, dense, and the
    storage holds nothing else. Only then does kiln know where its elements lie."""
    if not isinstance(m, torch.Tensor):
        return False
    return (m.storage_offset() == 0 and is_dense(m)
            and m.untyped_storage().nbytes() == m.numel() * m.element_size())


def _same_strides(sizes, a, b) -> bool:
    """Equal strides, ignoring size-1 dims (their stride addresses nothing)."""
    return all(int(s) == 1 or int(x) == int(y) for s, x, y in zip(sizes, a, b))


def _storage_view(lo, node, x) -> View:
    """``x`` as a ``View`` whose buffer positions are eager's storage positions (offset
    0, eager's strides): stored anew at eager's strides when it is not already."""
    if not is_box(x):
        raise Unsupported("K0205", "not a tensor")
    if isinstance(x, View) and isinstance(lo.by_name.get(x.buf), ir.Input):
        raise Unsupported("K0210", "the storage of a graph input is not known at compile time")
    m = _meta_of_arg(lo, node)
    if not _whole_storage(m):
        raise Unsupported("K0210", "a view into a larger storage")
    if isinstance(x, View) and x.offset == 0 and _same_strides(x.sizes, x.strides, m.stride()):
        return x
    lazy = x if isinstance(x, Lazy) else Lazy(x.sizes, x.dtype, x.load)
    return lo.realize(Lazy(lazy.sizes, lazy.dtype, lazy.fn), strides=tuple(m.stride()),
                      origin=node.name)


def _ready_for_storage_ops(lo, node, box):
    """Store ``box`` at eager's strides now when a storage op reads it: each such reader
    would otherwise store its own copy (``_storage_view`` of a lazy)."""
    m = lo.out_meta(node)
    if not isinstance(box, Lazy) or not _whole_storage(m):
        return box
    if not any(u.op == "call_function" and u.target in STORAGE_OPS and u.args[0] is node
               for u in node.users):
        return box
    return lo.realize(box, strides=tuple(m.stride()), origin=node.name)


def _dense_geometry(size, stride) -> bool:
    """Whether (size, stride) covers a contiguous run of positions once each."""
    if any(int(s) == 0 for s in size):
        return False
    return is_dense(torch.empty_strided(tuple(size), tuple(stride), device="meta"))


@register(aten.copy.default)
def _copy(lo, node, dst, src, non_blocking=False):
    """Functional ``copy``: ``src`` broadcast to ``dst``'s shape, in ``dst``'s dtype.
    ``dst``'s values are not read, so copying into a view is the same pointwise value."""
    m = lo.out_meta(node)
    if (isinstance(src, View) and src.dtype == m.dtype and tuple(src.sizes) == tuple(m.shape)
            and src.offset == 0 and _same_strides(m.shape, src.strides, m.stride())
            and not isinstance(lo.by_name.get(src.buf), ir.Input)):
        return src          # already stored as the copy would be: the same values, no kernel
    out = pointwise(lo, node, [src], lambda a: a)
    if is_dense(m) and tuple(m.stride()) != ir.contiguous_strides(m.shape):
        out = Lazy(out.sizes, out.dtype, out.fn, tuple(m.stride()))
    return _ready_for_storage_ops(lo, node, out)


@register(aten.new_empty_strided.default)
def _new_empty_strided(lo, node, x, size, stride, **kw):
    """Uninitialised memory in eager: zeros here, at the strides asked for (a later
    ``as_strided`` addresses them)."""
    m = lo.out_meta(node)
    layout = tuple(m.stride()) if is_dense(m) else None
    return _ready_for_storage_ops(
        lo, node, Lazy(tuple(m.shape), m.dtype, lambda idx: const(0, m.dtype), layout))


@register(aten.as_strided.default)
def _as_strided(lo, node, x, size, stride, storage_offset=None):
    """A window on ``x``'s storage: a ``View`` of ``x`` stored at eager's strides.
    (Eager checked at trace time that the window lies inside the storage.)"""
    v = _storage_view(lo, node, x)
    off = 0 if storage_offset is None else int(storage_offset)
    return View(v.buf, tuple(int(s) for s in size), tuple(int(s) for s in stride),
                v.offset + off, v.dtype)


def _aligned_window(sizes, strides, size, stride, off):
    """The window (size, stride, off) of a dense storage laid out as (sizes, strides),
    as a box of the tensor's own index when it is one (a slice, select or permute of
    it: each window dim steps along one tensor dim): per tensor dim, (window dim or
    None, first index). None when it is not."""
    match = {}
    for t, (s, st) in enumerate(zip(size, stride)):
        if s == 1:
            continue
        ks = [k for k, (n, kst) in enumerate(zip(sizes, strides))
              if n != 1 and kst == st and k not in match]
        if not ks:
            return None
        match[ks[0]] = t
    starts, rem = {}, off
    for k in sorted(range(len(sizes)), key=lambda k: -strides[k]):
        if sizes[k] == 1:
            starts[k] = 0
            continue
        starts[k], rem = divmod(rem, strides[k])
    if rem != 0:
        return None
    out = []
    for k, n in enumerate(sizes):
        t = match.get(k)
        if starts[k] + (size[t] if t is not None else 1) > n:
            return None
        out.append((t, starts[k]))
    return out


@register(aten.as_strided_scatter.default)
def _as_strided_scatter(lo, node, x, src, size, stride, storage_offset=None):
    """``x`` with ``src`` written over the window (size, stride, offset) of the storage
    of a *clone* of ``x`` (eager's definition): a fresh storage laid out as the result's
    meta says, so ``x`` itself is read by value, at any layout. Three cases, all affine:

    * the window covers the whole storage once (autograd's CopySlices of a whole view):
      the result *is* ``src`` stored at the window's strides, seen at the result's;
    * the window is a box of the result's index (CopySlices of a slice, select or
      permute): a range check per dim, ``src`` read at ``index - start``;
    * the window is a dense run of positions: a range check on the position ``p``,
      ``src`` stored at the window's strides and read at ``p - offset``.
    Other windows (gaps across dims, steps) fall back."""
    if not (is_box(x) and is_box(src)):
        raise Unsupported("K0205", "not a tensor")
    m = lo.out_meta(node)
    if not _whole_storage(m):
        raise Unsupported("K0210", "a result that is not its own storage")
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    off = 0 if storage_offset is None else int(storage_offset)
    out_sizes, out_strides = tuple(int(s) for s in m.shape), tuple(int(s) for s in m.stride())
    dense = _dense_geometry(size, stride)
    n = ir.numel_of(size)
    if not (dense and off == 0 and n == m.numel()):
        box = _aligned_window(out_sizes, out_strides, size, stride, off)
        if box is not None:
            return _scatter_box(lo, node, x, src, box, m)
        if not dense:
            raise Unsupported("K0210", "a window with gaps or steps")
    if isinstance(src, View) and src.offset == 0 and src.dtype == m.dtype \
            and _same_strides(size, src.strides, stride):
        s = src
    else:
        lazy = src if isinstance(src, Lazy) else Lazy(src.sizes, src.dtype, src.load)
        s = lo.realize(Lazy(size, m.dtype, lambda idx: cast(lazy.load(idx), m.dtype)),
                       strides=stride, origin=node.name)
    if off == 0 and n == m.numel():
        whole = View(s.buf, out_sizes, out_strides, s.offset, m.dtype)
        if isinstance(lo.by_name.get(s.buf), ir.Input):
            return Lazy(out_sizes, m.dtype, whole.load)     # a result never aliases an input
        return whole

    def body(idx):
        p = ir.linear_index(idx, out_strides)
        inside = within(Index(p), off, off + n)
        new = Load(s.buf, p + (s.offset - off), m.dtype, inside)
        return op("where", inside, new, cast(x.load(list(idx)), m.dtype))
    return _ready_for_storage_ops(lo, node, Lazy(out_sizes, m.dtype, body, out_strides))


def _scatter_box(lo, node, x, src, box, m):
    """``x`` with ``src`` over a box of its index: per dim k, ``src``'s dim ``box[k][0]``
    from index ``box[k][1]`` on (or just that index, for a dim the window drops)."""
    sizes = tuple(m.shape)
    nsrc = len(src.sizes)

    def body(idx):
        inside, sub = None, [ir.Affine.c(0)] * nsrc
        for k, (t, start) in enumerate(box):
            if sizes[k] == 1:
                continue
            length = int(src.sizes[t]) if t is not None else 1
            c = within(Index(idx[k]), start, start + length)
            inside = c if inside is None else op("and", inside, c)
            if t is not None:
                sub[t] = idx[k] + (-start)
        new = cast(src.load(sub), m.dtype)
        old = cast(x.load(list(idx)), m.dtype)
        if inside is None:
            return new
        return op("where", inside, add_mask(new, inside), old)
    return _ready_for_storage_ops(lo, node, Lazy(sizes, m.dtype, body, tuple(m.stride())))
