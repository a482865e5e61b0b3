"""Containers: tuples, named tuples, lists, dicts, sets and fixed iterators; their
methods are tables in ``kiln/capture/containers.py`` (``rules.list_method``…)."""
from __future__ import annotations

import types

from kiln.capture.errors import UserException
from kiln.capture.values.base import Value, kind, rules
from kiln.capture.values.constants import ConstantValue, ExceptionValue
from kiln.capture.values.objects import ClassValue


class BoundContainerMethod(Value):
    """``lst.append`` / ``d.get`` read as an attribute, called later."""

    def __init__(self, owner, name):
        self.owner = owner
        self.name = name

    def python_type(self):
        return types.BuiltinMethodType

    def call(self, tx, args, kwargs):
        return self.owner.call_method(tx, self.name, args, kwargs)


def _container_getattr(self, tx, name):
    t = self.python_type()
    if name == "__class__":
        return ClassValue(t)
    if not hasattr(t, name):
        raise UserException(ExceptionValue(AttributeError, [ConstantValue(
            f"{t.__name__!r} object has no attribute {name!r}")]))
    return BoundContainerMethod(self, name)


class _Sequence(Value):
    mutable = False

    def __init__(self, items, source=None):
        self.items = list(items)
        self.source = source

    def unpack(self, tx):
        return list(self.items)

    def truth(self, tx):
        return len(self.items) > 0

    getattr = _container_getattr

    def is_const(self):
        return all(i.is_const() for i in self.items)

    def __repr__(self):
        return f"{type(self).__name__}({self.items})"


@kind
class TupleValue(_Sequence):
    def python_type(self):
        return tuple

    def const(self):
        return tuple(i.const() for i in self.items)

    def call_method(self, tx, name, args, kwargs):
        return rules.tuple_method(tx, self, name, args, kwargs)


class NamedTupleValue(TupleValue):
    def __init__(self, cls, items, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def const(self):
        return self.cls(*[i.const() for i in self.items])

    def getattr(self, tx, name):
        fields = getattr(self.cls, "_fields", ()) or getattr(self, "fields", ())
        if name in fields:
            return self.items[fields.index(name)]
        if name in ("_replace", "_asdict", "index", "count"):
            return BoundContainerMethod(self, name)
        return rules.wrap_class_attr(tx, self, self.cls, name)


class ListValue(_Sequence):
    mutable = True

    def python_type(self):
        return list

    def const(self):
        return [i.const() for i in self.items]

    def is_const(self):
        return False  # lists are mutable: never folded into a constant

    def call_method(self, tx, name, args, kwargs):
        return rules.list_method(tx, self, name, args, kwargs)


class DictValue(Value):
    """A dict (or OrderedDict) with constant keys; values are Values."""

    mutable = True

    def __init__(self, items: dict, source=None, cls=dict):
        self.items = dict(items)
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls

    def truth(self, tx):
        return len(self.items) > 0

    def unpack(self, tx):
        return [ConstantValue(k) for k in self.items]

    def call_method(self, tx, name, args, kwargs):
        return rules.dict_method(tx, self, name, args, kwargs)

    def getitem(self, tx, k):
        """``d[k]`` (subclasses with their own item protocol override this)."""
        key = k.const()
        if key not in self.items:
            raise UserException(ExceptionValue(KeyError, [k]))
        return self.items[key]

    def setitem(self, tx, k, v):
        self.items[k.const()] = v
        if self.source is not None:
            tx.output.mark_mutated(self)

    getattr = _container_getattr

    def __repr__(self):
        return f"Dict({self.items})"


class SetValue(Value):
    """A set of constants, kept in a real Python set that goes through the program's own
    additions and removals: it iterates (and pops) in the order eager's set does."""

    mutable = True

    def __init__(self, items, source=None):
        self.items = items if type(items) is set else set(items)
        self.source = source

    def python_type(self):
        return set

    def truth(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return [ConstantValue(v) for v in self.items]

    getattr = _container_getattr

    def call_method(self, tx, name, args, kwargs):
        return rules.set_method(tx, self, name, args, kwargs)


class IteratorValue(Value):
    """An iterator over a fixed list of values (a tuple's or a constant's items); the
    lazy and live ones (generators, map, a list's iterator) are in iterators.py."""

    mutable = True

    def __init__(self, items, index=0):
        self.items = list(items)
        self.index = index

    def next(self, tx):
        """The next item, or None when exhausted."""
        if self.index >= len(self.items):
            return None
        v = self.items[self.index]
        self.index += 1
        return v

    def unpack(self, tx):
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest

    def python_type(self):
        return type(iter(()))

    def truth(self, tx):
        return True

    getattr = _container_getattr

    def call_method(self, tx, name, args, kwargs):
        return rules.iterator_method(tx, self, name, args, kwargs)

    def referenced(self) -> list:
        """The Values a rebuilt iterator is made of."""
        return self.items[self.index:]

    def rebuild(self, cg) -> str:
        """Python source making this iterator, in its current position."""
        return f"iter(({''.join(cg.expr(i) + ', ' for i in self.items[self.index:])}))"
