"""Loads under a mask that only a discarded lane would fail: read unmasked.

Padding (``constant_pad_nd``) and concatenation lower to ``where(m, value, fill)`` whose
``value`` reads each input under the same mask ``m`` (``Load.mask``), so that lanes of
the padded region read nothing out of bounds. A load whose index does not involve any
loop variable ``m`` tests — a cross-entropy gradient's row max, row sum and target,
read per row while ``m`` bounds the column of a vocabulary padded to a multiple of 8 —
reads the same address on every lane of a row, where ``m`` holds or not: it is in
bounds on all of them. Inside ``value`` its mask changes only lanes that the ``where``
throws away, so it goes. Unmasked and indexed by the row alone, a row-tiled kernel
(``row_tiles``) loads it once a row as a scalar and computes what depends on it (the
log of the row sum, the loss scale's division) once a row, where the masked load was a
block of lanes that all read one address and all repeated that arithmetic (GPT-2's
loss gradient: 1.5 ms, about 5x its bytes' time).

Only masks that are conjunctions of bounds on single loop indices qualify
(``and(ge(index(x), a), lt(index(x), b))``, the pad and cat masks), and only where some
lane satisfies the mask: the address is that of a lane where the mask holds, and so in
bounds, only if such a lane exists. A mask no lane meets (the padding of an empty
tensor: the whole block is fill) guards an address that may be outside the buffer
(``-1``), so it stays.
"""
from __future__ import annotations

import math

from ...ir import Const, Index, Load, Op


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _bounds(mask, sizes) -> dict | None:
    """{variable: (lowest, highest) value meeting ``mask``} over the loop ranges
    ``[0, sizes[i])`` when ``mask`` is a conjunction of comparisons between one loop
    index (``c * x + d``, ``c > 0``) and a constant; None for any other mask."""
    if isinstance(mask, Op) and mask.name == "and":
        out: dict = {}
        for a in mask.args:
            b = _bounds(a, sizes)
            if b is None:
                return None
            for v, (lo, hi) in b.items():
                olo, ohi = out.get(v, (lo, hi))
                out[v] = (max(lo, olo), min(hi, ohi))
        return out
    if not (isinstance(mask, Op) and mask.name in _FLIP and len(mask.args) == 2):
        return None
    (a, b), cmp = mask.args, mask.name
    if isinstance(a, Const) and isinstance(b, Index):
        (a, b), cmp = (b, a), _FLIP[cmp]
    if not (isinstance(a, Index) and isinstance(b, Const)) or len(a.index.terms) != 1:
        return None
    (v, c), d = a.index.terms[0], a.index.const
    if c <= 0 or isinstance(b.value, bool) or not isinstance(b.value, (int, float)):
        return None
    n = int(sizes[int(v[1:])])
    lo, hi = 0, n - 1
    t = b.value - d                       # c * x  cmp  t
    if cmp == "lt":
        hi = min(hi, math.ceil(t / c) - 1)
    elif cmp == "le":
        hi = min(hi, math.floor(t / c))
    elif cmp == "gt":
        lo = max(lo, math.floor(t / c) + 1)
    else:
        lo = max(lo, math.ceil(t / c))
    return {v: (lo, hi)}


def _satisfied_vars(mask, sizes) -> set | None:
    """The loop variables ``mask`` tests, when it is a conjunction of bounds that some
    lane of the loop ranges ``sizes`` meets; None otherwise (another kind of mask, or
    one no lane meets)."""
    b = _bounds(mask, sizes)
    if not b or any(lo > hi for lo, hi in b.values()):
        return None
    return set(b)


def unmask(e, sizes):
    """``e`` (over loop ranges ``sizes``) with each load under a ``where``'s own
    condition read unmasked where its address does not depend on what the condition
    tests and some lane meets the condition (shared parts stay shared)."""
    memo: dict = {}

    def under(x, cond, tested):
        """``x`` (inside ``where(cond, x, ...)``'s value) with loads masked by
        ``cond`` alone, whose index avoids ``tested``, unmasked."""
        key = (id(x), id(cond))
        r = memo.get(key)
        if r is not None:
            return r
        if isinstance(x, Load):
            r = x
            if x.mask == cond and not x.gather and not (x.index.vars() & tested):
                r = Load(x.buf, x.index, x.dtype, None, ())
        elif isinstance(x, Op):
            r = Op(x.name, tuple(under(a, cond, tested) for a in x.args), x.dtype)
        else:
            r = x
        memo[key] = r
        return r

    def go(x):
        key = (id(x), None)
        r = memo.get(key)
        if r is not None:
            return r
        r = x
        if isinstance(x, Op):
            args = tuple(go(a) for a in x.args)
            if x.name == "where":
                tested = _satisfied_vars(args[0], sizes)
                if tested is not None:
                    args = (args[0], under(args[1], args[0], tested), args[2])
            r = x if all(a is b for a, b in zip(args, x.args)) else Op(x.name, args, x.dtype)
        memo[key] = r
        return r
    return go(e)
