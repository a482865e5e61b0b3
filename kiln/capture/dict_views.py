"""``d.keys()``, ``d.values()``, ``d.items()``: live views of a dict Value.

A view reads its dict each time it is used, so a mutation made after the view was
taken shows through it (``len``, iteration, ``in``, set operations and comparisons of
keys and items views), as in Python. At a graph break a view is rebuilt as the same
method called on the rebuilt dict, so it stays live there too.
"""
from __future__ import annotations

import operator

from kiln.capture import values as V
from kiln.capture.errors import Unsupported

_VIEW_TYPES = {"keys": type({}.keys()), "values": type({}.values()), "items": type({}.items())}
# set operators of keys and items views: the result is a set
_SET_OPS = (operator.and_, operator.or_, operator.sub, operator.xor)


@V.kind
class DictViewValue(V.Value):
    def __init__(self, d, kind):
        self.d = d
        self.kind = kind

    def python_type(self):
        return _VIEW_TYPES[self.kind]

    def __len__(self):
        return len(self.d.items)

    def unpack(self, tx):
        items = self.d.items
        if self.kind == "keys":
            return [V.ConstantValue(k) for k in items]
        if self.kind == "values":
            return list(items.values())
        return [V.TupleValue([V.ConstantValue(k), v]) for k, v in items.items()]

    def truth(self, tx):
        return len(self.d.items) > 0

    def contains(self, tx, item):
        from kiln.capture.operators import values_equal

        if self.kind == "keys":
            return _key(item) in self.d.items
        if self.kind == "values":
            return any(values_equal(tx, v, item) for v in list(self.d.items.values()))
        if not isinstance(item, V.TupleValue) or len(item.items) != 2:
            return False
        k, v = item.items
        key = _key(k)
        return key in self.d.items and values_equal(tx, self.d.items[key], v)

    def as_set(self, tx):
        """The view's items as a Python set of constants (keys and items views)."""
        if self.kind == "values":
            raise Unsupported("K0014", "set operations on dict.values()")
        return set(v.const() for v in self.unpack(tx))

    def getattr(self, tx, name):
        if name == "__class__":
            return V.ClassValue(self.python_type())
        if name == "mapping":
            raise Unsupported("K0009", "dict view .mapping")
        return V._container_getattr(self, tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "__len__":
            return V.ConstantValue(len(self.d.items))
        if name == "__contains__":
            return V.ConstantValue(self.contains(tx, args[0]))
        if name == "__iter__":
            from kiln.capture.iterators import get_iter

            return get_iter(tx, self)
        if name == "isdisjoint":
            return V.ConstantValue(self.as_set(tx).isdisjoint(_as_set(tx, args[0])))
        if name == "__reversed__":
            return V.IteratorValue(list(reversed(self.unpack(tx))))
        raise Unsupported("K0019", f"{self.python_type().__name__}.{name}")

    def referenced(self):
        return [self.d]

    def rebuild(self, cg):
        return f"{cg.expr(self.d)}.{self.kind}()"

    def __repr__(self):
        return f"DictView({self.kind}, {self.d!r})"


def _key(v):
    try:
        return v.const()
    except Unsupported:
        raise Unsupported("K0011", "a dict key that is not a constant") from None


def _as_set(tx, v):
    if isinstance(v, DictViewValue):
        return v.as_set(tx)
    if isinstance(v, V.SetValue):
        return v.items
    from kiln.capture.iterators import iterate

    return set(x.const() for x in iterate(tx, v))


@V.rule
def view_binary_op(tx, fn, a, b):
    """``keys_view & other`` and friends (either side a view): a new set."""
    if fn not in _SET_OPS:
        raise Unsupported("K0014", f"operator {fn.__name__} on a dict view")
    return V.SetValue(fn(_as_set(tx, a), _as_set(tx, b)))


@V.rule
def view_compare(tx, fn, a, b):
    """Keys and items views compare as sets; values views only by identity."""
    if any(isinstance(v, DictViewValue) and v.kind == "values" for v in (a, b)):
        from kiln.capture.operators import is_same

        if fn in (operator.eq, operator.ne):
            return V.ConstantValue((fn is operator.eq) == is_same(tx, a, b))
        raise Unsupported("K0014", "ordering dict.values() views")
    if not (_setlike(a) and _setlike(b)):  # CPython: NotImplemented, then identity
        if fn in (operator.eq, operator.ne):
            return V.ConstantValue(fn is operator.ne)
        raise Unsupported("K0014", "ordering a dict view with a non-set")
    return V.ConstantValue(fn(_as_set(tx, a), _as_set(tx, b)))


def _setlike(v):
    if isinstance(v, (DictViewValue, V.SetValue)):
        return True
    return isinstance(v, V.ConstantValue) and isinstance(v.value, (set, frozenset))
