"""Size guards as Python: each symbol printed as the expression that reads it at run
time (``x.size(1)``) or as the user's name for it (``L['x'].size(1)``)."""
from __future__ import annotations

import sympy
from sympy.printing.str import StrPrinter

_OPS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class _Printer(StrPrinter):
    def __init__(self, names):
        super().__init__()
        self.names = names

    def _print_Symbol(self, s):
        return self.names.get(s, s.name)

    def _operand(self, a):
        """An operand of ``//`` or ``%``: parenthesised unless it is one atom."""
        text = self._print(a)
        return text if a.is_Atom or isinstance(a, (sympy.Mod,)) or type(a).__name__ in (
            "FloorDiv", "CeilDiv") else f"({text})"

    def _print_FloorDiv(self, e):
        return f"({self._operand(e.args[0])} // {self._operand(e.args[1])})"

    def _print_CeilDiv(self, e):
        return f"(-(-{self._operand(e.args[0])} // {self._operand(e.args[1])}))"

    def _print_Mod(self, e):
        return f"({self._operand(e.args[0])} % {self._operand(e.args[1])})"

    def _print_Relational(self, e):
        return f"{self._print(e.lhs)} {_OPS[e.rel_op]} {self._print(e.rhs)}"

    def _print_And(self, e):
        parts = [self._print(a) for a in e.args]
        le = [a for a in e.args if isinstance(a, sympy.Le)]
        if len(e.args) == 2 and len(le) == 2 and le[0].rhs == le[1].lhs:   # a <= s <= b
            return f"{self._print(le[0].lhs)} <= {self._print(le[0].rhs)} <= {self._print(le[1].rhs)}"
        return " and ".join(f"({p})" for p in parts)

    def _print_Or(self, e):
        return " or ".join(f"({self._print(a)})" for a in e.args)

    def _print_Not(self, e):
        return f"not ({self._print(e.args[0])})"

    def _print_Max(self, e):
        return f"max({', '.join(self._print(a) for a in e.args)})"

    def _print_Min(self, e):
        return f"min({', '.join(self._print(a) for a in e.args)})"

    def _print_BooleanTrue(self, e):
        return "True"

    def _print_BooleanFalse(self, e):
        return "False"


def to_python(expr, names: dict) -> str:
    """``expr`` as Python source, symbols replaced by ``names[symbol]``."""
    return _Printer(names).doprint(expr)
