"""Pointwise lowerings: unary and binary math, comparisons, ``where``, clamps,
activations, casts and tensor creation (``full``, ``zeros``, ``arange``…)."""

from __future__ import annotations

import math

import torch

from ... import config
from ..ir import Index
from ..ops import cast, const, op
from .base import Lazy, as_expr, pointwise, promote, register

aten = torch.ops.aten


_UNARY = {
    aten.abs.default: "abs", aten.neg.default: "neg", aten.exp.default: "exp",
    aten.exp2.default: "exp2", aten.expm1.default: "expm1", aten.log.default: "log",
    aten.log2.default: "log2", aten.log10.default: "log10", aten.log1p.default: "log1p",
    aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt", aten.sin.default: "sin",
    aten.cos.default: "cos", aten.tan.default: "tan", aten.tanh.default: "tanh",
    aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.asin.default: "asin",
    aten.acos.default: "acos", aten.atan.default: "atan", aten.asinh.default: "asinh",
    aten.acosh.default: "acosh", aten.atanh.default: "atanh", aten.erf.default: "erf",
    aten.sigmoid.default: "sigmoid", aten.floor.default: "floor", aten.ceil.default: "ceil",
    aten.round.default: "round", aten.trunc.default: "trunc", aten.sign.default: "sign",
    aten.reciprocal.default: "reciprocal",
}
_FLOAT_ONLY = {"floor", "ceil", "round", "trunc"}


def _unary(name):
    def lower(lo, node, x):
        if name in _FLOAT_ONLY and not x.dtype.is_floating_point:
            return pointwise(lo, node, [x], lambda a: a)
        if name == "abs" and x.dtype == torch.bool:
            return pointwise(lo, node, [x], lambda a: a)
        return pointwise(lo, node, [x], lambda a: op(name, a))
    return lower


for _t, _n in _UNARY.items():
    register(_t)(_unary(_n))


@register(aten.bitwise_not.default)
def _bitwise_not(lo, node, x):
    if x.dtype == torch.bool:
        return pointwise(lo, node, [x], lambda a: op("not", a))
    return pointwise(lo, node, [x], lambda a: op("bitnot", a))


@register(aten.logical_not.default)
def _logical_not(lo, node, x):
    return pointwise(lo, node, [x], lambda a: op("not", cast(a, torch.bool)), x.dtype)


@register(aten.isnan.default)
def _isnan(lo, node, x):
    if not x.dtype.is_floating_point:
        return pointwise(lo, node, [x], lambda a: const(False, torch.bool), x.dtype)
    return pointwise(lo, node, [x], lambda a: op("isnan", a), x.dtype)


@register(aten.isinf.default)
def _isinf(lo, node, x):
    if not x.dtype.is_floating_point:
        return pointwise(lo, node, [x], lambda a: const(False, torch.bool), x.dtype)
    return pointwise(lo, node, [x], lambda a: op("isinf", a), x.dtype)


@register(aten.relu.default)
def _relu(lo, node, x):
    if config.inject_bug == "relu_accuracy":      # the minifier's test knob (kiln/debug/inject.py)
        return pointwise(lo, node, [x], lambda a: op("add", op("maximum", a, const(0, a.dtype)),
                                                     const(1, a.dtype)))
    return pointwise(lo, node, [x], lambda a: op("maximum", a, const(0, a.dtype)))


def _plus_scaled(x, y, alpha):
    """``x + alpha * y`` as eager's add kernels round it: one fused multiply-add for
    floats (their compilers contract it, on the CPU and on CUDA)."""
    if alpha == 1:
        return op("add", x, y)
    if y.dtype.is_floating_point:
        return op("fma", y, const(alpha, y.dtype), x)
    return op("add", x, op("mul", y, const(alpha, y.dtype)))


