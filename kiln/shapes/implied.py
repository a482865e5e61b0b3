"""Does a relation between sizes follow from what is already known: the symbols'
ranges and the guards kept so far? A stronger (and slower) test than
``ShapeEnv.static_truth``, for the autograd trace, whose questions must all be
answered by the capture's guards (``autograd/symbolic.py``); an answer of False means
"not shown", never "false".

Two sound arguments, in turn:

* **positivity**: ``d > 0`` (or ``>= 0``, ``== 0``) for ``d`` the difference of the
  two sides, written over ``t = s - lo >= 0`` per symbol, with ``a // k`` as
  ``(a - r) / k`` and ``a % k`` as ``r`` for a remainder ``0 <= r < k``: a polynomial
  whose coefficients are all non-negative (and constant term positive, for ``>``) is so
  for every ``t >= 0`` — at each corner of the remainders' box, where a function
  linear in each remainder has its extremes (``a // b`` by a size ``b >= 1`` of an
  ``a >= 0``: some ``q >= 0``);
* **small values**: a relation over one symbol is checked value by value from the
  symbol's lower bound, skipping values the known guards over that symbol exclude, up
  to a bound past which positivity shows it.
"""
from __future__ import annotations

import itertools

import sympy

from kiln.shapes.exprs import FloorDiv

#: values of one symbol checked one by one before positivity takes over
_SMALL = 64
_MAX_REMAINDERS = 3


def implied(g, env, known=()) -> bool:
    """Whether ``g`` (a sympy boolean over ``env``'s symbols) holds for every size the
    ranges and the ``known`` relations admit (False: not shown)."""
    g = env.simplify(g)
    if g is sympy.true:
        return True
    if g is sympy.false:
        return False
    if env.static_truth(g) is True:
        return True
    solved = _solved(known, env)
    if solved:
        g = env.simplify(g.xreplace(solved))
        if g is sympy.true or env.static_truth(g) is True:
            return True
        if g is sympy.false:
            return False
    lows = {s: i.lo for s, i in env.symbols.items()}
    if _always(g, lows):
        return True
    syms = g.free_symbols
    if len(syms) != 1:
        return False
    (s,) = syms
    lo = lows.get(s)
    if lo is None or lo == -sympy.oo:
        return False
    facts = [k for k in known if k.free_symbols == {s}]
    for v in range(int(lo), int(lo) + _SMALL):
        at = {s: sympy.Integer(v)}
        if all(_truth(k.xreplace(at)) for k in facts) and not _truth(g.xreplace(at)):
            return False
    return _always(g, {**lows, s: int(lo) + _SMALL})


def _solved(known, env) -> dict:
    """Symbols the known equalities give in terms of others: ``s0*s1*s4 == 2*s0*s1*f``
    (positive sizes as common factors) gives ``s4 = 2*f``."""
    out = {}
    for k in known:
        if not isinstance(k, sympy.Eq):
            continue
        d = sympy.factor_terms(sympy.expand(k.lhs - k.rhs))
        for f in sympy.Mul.make_args(d):
            if isinstance(f, sympy.Symbol) and f in env.symbols and env.symbols[f].lo >= 1:
                d = d / f
            elif f.is_Number and f != 0:
                d = d / f
        d = sympy.expand(d)
        for s in sorted(d.free_symbols, key=str):
            if s in out or s not in env.symbols:
                continue
            c = d.coeff(s)
            rest = sympy.expand(d - c * s)
            if c in (1, -1) and s not in rest.free_symbols:
                out[s] = -rest if c == 1 else rest
                break
    # one round of the substitutions into each other, then no symbol defines itself
    out = {s: e.xreplace(out) for s, e in out.items()}
    return {s: e for s, e in out.items() if s not in e.free_symbols}


def _truth(b) -> bool:
    return bool(b) if b in (sympy.true, sympy.false) else False


