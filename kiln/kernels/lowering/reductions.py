"""Reduction lowerings: sums, products, extrema and their indices, ``any``, means,
variances, softmax, LayerNorm, and ``cumsum`` (an ``ir.Scan``)."""

from __future__ import annotations

import torch

from .. import ir
from ..ir import loop_vars, numel_of
from ..ops import cast, const, op
from .base import Lazy, Unsupported, View, as_expr, is_box, norm_dim, pointwise, reduce, register, squeeze

aten = torch.ops.aten


def _red(red_type):
    def lower(lo, node, x, dim=None, keepdim=False, dtype=None):
        m = lo.out_meta(node)
        return reduce(lo, node, x, dim, keepdim, red_type, m.dtype)
    return lower


register(aten.sum.dim_IntList)(_red("sum"))
register(aten.amax.default)(_red("max"))
register(aten.amin.default)(_red("min"))
register(aten.argmax.default)(_red("argmax"))
register(aten.argmin.default)(_red("argmin"))
register(aten.prod.dim_int)(_red("prod"))


#: The type eager's CPU scans accumulate in (``at::acc_type<T, false>``).
_CPU_ACC = {torch.float32: torch.float64, torch.float64: torch.float64}


@register(aten.cumsum.default)
def _cumsum(lo, node, x, dim, dtype=None):
    """Prefix sums as an ``ir.Scan``, the input cast to the result dtype and summed in
    eager's accumulation type: on the CPU double for float32; on a GPU (``codegen/triton/scan.py``)
    the compute dtype, float32 for half precision."""
    if not is_box(x):
        raise Unsupported("K0205", "cumsum of a scalar")
    m = lo.out_meta(node)
    sizes, odt = tuple(int(s) for s in m.shape), m.dtype
    if not sizes:
        return pointwise(lo, node, [x], lambda a: a)
    if lo.target != "cpp" and any(s == 0 for s in sizes):
        raise Unsupported("K0206", "an empty scan")
    if lo.target == "cpp":
        acc = _CPU_ACC.get(odt, torch.int64 if not odt.is_floating_point else None)
    else:
        acc = odt if odt.is_floating_point else torch.int64
    if acc is None or odt == torch.bool:
        raise Unsupported("K0205", f"cumsum to {odt}")
    d = norm_dim(dim, len(sizes))
    strides = ir.contiguous_strides(sizes)
    idx = loop_vars(sizes)
    b = lo.add(ir.Scan(lo.new_name(), sizes, strides, odt, dim=d, acc_dtype=acc,
                       body=as_expr(x, idx, sizes, odt), origin=node.name))
    return View(b.name, sizes, strides, 0, odt)


@register(aten.sum.default, aten.prod.default, aten.max.default, aten.min.default,
          aten.any.default)
def _full_reduce(lo, node, x, dtype=None):
    kind = {aten.sum.default: "sum", aten.prod.default: "prod", aten.max.default: "max",
            aten.min.default: "min", aten.any.default: "any"}[node.target]
    return reduce(lo, node, x, None, False, kind, lo.out_meta(node).dtype,
                  pre=(lambda e: cast(e, torch.bool)) if kind == "any" else None)


@register(aten.any.dim, aten.any.dims)
def _any(lo, node, x, dim=None, keepdim=False):
    return reduce(lo, node, x, dim, keepdim, "any", torch.bool, pre=lambda e: cast(e, torch.bool))


@register(aten.max.dim, aten.min.dim)
def _max_dim(lo, node, x, dim, keepdim=False):
    kind = "max" if node.target is aten.max.dim else "min"
    vals = reduce(lo, node, x, dim, keepdim, kind, x.dtype)
    idx = reduce(lo, node, x, dim, keepdim, "arg" + kind, torch.int64)
    return (vals, idx)


