"""Errors eager raises from values, kept: an op whose eager kernel raises for some
arguments is lowered only where those arguments cannot occur; elsewhere it declines
(``Unsupported``) and runs as the aten op itself, which raises as eager does.

One rule per op, wrapped around its lowering (``LOWERINGS``), so that every lowering
of a family (``remainder``'s, ``floor_divide``'s...) keeps the same check.
"""
from __future__ import annotations

import torch
from .base import LOWERINGS, Unsupported, is_box

aten = torch.ops.aten


def _integral(dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool


def _integer_divisor(lo, node, a, b, *rest, **kw):
    """Integer division on the CPU raises ZeroDivisionError for a zero divisor; a
    kernel cannot raise. Lowered: a nonzero constant divisor, or float division, or
    the GPU (whose eager kernels do not raise either)."""
    if lo.target != "cpp" or not _integral(lo.out_meta(node).dtype):
        return
    if kw.get("rounding_mode", rest[0] if rest else "floor") is None:
        return                          # true division: a float result
    if is_box(b) or b == 0:
        raise Unsupported("K0207", "integer division by a tensor or by zero: eager raises "
                          "ZeroDivisionError for a zero divisor")


def _integer_negative_power(lo, node, a, b, *rest, **kw):
    """An integer tensor to a negative integer scalar power raises in eager."""
    if (is_box(a) and _integral(a.dtype) and isinstance(b, int)
            and not isinstance(b, bool) and b < 0):
        raise Unsupported("K0207", "integers to negative integer powers raise in eager")


CHECKS = {
    **{op: _integer_divisor for op in (
        aten.floor_divide.default, aten.remainder.Tensor, aten.remainder.Scalar,
        aten.fmod.Tensor, aten.fmod.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)},
    aten.pow.Tensor_Scalar: _integer_negative_power,
}


def _checked(lower, check):
    def checked(lo, node, *args, **kwargs):
        check(lo, node, *args, **kwargs)
        return lower(lo, node, *args, **kwargs)
    checked.__doc__ = lower.__doc__
    return checked


for _op, _check in CHECKS.items():
    if _op in LOWERINGS:
        LOWERINGS[_op] = _checked(LOWERINGS[_op], _check)
