"""Shape lowerings: permutes, expands, squeezes, slices, splits, reshapes, ``cat`` and
padding, as index arithmetic on a box (a copy only where strides cannot say it)."""

from __future__ import annotations

import torch

from ..ir import Affine, Index
from ..ops import cast, const, op
from .recompute import only_stored_readers
from .reindex import reshape_lazy
from .base import Lazy, Unsupported, View, add_mask, affine_view, is_box, norm_dim, register, squeeze

aten = torch.ops.aten


@register(aten.permute.default)
def _permute(lo, node, x, dims):
    n = len(x.sizes)
    dims = [norm_dim(d, n) for d in dims]

    def remap(idx):
        out = [None] * n
        for j, d in enumerate(dims):
            out[d] = idx[j]
        return out
    return affine_view(x, [x.sizes[d] for d in dims], remap)


@register(aten.transpose.int)
def _transpose(lo, node, x, d0, d1):
    n = len(x.sizes)
    perm = list(range(n))
    if n:
        d0, d1 = norm_dim(d0, n), norm_dim(d1, n)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return _permute(lo, node, x, perm)


@register(aten.t.default)
def _t(lo, node, x):
    return _transpose(lo, node, x, 0, 1) if len(x.sizes) == 2 else x


@register(aten.expand.default)
def _expand(lo, node, x, size, implicit=False):
    out = tuple(lo.out_meta(node).shape)
    nd = len(x.sizes)
    off = len(out) - nd

    def remap(idx):
        return [Affine.c(0) if int(x.sizes[i]) == 1 and out[off + i] != 1 else idx[off + i]
                for i in range(nd)]
    return affine_view(x, out, remap)


@register(aten.unsqueeze.default)
def _unsqueeze(lo, node, x, dim):
    dim = norm_dim(dim, len(x.sizes) + 1)
    sizes = list(x.sizes)
    sizes.insert(dim, 1)
    return affine_view(x, sizes, lambda idx: idx[:dim] + idx[dim + 1:])


@register(aten.slice.Tensor)
def _slice(lo, node, x, dim=0, start=None, end=None, step=1):
    n = len(x.sizes)
    dim = norm_dim(dim, n)
    size = x.sizes[dim]
    start = slice(start, end, step).indices(size)[0]
    length = int(lo.out_meta(node).shape[dim])

    def remap(idx):
        out = list(idx)
        out[dim] = idx[dim] * step + start
        return out
    sizes = list(x.sizes)
    sizes[dim] = length
    return affine_view(x, sizes, remap)


@register(aten.select.int)
def _select(lo, node, x, dim, index):
    n = len(x.sizes)
    dim = norm_dim(dim, n)
    index = index + x.sizes[dim] if index < 0 else index
    sizes = list(x.sizes)
    del sizes[dim]
    return affine_view(x, sizes, lambda idx: idx[:dim] + [Affine.c(index)] + idx[dim:])


register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)(squeeze)


@register(aten.split.Tensor, aten.split_with_sizes.default)
def _split(lo, node, x, split, dim=0):
    dim = norm_dim(dim, len(x.sizes))
    metas = lo.out_meta(node)
    out, start = [], 0
    for m in metas:
        length = int(m.shape[dim])

        def remap(idx, s=start):
            o = list(idx)
            o[dim] = idx[dim] + s
            return o
        out.append(affine_view(x, tuple(m.shape), remap))
        start += length
    return out


