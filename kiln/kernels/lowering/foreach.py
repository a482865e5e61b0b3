"""Multi-tensor ops (``_foreach_*``), lowered one tensor at a time.

``_foreach_f(xs, ys, s)`` is ``[f(x, y, s) for x, y in zip(xs, ys)]``. Each element is
lowered by the per-tensor op's own lowering (``PER_TENSOR``: an aten overload, looked up
in ``LOWERINGS`` when the element is lowered) or, where no per-tensor op is lowered
(``addcdiv``, ``addcmul``, ``lerp``: CORE decomposes them), by a formula here. So an
element is a lazy pointwise value like any other, and the engine keeps a foreach
result's elements lazy until their ``getitem`` is read (``register_list``): an
optimizer's chain of list ops then fuses per parameter, its update reading p, g, m, v
once and writing p, m, v once.

Arguments go element by element when they are lists (``Tensor[]``, ``Scalar[]`` in the
schema); a ``Tensor`` or ``Scalar`` argument is shared by every element, except the
``Tensor scalars`` of ``addcdiv``/``addcmul`` (``host_scalars.TENSOR_SCALARS``): a value
per element, element ``i`` reading value ``i`` (``host_scalars.scalar_elements``).
Formulas follow eager's kernels on the device the code runs on: the CPU's per-tensor
kernels (the foreach ops' CPU path) and CUDA's multi-tensor functors associate
differently.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..ops import const, op
from .base import LOWERINGS, Unsupported, is_box, pointwise, register_list
from .host_scalars import TENSOR_SCALARS, scalar_elements

aten = torch.ops.aten


@dataclass(eq=False)
class Element:
    """What a per-tensor lowering sees of element ``i`` of a foreach node: the per-tensor
    op as its target, the foreach node's name (its user line, ``provenance``), and the
    element's own result in the lowering's metadata."""
    target: object
    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    users: dict = field(default_factory=dict)


def _element(lo, node, i, target) -> Element:
    e = Element(target, node.name)
    lo.meta[e] = lo.meta[node][i]
    devices = lo.meta.get((node, "device"))
    lo.meta[e, "device"] = devices[i] if isinstance(devices, (list, tuple)) else devices
    return e


def _per_element(value, i, n):
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise Unsupported("K0205", "foreach lists of different lengths")
        return value[i]
    return value


def _integral(box) -> bool:
    return not box.dtype.is_floating_point


# --- per-tensor formulas for ops CORE decomposes ----------------------------------------
def _scaled(value, e):
    """``value * e``: ``value`` a number, or the expression of a tensor's value."""
    if isinstance(value, (int, float)):
        return e if value == 1 else op("mul", const(value, e.dtype), e)
    return op("mul", value, e)


def _opmath(lo, node):
    """Eager's foreach kernels compute half and bfloat16 in float32 (``opmath_t``), the
    scalar too: a value read from a tensor is not rounded to the tensors' type first."""
    m = lo.meta[node]
    return torch.float32 if m.dtype in (torch.float16, torch.bfloat16) else None


def _with_value(lo, node, operands, value, formula):
    """``formula(*operand exprs, value)`` over ``operands``: ``value`` a number, or a 0-d
    box (a ``Tensor scalars`` element), read as one more operand."""
    if not is_box(value):
        return pointwise(lo, node, operands, lambda *e: formula(*e, value))
    return pointwise(lo, node, operands + [value], lambda *e: formula(*e),
                     compute_dtype=_opmath(lo, node))


def _addcdiv(lo, node, x, t1, t2, value=1):
    """``x + value * t1 / t2``: the CPU kernel computes ``(value * t1) / t2``, CUDA's
    multi-tensor functor ``value * (t1 / t2)``. Integer operands raise in eager."""
    if any(_integral(t) for t in (x, t1, t2)):
        raise Unsupported("K0207", "integer addcdiv raises in eager")
    if lo.target == "cpp":
        return _with_value(lo, node, [x, t1, t2], value, lambda a, b, c, v: op(
            "add", a, op("truediv", _scaled(v, b), c)))
    return _with_value(lo, node, [x, t1, t2], value, lambda a, b, c, v: op(
        "add", a, _scaled(v, op("truediv", b, c))))


def _addcmul(lo, node, x, t1, t2, value=1):
    """``x + value * t1 * t2``: ``fma(value * t1, t2, x)`` on the CPU (eager's kernel as
    its compiler contracts it), ``x + value * (t1 * t2)`` in CUDA's functor."""
    if lo.target == "cpp":
        return _with_value(lo, node, [x, t1, t2], value, lambda a, b, c, v: op(
            "fma", _scaled(v, b), c, a))
    return _with_value(lo, node, [x, t1, t2], value, lambda a, b, c, v: op(
        "add", a, _scaled(v, op("mul", b, c))))


