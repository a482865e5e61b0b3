"""IR values as Triton text: dtypes, constants, indices, loads and stores (``TBody``,
one scope's lines), the compute dtype of narrow floats, and the base of kernels that
compute one buffer alone (``AloneKernel``). Every Triton kernel writer builds on it."""

from __future__ import annotations

import math
import os

import torch

from .... import config
from ... import ir
from ...ir import Affine, Const, Index, Load
from ...ops import OPS
from ...reductions import KINDS
from .. import dim_merge
from ..size_args import constant, divisor, is_lifted, size


TL = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
      torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
      torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
      torch.bool: "tl.int1"}


#: the integer type of each float's width, for constants written as bits
_BITS = {torch.float64: "tl.int64", torch.float32: "tl.int32", torch.float16: "tl.int16",
         torch.bfloat16: "tl.int16"}


def _negative_zero(dtype) -> str:
    """-0.0 of ``dtype``: the integer with only the sign bit set, bit-cast."""
    width = dtype.itemsize * 8
    return f"tl.full([], {-(1 << (width - 1))}, {_BITS[dtype]}).to({TL[dtype]}, bitcast=True)"


# Triton spells a few ops differently from C++ (``and``/``or`` on int1 are bitwise).
_TRITON_OVERRIDES = {
    "expm1": "kiln_expm1({0})", "log1p": "kiln_log1p({0})", "tanh": "kiln_tanh({0})",
    "sinh": "kiln_sinh({0})", "cosh": "kiln_cosh({0})", "tan": "kiln_tan({0})",
    "log10": "kiln_log10({0})", "trunc": "kiln_trunc({0})", "round": "kiln_round({0})",
    "reciprocal": "(1.0 / {0})",
    "rsqrt": "(1.0 / tl.sqrt({0}))",
    "not": "({0} == 0)",
    "cast": "{0}.to({t})",
}


_IEEE = {"truediv": "tl.math.div_rn({0}, {1})", "sqrt": "tl.math.sqrt_rn({0})",
         "rsqrt": "tl.math.div_rn(1.0, tl.math.sqrt_rn({0}))",
         "reciprocal": "tl.math.div_rn(1.0, {0})"}