def _split_remap(in_sizes, out_sizes):
    """The index map of a reshape that only splits dims (``[B*S, V]`` to ``[B, S, V]``):
    each input index is an affine sum of the output indices it was split into. A lazy
    value is then reshaped without being stored (a loss gradient goes on, in the same
    kernel, into its cast and its padded copy); None for a reshape that merges dims
    (``reindex.reshape_lazy`` then tries the value's own reads)."""
    ins, outs = [int(s) for s in in_sizes], [int(s) for s in out_sizes]
    if 0 in ins or 0 in outs:
        return None
    groups, j = [], 0
    for s in ins:
        group, p = [], 1
        while p < s and j < len(outs):
            group.append(j)
            p *= outs[j]
            j += 1
        if p != s:
            return None
        groups.append(group)
    if any(s != 1 for s in outs[j:]):
        return None

    def remap(idx):
        out = []
        for group in groups:
            e, scale = Affine.c(0), 1
            for k in reversed(group):
                e = e + idx[k] * scale
                scale *= outs[k]
            out.append(e)
        return out
    return remap


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(lo, node, x, size):
    sizes = tuple(lo.out_meta(node).shape)
    if tuple(x.sizes) == sizes:
        return x
    # only size-1 dims added or removed: an affine map
    src = [(i, s) for i, s in enumerate(x.sizes) if s != 1]
    dst = [(j, s) for j, s in enumerate(sizes) if s != 1]
    if [s for _, s in src] == [s for _, s in dst]:
        def remap(idx):
            out = [Affine.c(0)] * len(x.sizes)
            for (i, _), (j, _) in zip(src, dst):
                out[i] = idx[j]
            return out
        return affine_view(x, sizes, remap)
    if isinstance(x, Lazy) and x.layout is None:
        split = _split_remap(x.sizes, sizes)
        if split is not None:
            return affine_view(x, sizes, split)
        merged = None if only_stored_readers(lo, node) else reshape_lazy(x, sizes)
        if merged is not None:           # merged dims whose reads stay affine
            return merged
    v = lo.realize(x, origin=node.name)
    base = torch.empty_strided(v.sizes, v.strides, dtype=v.dtype, device="meta")
    try:
        r = base.view(sizes)
    except RuntimeError:
        v = lo.realize(Lazy(v.sizes, v.dtype, v.load), origin=node.name)   # contiguous copy
        base = torch.empty_strided(v.sizes, v.strides, dtype=v.dtype, device="meta")
        r = base.view(sizes)
    return View(v.buf, sizes, tuple(r.stride()), v.offset, v.dtype)


@register(aten.cat.default)
def _cat(lo, node, tensors, dim=0):
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    parts = [t for t in tensors if is_box(t) and not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    if not parts:
        raise Unsupported("K0206", "empty cat")
    dim = norm_dim(dim, len(sizes))

    def body(idx):
        pos = Index(idx[dim])
        offsets, start = [], 0
        for t in parts:
            offsets.append(start)
            start += t.sizes[dim]
        result = None
        for t, s in reversed(list(zip(parts, offsets))):
            sub = list(idx)
            sub[dim] = idx[dim] + (-s)
            e = cast(t.load(sub), dtype)
            if result is None:
                result = add_mask(e, op("ge", pos, const(s, torch.int64))) if s else e
                continue
            cond = op("lt", pos, const(s + t.sizes[dim], torch.int64))
            mask = cond if s == 0 else op("and", op("ge", pos, const(s, torch.int64)), cond)
            result = op("where", cond, add_mask(e, mask), result)
        return result
    return Lazy(sizes, dtype, body)


@register(aten.constant_pad_nd.default)
def _pad(lo, node, x, pad, value=0):
    """Padding by ``value``; a negative pad crops instead (only index arithmetic)."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    n = len(sizes)

    def body(idx):
        sub, conds = list(idx), []
        for k in range(len(pad) // 2):
            d = n - 1 - k
            before, after = pad[2 * k], pad[2 * k + 1]
            sub[d] = idx[d] + (-before)
            pos = Index(idx[d])
            if before > 0:
                conds.append(op("ge", pos, const(before, torch.int64)))
            if after > 0:
                conds.append(op("lt", pos, const(before + x.sizes[d], torch.int64)))
        if not conds:
            return cast(x.load(sub), dtype)
        cond = conds[0]
        for c in conds[1:]:
            cond = op("and", cond, c)
        return op("where", cond, add_mask(x.load(sub), cond), const(value, dtype))
    return Lazy(sizes, dtype, body)


# --- reductions ---------------------------------------------------------------------------
