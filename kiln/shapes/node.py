"""kiln's SymNode: what ``torch.SymInt`` wraps so that meta kernels compute with sizes
that are sympy expressions.

torch's C++ ``PythonSymNodeImpl`` calls these methods by name (add, mul, floordiv,
eq, guard_bool, wrap_int, ...). Each node is a sympy expression over the trace's size
symbols plus its *hint*, the value it has for the inputs being traced. Every time a
meta kernel or the user's code needs a concrete answer (a bool, an int), the node asks
its ``ShapeEnv``, which answers with the hint and records the assumption as a guard.
"""
from __future__ import annotations

import math
import operator

import sympy

from kiln.shapes.exprs import FloorDiv


def _sympify(v):
    if isinstance(v, bool):
        return sympy.true if v else sympy.false
    return sympy.sympify(v)


#: sympy expressions made by the arithmetic below, by (operation, operands): a model's
#: layers repeat the same shape arithmetic (a LLaMA's dynamic capture makes ~30k), and
#: building one (an ``Eq`` that evaluates, an ``Add`` that sorts) costs far more than a
#: lookup. Expressions are immutable values, so the memo is exact; bounded by clearing.
_EXPRS: dict = {}
_EXPRS_MAX = 1 << 16


def _expr(fn, a, b):
    # the operands' types too: 2 == 2.0 == Integer(2) as keys, not as expressions
    key = (fn, type(a), a, type(b), b)
    try:
        hit = _EXPRS.get(key)
    except TypeError:            # an unhashable operand: made each time
        return fn(a, b)
    if hit is None:
        if len(_EXPRS) >= _EXPRS_MAX:
            _EXPRS.clear()
        hit = _EXPRS[key] = fn(a, b)
    return hit


class KilnSymNode:
    """A sympy expression, its hint and Python type (int, float or bool)."""

    __slots__ = ("expr", "hint", "pytype", "env")

    def __init__(self, expr, hint, pytype, env):
        self.expr = expr
        self.hint = hint
        self.pytype = pytype
        self.env = env

    #: PyTorch's Python helpers (``guard_or_false``…) read these: no torch ShapeEnv
    #: means "a foreign node", which they answer through guard_bool
    shape_env = None

    @property
    def _hint(self):
        return self.hint

    # --- what kind of node --------------------------------------------------------
    def is_int(self):
        return self.pytype is int

    def is_float(self):
        return self.pytype is float

    def is_bool(self):
        return self.pytype is bool

    def is_nested_int(self):
        return False

    def has_hint(self):
        return True

    def is_symbolic(self):
        return True

    def is_constant(self):
        return False

    def maybe_as_int(self):
        if self.pytype is int and self.expr.is_Integer:
            return int(self.expr)
        return None

    def maybe_as_bool(self):
        if self.expr is sympy.true:
            return True
        if self.expr is sympy.false:
            return False
        return None

    def maybe_as_float(self):
        return None

    def nested_int(self):
        return None

    def wrap_int(self, n):
        return KilnSymNode(sympy.Integer(n), n, int, self.env)

    def wrap_float(self, x):
        return KilnSymNode(sympy.Float(x), x, float, self.env)

    def wrap_bool(self, b):
        return KilnSymNode(sympy.true if b else sympy.false, b, bool, self.env)

    def clone(self):
        return self

    def with_hint(self, expr, hint, pytype):
        return KilnSymNode(expr, hint, pytype, self.env)

    def str(self):
        return str(self.expr)

    def _graph_repr(self):
        return str(self.expr)

    def __str__(self):
        return str(self.expr)

    def __repr__(self):
        return f"KilnSymNode({self.expr}, hint={self.hint})"

    # --- concrete answers: each one is an assumption, kept as a guard ----------------
    def guard_bool(self, file=None, line=None):
        return self.env.decide(self, file, line)

    def bool_(self):
        return self.env.decide(self)

    def expect_true(self, file=None, line=None):
        return self.env.decide(self, file, line)

    def guard_size_oblivious(self, file=None, line=None):
        return self.env.decide(self, file, line)

    def guard_or_false(self, file=None, line=None):
        return self.env.decide(self, file, line)

    def guard_or_true(self, file=None, line=None):
        return self.env.decide(self, file, line)

    def statically_known_true(self, file=None, line=None):
        return self.env.static_truth(self.expr) is True

    def guard_int(self, file=None, line=None):
        return self.env.specialize(self, file, line)

    def int_(self):
        return self.env.specialize(self)

    def guard_float(self, file=None, line=None):
        return self.env.specialize(self, file, line)

    # --- arithmetic: a new expression, the hint computed alongside -------------------
    def _bin(self, other, fn, hintfn, pytype=None):
        pt = pytype or (float if float in (self.pytype, other.pytype) else int)
        return KilnSymNode(_expr(fn, self.expr, other.expr), hintfn(self.hint, other.hint),
                           pt, self.env)

    def add(self, o):
        return self._bin(o, operator.add, operator.add)

    def sub(self, o):
        return self._bin(o, operator.sub, operator.sub)

    def mul(self, o):
        return self._bin(o, operator.mul, operator.mul)

    def floordiv(self, o):
        return self._bin(o, FloorDiv, operator.floordiv, int)

    int_floordiv = floordiv

    def mod(self, o):
        return self._bin(o, sympy.Mod, operator.mod, int)

    def truediv(self, o):
        return self._bin(o, lambda a, b: a / b, operator.truediv, float)

    float_truediv = truediv
    int_truediv = truediv

    def pow(self, o):
        return self._bin(o, sympy.Pow, operator.pow)

    pow_by_natural = pow
    float_pow = pow

    def sym_max(self, o):
        return self._bin(o, sympy.Max, max)

    def sym_min(self, o):
        return self._bin(o, sympy.Min, min)

    def eq(self, o):
        return self._bin(o, sympy.Eq, operator.eq, bool)

    def ne(self, o):
        return self._bin(o, sympy.Ne, operator.ne, bool)

    def lt(self, o):
        return self._bin(o, sympy.Lt, operator.lt, bool)

    def le(self, o):
        return self._bin(o, sympy.Le, operator.le, bool)

    def gt(self, o):
        return self._bin(o, sympy.Gt, operator.gt, bool)

    def ge(self, o):
        return self._bin(o, sympy.Ge, operator.ge, bool)

    def sym_and(self, o):
        return self._bin(o, sympy.And, lambda a, b: a and b, bool)

    def sym_or(self, o):
        return self._bin(o, sympy.Or, lambda a, b: a or b, bool)

    def sym_not(self):
        return KilnSymNode(sympy.Not(self.expr), not self.hint, bool, self.env)

    def neg(self):
        return KilnSymNode(-self.expr, -self.hint, self.pytype, self.env)

    def abs(self):
        return KilnSymNode(sympy.Abs(self.expr), abs(self.hint), self.pytype, self.env)

    def ceil(self):
        return KilnSymNode(sympy.ceiling(self.expr), math.ceil(self.hint), int, self.env)

    def floor(self):
        return KilnSymNode(sympy.floor(self.expr), math.floor(self.hint), int, self.env)

    def sym_float(self):
        return KilnSymNode(self.expr, float(self.hint), float, self.env)

    def sym_int(self):
        return KilnSymNode(self.expr, int(self.hint), int, self.env)

    def sym_ite(self, then, other):
        return then if self.bool_() else other

    def sym_sum(self, args):
        """The sum of ``args`` (the receiver is only the node it is asked of)."""
        expr, hint = sympy.Integer(0), 0
        for a in args:
            expr, hint = expr + a.expr, hint + a.hint
        return KilnSymNode(expr, hint, int, self.env)