@register(aten.mean.dim, aten.mean.default)
def _mean(lo, node, x, dim=None, keepdim=False, dtype=None):
    m = lo.out_meta(node)
    s = reduce(lo, node, x, dim, keepdim, "sum", m.dtype)
    red_n = numel_of(x.sizes) // max(1, numel_of(m.shape)) if numel_of(m.shape) else 0
    return Lazy(s.sizes, m.dtype, lambda idx: op("truediv", s.load(idx), const(red_n, m.dtype)))


def _var_parts(lo, node, x, dim, correction, keepdim, dtype):
    n = len(x.sizes)
    dims = list(range(n)) if dim is None or (isinstance(dim, (list, tuple)) and not dim) else \
        ([dim] if isinstance(dim, int) else list(dim))
    red_n = numel_of([x.sizes[norm_dim(d, n)] for d in dims]) if n else 1
    s = reduce(lo, node, x, dims, True, "sum", dtype)
    mean_k = Lazy(s.sizes, dtype, lambda idx: op("truediv", s.load(idx), const(red_n, dtype)))
    sizes = tuple(x.sizes)

    def centred(idx):
        d = op("sub", cast(x.load(idx), dtype), as_expr(mean_k, idx, sizes, dtype))
        return op("mul", d, d)
    sq = reduce(lo, node, Lazy(sizes, dtype, centred), dims, keepdim, "sum", dtype)
    denom = max(red_n - (1 if correction is None else correction), 0)
    var = Lazy(sq.sizes, dtype, lambda idx: op("truediv", sq.load(idx), const(denom, dtype)))
    mean = mean_k if keepdim else squeeze(lo, node, mean_k, [norm_dim(d, n) for d in dims])
    return var, mean


@register(aten.var.correction)
def _var(lo, node, x, dim=None, *, correction=None, keepdim=False):
    return _var_parts(lo, node, x, dim, correction, keepdim, lo.out_meta(node).dtype)[0]


@register(aten.var_mean.correction)
def _var_mean(lo, node, x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_parts(lo, node, x, dim, correction, keepdim, lo.out_meta(node)[0].dtype)
    return (lo.realize(v, origin=node.name), lo.realize(m, origin=node.name))


@register(aten._softmax.default, aten._log_softmax.default)
def _softmax(lo, node, x, dim, half_to_float=False):
    dtype = lo.out_meta(node).dtype
    sizes = tuple(x.sizes)
    mx = reduce(lo, node, x, [dim], True, "max", dtype)

    def shifted(idx):
        return op("sub", cast(x.load(idx), dtype), as_expr(mx, idx, sizes, dtype))
    ex = Lazy(sizes, dtype, lambda idx: op("exp", shifted(idx)))
    s = reduce(lo, node, ex, [dim], True, "sum", dtype)
    if node.target is aten._softmax.default:
        return Lazy(sizes, dtype, lambda idx: op("truediv", ex.load(idx), as_expr(s, idx, sizes, dtype)))
    return Lazy(sizes, dtype, lambda idx: op("sub", shifted(idx),
                                             op("log", as_expr(s, idx, sizes, dtype))))


@register(aten.native_layer_norm.default)
def _layer_norm(lo, node, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """out = (x - mean) * rstd * weight + bias; mean and rstd keep the reduced dims."""
    n = len(x.sizes)
    dims = list(range(n - len(normalized_shape), n))
    dtype = lo.out_meta(node)[0].dtype
    var, mean = _var_parts(lo, node, x, dims, 0, True, dtype)
    mean = lo.realize(mean, origin=node.name)
    rstd = lo.realize(Lazy(var.sizes, dtype, lambda idx: op(
        "rsqrt", op("add", var.load(idx), const(eps, dtype)))), origin=node.name)
    sizes = tuple(x.sizes)

    def body(idx):
        e = op("mul", op("sub", cast(x.load(idx), dtype), as_expr(mean, idx, sizes, dtype)),
               as_expr(rstd, idx, sizes, dtype))
        if weight is not None:
            e = op("mul", e, as_expr(weight, idx, sizes, dtype))
        if bias is not None:
            e = op("add", e, as_expr(bias, idx, sizes, dtype))
        return e
    return (Lazy(sizes, dtype, body), mean, rstd)