@register(aten.add.Tensor, aten.add.Scalar)
def _add(lo, node, a, b, alpha=1):
    return pointwise(lo, node, [a, b], lambda x, y: _plus_scaled(x, y, alpha))


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(lo, node, a, b, alpha=1):
    if alpha == 1:
        return pointwise(lo, node, [a, b], lambda x, y: op("sub", x, y))
    return pointwise(lo, node, [a, b], lambda x, y: _plus_scaled(x, y, -alpha))


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(lo, node, a, b, alpha=1):                      # b - alpha * a
    if alpha == 1:
        return pointwise(lo, node, [a, b], lambda x, y: op("sub", y, x))
    return pointwise(lo, node, [a, b], lambda x, y: _plus_scaled(y, x, -alpha))


def _binary(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y))
    return lower


for _t, _n in {aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "truediv",
               aten.div.Scalar: "truediv", aten.maximum.default: "maximum",
               aten.minimum.default: "minimum", aten.pow.Tensor_Tensor: "pow",
               aten.pow.Scalar: "pow",
               aten.atan2.default: "atan2", aten.remainder.Tensor: "remainder",
               aten.remainder.Scalar: "remainder", aten.fmod.Tensor: "fmod",
               aten.fmod.Scalar: "fmod", aten.bitwise_and.Tensor: "bitand",
               aten.bitwise_or.Tensor: "bitor", aten.bitwise_xor.Tensor: "bitxor",
               aten.bitwise_and.Scalar: "bitand", aten.bitwise_or.Scalar: "bitor",
               aten.bitwise_xor.Scalar: "bitxor", aten.floor_divide.default: "floordiv"}.items():
    register(_t)(_binary(_n))


#: Exponents eager's pow kernels (CPU and CUDA) compute with a cheaper formula than
#: ``pow`` for floating tensors; each rounds differently from ``pow`` in the last place,
#: so kiln uses the same formula to give eager's bits (RMS-norm backward in T5/Llama
#: squares and takes ``** -0.5`` / ``** -1.5``).
_POW_FORMULAS = {
    2.0: lambda x: op("mul", x, x),
    3.0: lambda x: op("mul", op("mul", x, x), x),
    0.5: lambda x: op("sqrt", x),
    -0.5: lambda x: op("rsqrt", x),
    -1.0: lambda x: op("reciprocal", x),
    -2.0: lambda x: op("reciprocal", op("mul", x, x)),
}


@register(aten.pow.Tensor_Scalar)
def _pow_tensor_scalar(lo, node, a, b):
    formula = None
    if lo.out_meta(node).dtype.is_floating_point and isinstance(b, (int, float)) \
            and not isinstance(b, bool):
        formula = _POW_FORMULAS.get(float(b))
    if formula is not None:
        return pointwise(lo, node, [a], formula)
    return pointwise(lo, node, [a, b], lambda x, y: op("pow", x, y))


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(lo, node, a, b, rounding_mode=None):
    name = {None: "truediv", "floor": "floordiv", "trunc": "truncdiv"}[rounding_mode]
    return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y))


def _compare(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y), promote(a, b))
    return lower


for _t, _n in {aten.eq.Tensor: "eq", aten.eq.Scalar: "eq", aten.ne.Tensor: "ne",
               aten.ne.Scalar: "ne", aten.lt.Tensor: "lt", aten.lt.Scalar: "lt",
               aten.le.Tensor: "le", aten.le.Scalar: "le", aten.gt.Tensor: "gt",
               aten.gt.Scalar: "gt", aten.ge.Tensor: "ge", aten.ge.Scalar: "ge"}.items():
    register(_t)(_compare(_n))


def _logical(name):
    def lower(lo, node, a, b):
        return pointwise(lo, node, [a, b], lambda x, y: op(name, x, y), torch.bool)
    return lower


for _t, _n in {aten.logical_and.default: "and", aten.logical_or.default: "or",
               aten.logical_xor.default: "xor"}.items():
    register(_t)(_logical(_n))


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(lo, node, c, a, b):
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype

    def body(idx):
        return op("where", as_expr(c, idx, sizes, torch.bool), as_expr(a, idx, sizes, dtype),
                  as_expr(b, idx, sizes, dtype))
    return Lazy(sizes, dtype, body)


