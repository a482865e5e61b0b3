"""The size symbols of one trace and the assumptions made about them.

A ``ShapeEnv`` makes a symbol per dynamic size (``s0``, ``s1``… each with its source,
e.g. ``L['x'].size(1)``, its hint and its range; sizes are at least 2 because 0 and 1
are specialised) and answers every question a meta kernel or the user's code asks
about a symbolic size with the hint's answer, keeping that answer as a guard. What the
ranges already decide is not kept; a bound on one symbol narrows its range instead
(printed once, as ``2 <= x.size(0) <= 4096``). Forcing a size to a plain int
specialises it: the symbol is replaced by its value from then on.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import functools

import sympy
import torch

from kiln.shapes.exprs import FloorDiv
from kiln.shapes.node import KilnSymNode


class SpecializedMarkedDim(RuntimeError):
    """The trace fixed a size the user marked dynamic (``kiln.mark_dynamic``)."""


@dataclass
class SymbolInfo:
    symbol: sympy.Symbol
    expr: str          # read at run time, in the entry's namespace (``x.size(1)``)
    pretty: str        # in the user's names (``L['x'].size(1)``)
    hint: int
    lo: int = 2
    hi: object = sympy.oo
    marked: bool = False     # kiln.mark_dynamic: specialising it is an error
    is_int: bool = False     # a Python int argument (not a tensor size)
    specialized_at: str | None = None


@dataclass
class ShapeEnv:
    symbols: dict = field(default_factory=dict)       # Symbol -> SymbolInfo
    guards: list = field(default_factory=list)        # (sympy boolean, where)
    replacements: dict = field(default_factory=dict)  # Symbol (or expression) -> what it equals
    defining: set = field(default_factory=set)         # the guards those replacements rest on
    where: object = None                               # () -> "file:line" of the user's code

    # --- symbols ------------------------------------------------------------------
    def new_symbol(self, expr: str, pretty: str, hint: int, *, lo=2, hi=None, marked=False,
                   is_int=False):
        if is_int:   # a Python int: any value but the specialised 0 and 1
            sym = sympy.Symbol(f"s{len(self.symbols)}", integer=True)
            lo = -sympy.oo if lo is None else lo
        else:
            sym = sympy.Symbol(f"s{len(self.symbols)}", integer=True, positive=True)
            lo = 2 if lo is None else max(lo, 0)
        self.symbols[sym] = SymbolInfo(sym, expr, pretty, hint, lo,
                                       sympy.oo if hi is None else hi, marked, is_int)
        node = KilnSymNode(sym, hint, int, self)
        return torch.SymInt(node)

    def info(self, name: str) -> SymbolInfo | None:
        for s, i in self.symbols.items():
            if s.name == name:
                return i
        return None

    def live_symbols(self):
        return [i for i in self.symbols.values() if i.symbol not in self.replacements]

    # --- answers ------------------------------------------------------------------------
    def decide(self, node: KilnSymNode, file=None, line=None) -> bool:
        expr = self.simplify(node.expr)
        hint = bool(node.hint)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        known = self.static_truth(expr)
        if known is not None and known == hint:
            return known
        self._assume(expr if hint else _negate(expr))
        return hint

    def specialize(self, node: KilnSymNode, file=None, line=None):
        expr = self.simplify(node.expr)
        value = node.hint
        if not (expr.is_Integer or expr.is_Float):
            self._assume(sympy.Eq(expr, value))
        return int(value) if node.pytype is not float else float(value)

    def simplify(self, expr):
        if self.replacements and getattr(expr, "free_symbols", None):
            expr = expr.xreplace(self.replacements)
            if self.replacements and expr.free_symbols & set(self.replacements):
                expr = expr.xreplace(self.replacements)
        if expr.has(sympy.Max, sympy.Min):
            expr = expr.replace(lambda e: isinstance(e, (sympy.Max, sympy.Min)), self._pick)
        return expr

    def _pick(self, e):
        """``max(a, b)`` where the ranges say which is larger: that one."""
        if len(e.args) != 2:
            return e
        a, b = e.args
        b_ = self.bounds(sympy.expand(a - b))
        if b_ is None:
            return e
        if b_[0] >= 0:
            return a if isinstance(e, sympy.Max) else b
        if b_[1] <= 0:
            return b if isinstance(e, sympy.Max) else a
        return e

    def _assume(self, g):
        g = canonical(self.simplify(g))
        if g is sympy.true:
            return
        if isinstance(g, sympy.Eq):
            if self._equate(g):
                return
        if self._narrow(g):
            return
        self.guards.append((g, self.where() if self.where else None))

    def _equate(self, g) -> bool:
        """``s == c`` or ``s == other``: the symbol is replaced from now on (a marked
        one fixed to a constant is the user's error, raised at the end of the trace)."""
        lhs, rhs = g.lhs, g.rhs
        for a, b in ((lhs, rhs), (rhs, lhs)):
            if isinstance(a, sympy.Symbol) and a in self.symbols and (
                    b.is_Integer or (isinstance(b, sympy.Symbol) and b in self.symbols)):
                info = self.symbols[a]
                if b.is_Integer:
                    info.specialized_at = info.specialized_at or (self.where() if self.where else "?")
                    self.replacements[a] = b
                    self.guards.append((g, info.specialized_at))
                    return True
                # two symbols are one: keep the older one
                keep, drop = sorted((a, b), key=lambda s: int(s.name[1:]))
                self.replacements[drop] = keep
                self.guards.append((sympy.Eq(drop, keep), self.where() if self.where else None))
                for s, e in list(self.replacements.items()):
                    self.replacements[s] = e.xreplace({drop: keep})
                return True
        if rhs.is_Integer and lhs.free_symbols and not isinstance(lhs, sympy.Symbol):
            # ``s // 2 == 1``: that expression is 1 from now on (later guards simplify)
            self.replacements[lhs] = rhs
            self.defining.add(g)
            self.guards.append((g, self.where() if self.where else None))
            return True
        return False

    def _narrow(self, g) -> bool:
        """A bound on one symbol (``s0 > 4``) narrows its range."""
        if not isinstance(g, (sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge)):
            return False
        d = sympy.expand(g.lhs - g.rhs)
        syms = d.free_symbols
        if len(syms) != 1:
            return False
        s = next(iter(syms))
        if s not in self.symbols:
            return False
        coeff = d.coeff(s)
        rest = d - coeff * s
        if not (coeff.is_Integer and rest.is_Integer and coeff != 0):
            return False
        # coeff*s + rest  (op)  0
        bound = sympy.Rational(-rest, coeff)
        op = type(g)
        if coeff < 0:
            op = {sympy.Lt: sympy.Gt, sympy.Le: sympy.Ge, sympy.Gt: sympy.Lt, sympy.Ge: sympy.Le}[op]
        info = self.symbols[s]
        if op is sympy.Gt:
            info.lo = max(info.lo, int(sympy.floor(bound)) + 1)
        elif op is sympy.Ge:
            info.lo = max(info.lo, int(sympy.ceiling(bound)))
        elif op is sympy.Lt:
            info.hi = min(info.hi, int(sympy.ceiling(bound)) - 1)
        else:
            info.hi = min(info.hi, int(sympy.floor(bound)))
        return True

    # --- what the ranges decide ---------------------------------------------------------
    def static_truth(self, expr):
        """True or False where the symbols' ranges decide ``expr``; else None."""
        expr = self.simplify(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        if isinstance(expr, sympy.Not):
            t = self.static_truth(expr.args[0])
            return None if t is None else not t
        if isinstance(expr, (sympy.And, sympy.Or)):
            vals = [self.static_truth(a) for a in expr.args]
            if isinstance(expr, sympy.And):
                return False if False in vals else (True if all(v is True for v in vals) else None)
            return True if True in vals else (False if all(v is False for v in vals) else None)
        if not isinstance(expr, sympy.core.relational.Relational):
            return None
        diff = sympy.expand(expr.lhs - expr.rhs)
        for d in (diff, sympy.expand(_floordiv_as_mod(diff)), _factored(diff)):
            b = self.bounds(d)
            t = None if b is None else _decide(type(expr), *b)
            if t is not None:
                return t
        return None

    def bounds(self, e):
        """An interval holding ``e`` over the symbols' ranges, or None if unknown."""
        if e.is_Number:
            return e, e
        if isinstance(e, sympy.Symbol):
            info = self.symbols.get(e)
            return None if info is None else (sympy.sympify(info.lo), sympy.sympify(info.hi))
        if isinstance(e, sympy.Add):
            lo, hi = sympy.Integer(0), sympy.Integer(0)
            for a in e.args:
                b = self.bounds(a)
                if b is None:
                    return None
                lo, hi = lo + b[0], hi + b[1]
            return lo, hi
        if isinstance(e, sympy.Mul):
            lo, hi = sympy.Integer(1), sympy.Integer(1)
            for a in e.args:
                b = self.bounds(a)
                if b is None:
                    return None
                corners = [x * y for x in (lo, hi) for y in b if not _nan_product(x, y)]
                if not corners:
                    return None
                lo, hi = min(corners), max(corners)
            return lo, hi
        if isinstance(e, FloorDiv) and e.args[1].is_Integer and e.args[1] > 0:
            b = self.bounds(e.args[0])
            if b is None:
                return None
            k = e.args[1]
            return sympy.floor(b[0] / k), (sympy.oo if b[1] == sympy.oo else sympy.floor(b[1] / k))
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            b = self.bounds(e.base)
            if b is None or b[0] < 0:
                return None
            return b[0] ** e.exp, b[1] ** e.exp
        if isinstance(e, sympy.Mod) and e.args[1].is_Integer and e.args[1] > 0:
            return sympy.Integer(0), e.args[1] - 1
        if isinstance(e, (sympy.Max, sympy.Min)):
            bs = [self.bounds(a) for a in e.args]
            if any(b is None for b in bs):
                return None
            f = max if isinstance(e, sympy.Max) else min
            return f(b[0] for b in bs), f(b[1] for b in bs)
        return None

    # --- the end of a trace -----------------------------------------------------------
    def check_marks(self):
        for info in self.symbols.values():
            if info.marked and info.specialized_at is not None:
                raise SpecializedMarkedDim(
                    f"{info.pretty} was marked dynamic (kiln.mark_dynamic) but the traced code "
                    f"fixed it to {self.replacements.get(info.symbol, info.hint)} at "
                    f"{info.specialized_at}: remove the mark, or use kiln.maybe_mark_dynamic")

    def final_guards(self):
        """(sympy boolean, where) of every assumption left, ranges first; those the
        final ranges imply dropped."""
        out = []
        for info in self.symbols.values():
            if info.symbol in self.replacements:
                continue
            rels = ([sympy.Le(info.lo, info.symbol)] if info.lo != -sympy.oo else []) + \
                ([sympy.Le(info.symbol, info.hi)] if info.hi != sympy.oo else [])
            if info.is_int:   # 0 and 1 are specialised
                rels += [sympy.Ne(info.symbol, 0), sympy.Ne(info.symbol, 1)]
            if rels:
                out.append((sympy.And(*rels) if len(rels) > 1 else rels[0], None))
        seen, implied = set(), self._implied_definitions()
        for i, (g, where) in enumerate(self.guards):
            if i in implied:
                continue
            if g in self.defining or (isinstance(g, sympy.Eq) and isinstance(g.lhs, sympy.Symbol)
                                      and g.lhs in self.replacements):
                out.append((g, where))      # a specialisation: the one check of that size
                continue
            g2 = self.simplify(g)
            if g2 is sympy.true or g2 in seen or self.static_truth(g2) is True:
                continue
            seen.add(g2)
            out.append((g2, where))
        return out

    def _implied_definitions(self):
        """The ``expr == c`` guards (``s % (s // 2) == 0``) that later ones imply
        (``s // 2 == 1``): a later one is stated after the earlier replacements, so
        never in their terms, but an earlier one may follow from a later one. Walked
        from the last, each one dropped only where those kept (and the symbols'
        replacements) make it true."""
        kept = {s: e for s, e in self.replacements.items() if isinstance(s, sympy.Symbol)}
        implied = set()     # indices into self.guards
        for i in range(len(self.guards) - 1, -1, -1):
            g = self.guards[i][0]
            if g not in self.defining:
                continue
            if g.xreplace(kept) is sympy.true:
                implied.add(i)
            else:
                kept[g.lhs] = g.rhs
        return implied


def _decide(rel, lo, hi):
    """Whether ``d rel 0`` for every ``d`` in [lo, hi]: True, False or None (unknown)."""
    if rel is sympy.Eq:
        return True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
    if rel is sympy.Ne:
        return False if lo == hi == 0 else (True if lo > 0 or hi < 0 else None)
    if rel is sympy.Lt:
        return True if hi < 0 else (False if lo >= 0 else None)
    if rel is sympy.Le:
        return True if hi <= 0 else (False if lo > 0 else None)
    if rel is sympy.Gt:
        return True if lo > 0 else (False if hi <= 0 else None)
    if rel is sympy.Ge:
        return True if lo >= 0 else (False if hi < 0 else None)
    return None


def _nan_product(x, y):
    return (x == 0 and y in (sympy.oo, -sympy.oo)) or (y == 0 and x in (sympy.oo, -sympy.oo))


def _floordiv_as_mod(e):
    """``a // k`` written as ``(a - a % k) / k``: differences of sizes then cancel."""
    return e.replace(lambda x: isinstance(x, FloorDiv) and x.args[1].is_Integer,
                     lambda x: (x.args[0] - sympy.Mod(x.args[0], x.args[1])) / x.args[1])


@functools.lru_cache(maxsize=4096)
def _factored(e):
    """``2*s**2 - s`` as ``s*(2*s - 1)``: a product of ranges bounds it where the sum
    of ranges does not. Memoised: a model's layers ask the same differences of sizes,
    and ``sympy.factor`` is the slowest step of a symbolic capture."""
    try:
        return sympy.factor(e) if e.is_polynomial() and len(e.free_symbols) <= 2 else e
    except Exception:  # noqa: BLE001  (sympy declines some expressions)
        return e


def canonical(g):
    """One spelling per relation: ``4*s0 == 8*(s0 // 2)`` becomes ``s0 % 2 == 0``,
    ``a == b`` and ``b == a`` the same."""
    if isinstance(g, (sympy.Eq, sympy.Ne)):
        d = sympy.expand(g.lhs - g.rhs)
        m = sympy.expand(_floordiv_as_mod(d))
        mods = m.atoms(sympy.Mod)
        if mods and not m.has(FloorDiv) and all(x.args[1].is_Integer for x in mods) and \
                not sympy.sympify(m.xreplace({x: sympy.Integer(0) for x in mods})).free_symbols:
            # only remainders by constants left: 4*s == 8*(s // 2) is s % 2 == 0 (a
            # remainder by a size, s % (s // 2), keeps its ``//``, which a later
            # replacement of ``s // 2`` then finds)
            d = m
        if d.is_Number:
            return type(g)(d, 0)
        _, d = d.primitive()
        const, rest = d.as_coeff_Add()
        if rest.could_extract_minus_sign():
            rest, const = -rest, -const
        terms = sympy.Add.make_args(rest)
        pos = [t for t in terms if not t.could_extract_minus_sign()]
        neg = [-t for t in terms if t.could_extract_minus_sign()]
        return type(g)(sympy.Add(*pos), sympy.Add(*neg) - const)
    return g


def _negate(expr):
    n = sympy.Not(expr)
    return n
