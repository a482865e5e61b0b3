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

Only masks made of loop indices and constants qualify (``Index``, ``Const``, ops of
them): a mask that reads memory could depend on anything.
"""
from __future__ import annotations

from ... import ir
from ...ir import Const, Index, Load, Op


def _index_vars(mask) -> set | None:
    """The loop variables ``mask`` tests, or None when it reads memory."""
    out = set()
    for x in ir.walk(mask):
        if isinstance(x, Load):
            return None
        if isinstance(x, Index):
            out |= x.index.vars()
        elif not isinstance(x, (Op, Const)):
            return None
    return out


def unmask(e):
    """``e`` with each load under a ``where``'s own condition read unmasked where its
    address does not depend on what the condition tests (shared parts stay shared)."""
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
                tested = _index_vars(args[0])
                if tested is not None:
                    args = (args[0], under(args[1], args[0], tested), args[2])
            r = x if all(a is b for a, b in zip(args, x.args)) else Op(x.name, args, x.dtype)
        memo[key] = r
        return r
    return go(e)
