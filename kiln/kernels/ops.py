"""The scalar operations of the loop IR, with how each prints in C++ and in Triton.

One row per operation: adding an op means adding a row here (and a lowering that uses
it). Templates take the rendered arguments as ``{0}``, ``{1}``…; ``{t}`` is the C++
type of the result. Float-only helpers (``kiln_expf`` and friends) live in the C++
prelude (``codegen/cpp/prelude.h``).
"""
from __future__ import annotations

import torch

from .ir import Const, Expr, Op

# name: (C++ template, Triton template)
OPS: dict[str, tuple[str, str]] = {
    # arithmetic
    "add": ("({0} + {1})", "({0} + {1})"),
    "sub": ("({0} - {1})", "({0} - {1})"),
    "mul": ("({0} * {1})", "({0} * {1})"),
    "truediv": ("({0} / {1})", "({0} / {1})"),
    "floordiv": ("kiln_floordiv({0}, {1})", "kiln_floordiv({0}, {1})"),
    "truncdiv": ("kiln_truncdiv({0}, {1})", "kiln_truncdiv({0}, {1})"),
    "remainder": ("kiln_remainder({0}, {1})", "kiln_remainder({0}, {1})"),
    "fmod": ("kiln_fmod({0}, {1})", "kiln_fmod({0}, {1})"),
    "neg": ("(-{0})", "(-{0})"),
    "abs": ("kiln_abs({0})", "tl.abs({0})"),
    "maximum": ("kiln_maximum({0}, {1})", "kiln_maximum({0}, {1})"),
    "minimum": ("kiln_minimum({0}, {1})", "kiln_minimum({0}, {1})"),
    "pow": ("kiln_pow({0}, {1})", "kiln_pow({0}, {1})"),
    "atan2": ("std::atan2({0}, {1})", "libdevice.atan2({0}, {1})"),
    "sign": ("kiln_sign({0})", "kiln_sign({0})"),
    "reciprocal": ("({t}(1) / {0})", "(1 / {0})"),
    "fma": ("std::fma({0}, {1}, {2})", "tl.fma({0}, {1}, {2})"),   # {0} * {1} + {2}, one rounding
    # transcendental
    "exp": ("kiln_exp({0})", "tl.exp({0})"),
    "exp2": ("std::exp2({0})", "tl.exp2({0})"),
    "expm1": ("std::expm1({0})", "libdevice.expm1({0})"),
    "log": ("std::log({0})", "tl.log({0})"),
    "log2": ("std::log2({0})", "tl.log2({0})"),
    "log10": ("std::log10({0})", "libdevice.log10({0})"),
    "log1p": ("std::log1p({0})", "libdevice.log1p({0})"),
    "sqrt": ("std::sqrt({0})", "tl.sqrt({0})"),
    "rsqrt": ("({t}(1) / std::sqrt({0}))", "(1 / tl.sqrt({0}))"),
    "sin": ("std::sin({0})", "tl.sin({0})"),
    "cos": ("std::cos({0})", "tl.cos({0})"),
    "tan": ("std::tan({0})", "libdevice.tan({0})"),
    "tanh": ("std::tanh({0})", "libdevice.tanh({0})"),
    "sinh": ("std::sinh({0})", "libdevice.sinh({0})"),
    "cosh": ("std::cosh({0})", "libdevice.cosh({0})"),
    "asin": ("std::asin({0})", "libdevice.asin({0})"),
    "acos": ("std::acos({0})", "libdevice.acos({0})"),
    "atan": ("std::atan({0})", "libdevice.atan({0})"),
    "asinh": ("std::asinh({0})", "libdevice.asinh({0})"),
    "acosh": ("std::acosh({0})", "libdevice.acosh({0})"),
    "atanh": ("std::atanh({0})", "libdevice.atanh({0})"),
    "erf": ("std::erf({0})", "tl.erf({0})"),
    "sigmoid": ("kiln_sigmoid({0})", "tl.sigmoid({0})"),
    "floor": ("std::floor({0})", "tl.floor({0})"),
    "ceil": ("std::ceil({0})", "tl.ceil({0})"),
    "round": ("std::nearbyint({0})", "libdevice.nearbyint({0})"),
    "trunc": ("std::trunc({0})", "libdevice.trunc({0})"),
    # comparisons and logic (bool results)
    "eq": ("({0} == {1})", "({0} == {1})"),
    "ne": ("({0} != {1})", "({0} != {1})"),
    "lt": ("({0} < {1})", "({0} < {1})"),
    "le": ("({0} <= {1})", "({0} <= {1})"),
    "gt": ("({0} > {1})", "({0} > {1})"),
    "ge": ("({0} >= {1})", "({0} >= {1})"),
    "and": ("({0} && {1})", "({0} & {1})"),
    "or": ("({0} || {1})", "({0} | {1})"),
    "xor": ("({0} != {1})", "({0} ^ {1})"),
    "not": ("(!{0})", "({0} == 0)"),
    "isnan": ("({0} != {0})", "({0} != {0})"),
    "isinf": ("kiln_isinf({0})", "kiln_isinf({0})"),
    "bitand": ("({0} & {1})", "({0} & {1})"),
    "bitor": ("({0} | {1})", "({0} | {1})"),
    "bitxor": ("({0} ^ {1})", "({0} ^ {1})"),
    "bitnot": ("kiln_bitnot({0})", "kiln_bitnot({0})"),
    # selection and casts
    "where": ("({0} ? {1} : {2})", "tl.where({0}, {1}, {2})"),
    "cast": ("static_cast<{t}>({0})", "{0}.to({t})"),
}

COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "and", "or", "xor", "not", "isnan", "isinf"}


def op(name: str, *args: Expr, dtype: torch.dtype | None = None) -> Expr:
    """Build an ``Op``; arguments must agree in dtype unless the op is a cast/where."""
    assert name in OPS, name
    if dtype is None:
        dtype = torch.bool if name in COMPARISONS else args[-1].dtype
    return Op(name, tuple(args), dtype)


#: (narrow, wide): every value of ``narrow`` is a value of ``wide``, so casting up and
#: back down gives the value back (autocast's graphs are full of such round trips:
#: a bf16 activation saved, cast to float32 by one op and back to bf16 by the next)
_EXACT_WIDENINGS = frozenset(
    [(n, w) for n, ws in {
        torch.float16: (torch.float32, torch.float64),
        torch.bfloat16: (torch.float32, torch.float64),
        torch.float32: (torch.float64,),
        torch.int8: (torch.int16, torch.int32, torch.int64),
        torch.uint8: (torch.int16, torch.int32, torch.int64),
        torch.int16: (torch.int32, torch.int64),
        torch.int32: (torch.int64,),
    }.items() for w in ws])


def cast(e: Expr, dtype: torch.dtype) -> Expr:
    if e.dtype == dtype:
        return e
    if isinstance(e, Op) and e.name == "cast" and e.args[0].dtype == dtype and \
            (dtype, e.dtype) in _EXACT_WIDENINGS:
        return e.args[0]                 # up and back down: the value itself
    if isinstance(e, Const):
        return const(e.value, dtype)
    if dtype == torch.bool:
        return op("ne", e, const(0, e.dtype))
    return Op("cast", (e,), dtype)


def within(e: Expr, lo: int, hi: int) -> Expr:
    """``lo <= e < hi`` for an integer expression (bounds checks, masks of windows)."""
    return op("and", op("ge", e, const(lo, e.dtype)), op("lt", e, const(hi, e.dtype)))


def const(value, dtype: torch.dtype) -> Const:
    if dtype == torch.bool:
        return Const(bool(value), dtype)
    if dtype.is_floating_point:
        return Const(float(value), dtype)
    return Const(int(value), dtype)