def tconst(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return f'float("{"-" if v < 0 else ""}inf")'
        return repr(v)
    return repr(int(value))


def tindex(a: Affine) -> str:
    """An affine index as Triton text; its coefficients and offset are sizes
    (``size_args``)."""
    parts = [(v if k == 1 else f"{size(k)}*{v}") for v, k in a.terms]
    if a.const or not parts:
        parts.append(size(a.const))
    return "(" + " + ".join(parts) + ")"


#: Low-precision floats are loaded into float32, computed in float32 and rounded once at
#: the store (what libraries do; Triton's math functions have no bf16/fp16 versions).
_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return _COMPUTE.get(dtype, dtype)


def acc_dtype(n) -> torch.dtype:
    """The dtype of a reduction's accumulator: fixed for the whole loop."""
    acc = KINDS[n.red_type].triton_acc
    if acc is not None:
        return getattr(torch, acc)
    return compute_dtype(n.dtype)


class TBody:
    """One scope's lines. ``two_d``: a reduction kernel's [XBLOCK, RBLOCK] block, where
    loads broadcast naturally (an index without reduced variables loads [XBLOCK, 1]).
    ``mask_of``: the mask of a load by the variables of its index (a row-tiled kernel's
    [ROWS, 1] row values need only the row mask), else ``mask`` guards every load.
    A load at a constant index (a 0-d input) is one scalar load, unmasked: every
    element reads that same address, so it is in bounds wherever any element is."""

    def __init__(self, values, indent, counter, mask, block_vars=(), zero="", two_d=None,
                 memo=None, mask_of=None):
        self.lines, self.memo = [], dict(memo or {})
        self.values, self.indent, self.counter, self.mask = values, indent, counter, mask
        self.block_vars, self.zero = set(block_vars), zero
        self.two_d = two_d          # None, or (xmask, full mask, reduced var names)
        self.mask_of = mask_of

    def ptr(self, buf, index: Affine) -> str:
        """``buf + index``, broadcast to the block when the index is the same for all lanes."""
        p = f"{buf} + {tindex(index)}"
        if self.zero and not (index.vars() & self.block_vars):
            p += f" + {self.zero}"
        return p

    def tmp(self, rhs):
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        self.lines.append(f"{self.indent}{name} = {rhs}")
        return name

    def load_mask(self, index: Affine):
        if self.mask_of is not None:
            return self.mask_of(index.vars())
        if self.two_d is None:
            return self.mask
        xmask, full, rvars = self.two_d
        return full if index.vars() & rvars else xmask

    def address(self, e: Load) -> str:
        """The pointers ``e`` addresses: its buffer plus its affine index plus its
        indirect terms (an int64 value times a stride each)."""
        if self.two_d:
            # a reduction kernel's loads broadcast through their index; a constant one
            # under a mask of its own is made a block so that the row mask can guard it
            p = f"{e.buf} + {tindex(e.index)}" + ("" if e.index.vars() or e.gather else " + xzero")
        else:
            p = self.ptr(e.buf, e.index)
        for v, st in e.gather:
            p += f" + {self.render(v)}.to(tl.int64) * {size(st)}"
        return p

    def render(self, e) -> str:
        if e in self.memo:
            return self.memo[e]
        cdt = compute_dtype(e.dtype)
        if isinstance(e, Const):
            # Triton makes any constant equal to 0 a +0.0, and negates by subtracting
            # from 0 (+0.0 again): -0.0 is written as its bits, the sign bit alone
            neg0 = cdt.is_floating_point and e.value == 0 and math.copysign(1, e.value) < 0
            lifted = constant(e.value, cdt)
            if lifted is not None:        # a size argument, converted as the literal is
                s = self.tmp(f"{lifted}.to({TL[cdt]})")
            else:
                s = self.tmp(_negative_zero(cdt) if neg0 else
                             f"tl.full([], {tconst(e.value, cdt)}, {TL[cdt]})")
        elif isinstance(e, Index):
            if e.index.terms:
                s = self.tmp(f"{tindex(e.index)}.to(tl.int64)")
            else:
                s = self.tmp(f"tl.full([], {e.index.const}, tl.int64)")
        elif isinstance(e, Load):
            if e.buf in self.values and e.mask is None and not e.gather:
                s = self.values[e.buf]
            else:
                # gathered terms vary per element: the full mask
                lm = self.mask if e.gather and self.mask_of else self.load_mask(e.index)
                masks = [m for m in (lm, self.render(e.mask) if e.mask is not None else None)
                         if m]
                mk = f", mask={' & '.join(masks)}, other=0" if masks else ""
                p = f"{e.buf} + {tindex(e.index)}" if scalar_load(e) else self.address(e)
                if self.mask_of is not None and e.mask is not None and self.zero not in p:
                    # a row-tiled kernel's load under a mask of its own (padding along the
                    # row): Triton takes a block mask only with a block of pointers
                    p += f" + {self.zero}"
                s = self.tmp(f"tl.load({p}{'' if scalar_load(e) else mk})")
                if e.dtype == torch.bool:
                    s = self.tmp(f"{s} != 0")
                elif cdt != e.dtype:
                    s = self.tmp(f"{s}.to({TL[cdt]})")
        else:
            tpl = _TRITON_OVERRIDES.get(e.name, OPS[e.name][1])
            if cdt == torch.float32 and e.name in _IEEE:
                tpl = _IEEE[e.name]      # fp32 / and sqrt are approximate on GPUs; fp64 is IEEE
            src = e.args[0].dtype if e.name == "cast" else None
            if e.name == "cast" and cdt != e.dtype:
                tpl = "{0}.to({t}).to(tl.float32)"     # round to the narrow type, then widen
                s = self.tmp(tpl.format(self.render(e.args[0]), t=TL[e.dtype]))
            elif e.name == "cast" and src.is_floating_point and compute_dtype(src) != src:
                # a narrow value is held unrounded in its compute type (ops between
                # loads and stores round once, at the store); an explicit cast out of
                # the narrow type (autocast's ``.float()``) reads it rounded, as eager
                s = self.tmp(f"{self.render(e.args[0])}.to({TL[src]}).to({TL[cdt]})")
            else:
                args = [self.render(a) for a in e.args]
                s = self.tmp(tpl.format(*args, t=TL[cdt]))
        self.memo[e] = s
        return s


def scalar_load(e: Load) -> bool:
    """A load every element makes at one address: a constant index, no gathered terms,
    no mask of its own."""
    return not e.index.vars() and not e.gather and e.mask is None


def store_value(v: str, dtype) -> str:
    return f"{v}.to({TL[dtype]})" if compute_dtype(dtype) != dtype else v


#: the flat indices ``decompose`` divides with ``kiln_udiv`` stay below this (int32
#: lanes; the sum inside the prelude's helper must not wrap 32 bits)
FAST_DIV_LIMIT = 1 << 31


def udiv_magic(d: int) -> tuple:
    """(m, s) with ``x // d == (umulhi(x, m) + x) >> s`` in 32-bit unsigned arithmetic for
    0 <= x < 2**31 and 1 < d < 2**31: s = ceil(log2 d), m = floor(2**32 (2**s - d) / d) + 1
    (Granlund and Montgomery's round-up method; the prelude's ``kiln_udivm`` applies it,
    ``kiln_udiv`` computes it in the kernel)."""
    s = (int(d) - 1).bit_length()
    return ((1 << 32) * ((1 << s) - int(d))) // int(d) + 1, s


def _div(x: str, d: int, fast: bool) -> str:
    """``x // d`` as text: by multiply and shift when ``d`` is a size argument (a
    run-time value the compiler cannot strength-reduce) and ``fast``: the prelude's
    ``kiln_udiv``, which computes the divisor's magic number in the kernel, so the text
    holds only the size argument and a new size changes no text."""
    text = divisor(d)
    if not (fast and is_lifted(text) and d > 1):
        return f"({x} // {text})"
    return f"kiln_udiv({x}, {text})"


def _mod(x: str, d: int, fast: bool) -> str:
    text = divisor(d)
    if not (fast and is_lifted(text) and d > 1):
        return f"{x} % {text}"
    return f"({x} - {_div(x, d, fast)} * {text})"


def decompose(vars_, sizes, flat: str, bound: int | None = None) -> list:
    """Lines recovering each dim's index from a flat one (contiguous order). ``bound``:
    the flat index stays below it (the block's last lane included); below
    ``FAST_DIV_LIMIT``, divisions by size arguments are multiplies and shifts."""
    lines, stride = [], 1
    strides = []
    for s in reversed(sizes):
        strides.append(stride)
        stride *= int(s)
    strides.reverse()
    fast = config.triton_fast_division and bound is not None and bound < FAST_DIV_LIMIT
    for i, (v, s, st) in enumerate(zip(vars_, sizes, strides)):
        if v.terms:
            q = flat if st == 1 else _div(flat, int(st), fast)
            if i:
                q = _mod(q, int(s), fast)
            lines.append(f"{v.terms[0][0]} = {q}")
    return lines


def memory_order(g, sizes, writes) -> list:
    """Dims from outermost to innermost in memory of the group's first stored buffer
    (a channels-last result walks channels fastest, so lanes stay coalesced)."""
    return dim_merge.memory_order(g.nodes, sizes, writes)


#: Triton's own specialisation of integer arguments (read by ``source._read``): a
#: multiple of this is declared so (``tl.multiple_of``), which lets loads under a mask
#: against it, or along rows of a stride of it, be vector loads. A size that is no
#: multiple of 16 but one of ``ROW_DIVISIBILITY`` is declared that: rows of that many
#: bf16/fp16 elements are 16-byte aligned (a padded vocabulary, 50264), so a row-tiled
#: kernel's contiguous columns (``row_tiles.py``) are 16-byte vectors under a mask
#: against it. Each declaration (or none) is a size class of its own.
DIVISIBILITY = 16
ROW_DIVISIBILITY = 8


def declared_multiple(v: int, lifted: bool = True, rows: bool = True) -> int:
    """The multiple a size argument of value ``v`` is declared to be in a kernel's text
    (``source._read``: ``tl.multiple_of``), 1 for none. Not ``lifted`` (a literal),
    Triton knows it whole: its own largest power-of-two factor. ``ROW_DIVISIBILITY``
    only in a row-tiled kernel (``rows``), where it makes rows vectors; elsewhere it
    would only split kernels into more size classes."""
    v = int(v)
    if not lifted:
        return (v & -v) or (1 << 30)
    return next((d for d in (DIVISIBILITY, ROW_DIVISIBILITY)
                 if v % d == 0 and (rows or d == DIVISIBILITY)), 1)


def pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class AloneKernel:
    """Base of the kernel of a buffer computed by a kernel of its own (``Group.alone``:
    ``scatter``, ``scan``): its name and its parameters — the buffers it
    reads, then the one it writes."""

    def __init__(self, gi: int, b):
        self.name, self.b, self.counter = f"kernel{gi}", b, [0]

    def params(self):
        b = self.b
        return sorted(b.reads() - {b.name}) + [b.name], {b.name}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