@register(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default,
          aten.clamp_max.default, aten.clamp_min.Tensor, aten.clamp_max.Tensor)
def _clamp(lo, node, x, lo_=None, hi=None):
    if node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo_, hi = None, lo_
    inputs = [x] + [v for v in (lo_, hi) if v is not None]

    def f(a, *bounds):
        bounds = list(bounds)
        if lo_ is not None:
            a = op("maximum", a, bounds.pop(0))
        if hi is not None:
            a = op("minimum", a, bounds.pop(0))
        return a
    return pointwise(lo, node, inputs, f)


@register(aten.hardtanh.default)
def _hardtanh(lo, node, x, min_val=-1.0, max_val=1.0):
    return pointwise(lo, node, [x], lambda a: op("minimum", op("maximum", a, const(min_val, a.dtype)),
                                                 const(max_val, a.dtype)))


@register(aten.leaky_relu.default)
def _leaky_relu(lo, node, x, slope=0.01):
    return pointwise(lo, node, [x], lambda a: op(
        "where", op("gt", a, const(0, a.dtype)), a, op("mul", a, const(slope, a.dtype))))


@register(aten.gelu.default)
def _gelu(lo, node, x, approximate="none"):
    def f(a):
        c = lambda v: const(v, a.dtype)
        if approximate == "tanh":
            inner = op("mul", c(math.sqrt(2 / math.pi)),
                       op("add", a, op("mul", c(0.044715), op("mul", a, op("mul", a, a)))))
            return op("mul", op("mul", c(0.5), a), op("add", c(1), op("tanh", inner)))
        return op("mul", op("mul", c(0.5), a),
                  op("add", c(1), op("erf", op("mul", a, c(1 / math.sqrt(2))))))
    return pointwise(lo, node, [x], f)


@register(aten._to_copy.default)
def _to_copy(lo, node, x, dtype=None, layout=None, device=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    return pointwise(lo, node, [x], lambda a: a, x.dtype)


@register(aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _clone(lo, node, x, memory_format=None):
    if node.target is aten.alias.default:
        return x
    return pointwise(lo, node, [x], lambda a: a)


@register(aten.full.default)
def _full(lo, node, size, value, **kw):
    m = lo.out_meta(node)
    return Lazy(tuple(m.shape), m.dtype, lambda idx: const(value, m.dtype))


@register(aten.full_like.default)
def _full_like(lo, node, x, value, **kw):
    return _full(lo, node, None, value)


@register(aten.scalar_tensor.default)
def _scalar_tensor(lo, node, value, **kw):
    return _full(lo, node, None, value)


@register(aten.zeros.default, aten.zeros_like.default, aten.empty.memory_format,
          aten.empty_like.default, aten.empty_strided.default)
def _zeros(lo, node, *a, **kw):
    return _full(lo, node, None, 0)


@register(aten.ones.default, aten.ones_like.default)
def _ones(lo, node, *a, **kw):
    return _full(lo, node, None, 1)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(lo, node, *args, **kw):
    nums = [a for a in args if isinstance(a, (int, float))]
    if node.target is aten.arange.default:
        start, step = 0, 1
    elif node.target is aten.arange.start:
        start, step = nums[0], 1
    else:
        start, step = nums[0], (nums[2] if len(nums) > 2 else kw.get("step", 1))
    m = lo.out_meta(node)
    dt = m.dtype

    def body(idx):
        i = Index(idx[0])
        if dt.is_floating_point or isinstance(start, float) or isinstance(step, float):
            return op("add", const(start, dt), op("mul", cast(i, dt), const(step, dt)))
        return cast(op("add", const(start, torch.int64), op("mul", i, const(step, torch.int64))), dt)
    return Lazy(tuple(m.shape), dt, body)


# --- views --------------------------------------------------------------------------------
