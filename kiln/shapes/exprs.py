"""The sympy functions size arithmetic needs beyond sympy's own: ``FloorDiv`` keeps
``a // b`` exact on integers (``floor(a / b)`` would go through rationals) and prints as
Python's ``//``."""
from __future__ import annotations

import sympy


class FloorDiv(sympy.Function):
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if b == 1:
            return a
        q = a / b
        if q.is_Number:     # 64*s // (16*s) is 4 for every s
            return sympy.floor(q)
        if a == 0:
            return sympy.Integer(0)
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(int(a) // int(b))
        if b.is_Integer and int(b) > 0 and a.is_Mul and a.args[0].is_Integer \
                and int(a.args[0]) % int(b) == 0:   # (4*s) // 2 -> 2*s
            return sympy.Mul(sympy.Integer(int(a.args[0]) // int(b)), *a.args[1:])
        return None


class CeilDiv(sympy.Function):
    is_integer = True

    @classmethod
    def eval(cls, a, b):
        if a.is_Integer and b.is_Integer and b != 0:
            return sympy.Integer(-(-int(a) // int(b)))
        return None