def _always(g, lows) -> bool:
    if isinstance(g, sympy.And):
        return all(_always(a, lows) for a in g.args)
    if isinstance(g, sympy.Or):
        return any(_always(a, lows) for a in g.args)
    if isinstance(g, sympy.Not):
        inner = g.args[0]
        if not isinstance(inner, sympy.core.relational.Relational):
            return False
        g = inner.negated
    if not isinstance(g, sympy.core.relational.Relational):
        return False
    d = g.lhs - g.rhs
    try:
        if isinstance(g, (sympy.Gt, sympy.StrictGreaterThan)):
            return _nonneg(d, lows, strict=True)
        if isinstance(g, sympy.Ge):
            return _nonneg(d, lows, strict=False)
        if isinstance(g, sympy.Lt):
            return _nonneg(-d, lows, strict=True)
        if isinstance(g, sympy.Le):
            return _nonneg(-d, lows, strict=False)
        if isinstance(g, sympy.Ne):
            return _nonneg(d, lows, strict=True) or _nonneg(-d, lows, strict=True)
        if isinstance(g, sympy.Eq):
            return _zero(d, lows)
    except (TypeError, ValueError, sympy.PolynomialError):
        return False
    return False


def _shifted(d, lows):
    """``d`` over ``t = s - lo``, remainders as variables: (expression, {r: k})."""
    rems: dict = {}

    def rem(a, k):
        key = (a, k)
        if key not in rems:
            rems[key] = sympy.Symbol(f"_r{len(rems)}", integer=True, nonnegative=True)
        return rems[key]

    def const_mod(e):      # c % s for a constant 0 <= c below the symbol's lower bound
        a, b = e.args
        if a.is_Integer and isinstance(b, sympy.Symbol) and b in lows and \
                lows[b] != -sympy.oo and 0 <= int(a) < lows[b]:
            return a
        return e
    d = d.replace(lambda e: isinstance(e, sympy.Mod), const_mod)
    quotients: dict = {}

    def quotient(e):       # a // b, a >= 0 and b >= 1 sizes: some q >= 0
        a, b = e.args
        if e not in quotients:
            if not (_nonneg(a, lows, strict=False) and _nonneg(b - 1, lows, strict=False)):
                return e
            quotients[e] = sympy.Symbol(f"_q{len(quotients)}", integer=True, nonnegative=True)
        return quotients[e]
    d = d.replace(lambda e: isinstance(e, FloorDiv) and not e.args[1].is_Integer, quotient)
    d = d.replace(lambda e: isinstance(e, FloorDiv) and e.args[1].is_Integer and e.args[1] > 0,
                  lambda e: (e.args[0] - rem(e.args[0], e.args[1])) / e.args[1])
    d = d.replace(lambda e: isinstance(e, sympy.Mod) and e.args[1].is_Integer and e.args[1] > 0,
                  lambda e: rem(e.args[0], e.args[1]))
    if d.has(FloorDiv, sympy.Mod, sympy.Max, sympy.Min) or len(rems) > _MAX_REMAINDERS:
        return None
    sub = {}
    for s in d.free_symbols:
        if s.name.startswith(("_r", "_q")):
            continue
        lo = lows.get(s)
        if lo is None or lo == -sympy.oo:
            return None
        sub[s] = sympy.Symbol(f"_t_{s.name}", integer=True, nonnegative=True) + lo
    return sympy.expand(d.xreplace(sub)), {r: k for (a, k), r in rems.items()}


def _corners(d, lows):
    got = _shifted(d, lows)
    if got is None:
        return None
    e, rems = got
    for r in rems:
        if sympy.degree(e, r) > 1:
            return None
    out = []
    for values in itertools.product(*[(0, int(k) - 1) for k in rems.values()]):
        out.append(sympy.expand(e.xreplace(dict(zip(rems, values)))))
    return out


def _nonneg(d, lows, strict) -> bool:
    corners = _corners(d, lows)
    if corners is None:
        return False
    for e in corners:
        if not e.is_polynomial():
            return False
        coeffs = sympy.Poly(e, *sorted(e.free_symbols, key=str)).terms() if e.free_symbols \
            else [((), e)]
        const = sympy.Integer(0)
        for monom, c in coeffs:
            if not c.is_number or c < 0:
                return False
            if not any(monom):
                const = c
        if strict and not const > 0:
            return False
    return True


def _zero(d, lows) -> bool:
    corners = _corners(d, lows)
    return corners is not None and len(corners) == 1 and corners[0] == 0