def _lerp(lo, node, x, end, weight):
    """Eager's ``lerp``: ``x + w * (end - x)`` for ``|w| < 0.5``, else
    ``end - (end - x) * (1 - w)``, as one fused multiply-add ``fma(coeff, end - x,
    base)`` (the CPU's vector kernel; CUDA's compiler contracts the same expression)."""
    if any(_integral(t) for t in (x, end)):
        raise Unsupported("K0205", "lerp of integer tensors")

    def f(a, b, *w):
        diff = op("sub", b, a)
        if w:                             # a tensor weight: the branch per element
            wt = w[0]
            small = op("lt", op("abs", wt), const(0.5, wt.dtype))
            coeff = op("where", small, wt, op("sub", wt, const(1, wt.dtype)))
            return op("fma", coeff, diff, op("where", small, a, b))
        w = const(weight, a.dtype)        # rounded to the tensors' type first, as eager
        if abs(weight) < 0.5:
            return op("fma", w, diff, a)
        return op("fma", op("sub", w, const(1, a.dtype)), diff, b)
    tensor_weight = not isinstance(weight, (int, float))
    return pointwise(lo, node, [x, end] + ([weight] if tensor_weight else []), f)


# --- the table ---------------------------------------------------------------------------
def _rows():
    rows = {}

    def add(overload, rule):
        name, _, ov = overload.partition(".")
        packet = getattr(aten, name, None)
        if packet is not None and ov in packet.overloads():
            rows[getattr(packet, ov)] = rule

    for name in ("add", "sub", "mul", "div"):
        for ov in ("List", "Scalar", "ScalarList", "Tensor"):
            add(f"_foreach_{name}.{ov}", getattr(aten, name).Tensor)
    for name, scalar_op in (("maximum", aten.clamp_min.default),
                            ("minimum", aten.clamp_max.default)):
        add(f"_foreach_{name}.List", getattr(aten, name).default)
        add(f"_foreach_{name}.Scalar", scalar_op)
        add(f"_foreach_{name}.ScalarList", scalar_op)
    for name in ("clamp_min", "clamp_max"):
        add(f"_foreach_{name}.List", getattr(aten, name).Tensor)
        add(f"_foreach_{name}.Scalar", getattr(aten, name).default)
        add(f"_foreach_{name}.ScalarList", getattr(aten, name).default)
    add("_foreach_pow.List", aten.pow.Tensor_Tensor)
    add("_foreach_pow.Scalar", aten.pow.Tensor_Scalar)
    add("_foreach_pow.ScalarList", aten.pow.Tensor_Scalar)
    add("_foreach_pow.ScalarAndTensor", aten.pow.Scalar)
    for name in ("abs", "neg", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt",
                 "rsqrt", "reciprocal", "sigmoid", "sign", "sin", "cos", "tan", "tanh",
                 "sinh", "cosh", "asin", "acos", "atan", "erf", "floor", "ceil", "round",
                 "trunc"):
        add(f"_foreach_{name}.default", getattr(aten, name).default)
    add("_foreach_clone.default", aten.clone.default)
    add("_foreach_zero.default", aten.zeros_like.default)
    for ov in ("Scalar", "ScalarList", "Tensor"):
        add(f"_foreach_addcdiv.{ov}", _addcdiv)
        add(f"_foreach_addcmul.{ov}", _addcmul)
        add(f"_foreach_lerp.{ov}", _lerp)
    add("_foreach_lerp.List", _lerp)
    return rows


#: foreach overload -> the per-tensor aten overload (lowered by its own lowering) or a
#: formula ``(lo, node, *element_args)`` of this module
PER_TENSOR = _rows()


def _lower_foreach(lo, node, *args, **kwargs):
    rule = PER_TENSOR[node.target]
    lists = [a for a in list(args) + list(kwargs.values()) if isinstance(a, (list, tuple))]
    n = len(lo.meta[node])
    if not lists or any(len(a) != n for a in lists):
        raise Unsupported("K0205", "foreach lists of different lengths")
    lower = rule if not isinstance(rule, torch._ops.OpOverload) else LOWERINGS.get(rule)
    if lower is None:
        raise Unsupported("K0204", f"no lowering of {rule}")
    if node.target in TENSOR_SCALARS:          # a value per element, not one shared
        args = list(args[:3]) + [scalar_elements(lo, node, args[3], n)]
    out = []
    for i in range(n):
        elem = _element(lo, node, i, rule)
        out.append(lower(lo, elem, *[_per_element(a, i, n) for a in args],
                         **{k: _per_element(v, i, n) for k, v in kwargs.items()}))
    return out


register_list(*PER_TENSOR)(_lower_foreach)
