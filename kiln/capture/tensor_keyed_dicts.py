"""Dicts keyed by tensors: an optimizer's ``state`` (``defaultdict(dict)`` keyed by
its parameters).

A tensor hashes by identity, so ``d[p]`` finds the entry of that very tensor object.
The trace only looks up keys that are input tensors (a parameter read from its
source): each lookup is guarded on its own — ``d.get(p)`` re-reads a present entry (a
``get``, not ``d[p]``, so that a guard never inserts into a defaultdict), a missing
one is guarded ``p not in d``. A missing key of a ``defaultdict(dict)`` read by
``d[p]`` makes a new dict, as ``__missing__`` does; it is inserted into the real
dict after the graph (``write_back``), with the values the trace stored in it. The
rest of the dict is never read, so it needs no guard.
"""
from __future__ import annotations

from dataclasses import dataclass

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.sources import Source


@dataclass(frozen=True)
class TensorKeySource(Source):
    """``base.get(key)``: the entry of the tensor ``key`` in the dict ``base``."""

    base: Source
    key: Source

    def expr(self):
        return f"{self.base.expr()}.get({self.key.expr()})"

    def pretty(self):
        return f"{self.base.pretty()}[{self.key.pretty()}]"


class TensorKeyedDictValue(V.Value):
    """A real dict whose keys are tensors, read entry by entry (see the module doc)."""

    mutable = True

    def __init__(self, obj, source):
        self.obj = obj
        self.source = source
        self._entries: dict = {}   # id(real key) -> Value of the entry (this trace's view)
        self._inserted: list = []  # (key TensorValue, Value) made by __missing__, in order

    def python_type(self):
        return type(self.obj)

    def truth(self, tx):
        raise Unsupported("K0046", "truth of a dict keyed by tensors (reads every key)")

    def _key(self, tx, k):
        if not isinstance(k, V.TensorValue) or k.source is None:
            raise Unsupported("K0046", "a tensor-keyed dict looked up by a tensor made in the graph")
        real = tx.output.real_input(k)
        if real is None:
            raise Unsupported("K0046", "a tensor-keyed dict looked up by a tensor kiln cannot re-read")
        return real

    def _lookup(self, tx, k):
        """The entry's Value, or None when the real dict has no such key (guarded)."""
        from kiln.capture.builder import wrap

        real = self._key(tx, k)
        if id(real) in self._entries:
            return self._entries[id(real)]
        if real not in self.obj:
            tx.output.guards.expression(f"{k.source.expr()} not in {self.source.expr()}",
                                        f"{k.source.pretty()} is not a key of {self.source.pretty()}")
            return None
        v = wrap(tx, self.obj[real], TensorKeySource(self.source, k.source))
        self._entries[id(real)] = v
        return v

    def getitem(self, tx, k):
        v = self._lookup(tx, k)
        if v is not None:
            return v
        factory = getattr(self.obj, "default_factory", None)
        if factory is not dict:
            if factory is not None:
                raise Unsupported("K0046", f"a tensor-keyed defaultdict of {factory!r}")
            raise UserException(V.ExceptionValue(KeyError, [k]))
        tx.output.guards.expression(f"{self.source.expr()}.default_factory is dict",
                                    f"{self.source.pretty()} is a defaultdict(dict)")
        new = V.DictValue({})
        self._store(tx, k, new)
        return new

    def setitem(self, tx, k, v):
        self._lookup(tx, k)  # the key exists or not: guarded either way
        self._store(tx, k, v)

    def _store(self, tx, k, v):
        real = self._key(tx, k)
        self._entries[id(real)] = v
        self._inserted = [(kk, vv) for kk, vv in self._inserted if kk is not k] + [(k, v)]
        tx.output.mark_mutated(self)

    def contains(self, tx, k) -> bool:
        return self._lookup(tx, k) is not None

    def call_method(self, tx, name, args, kwargs):
        if name == "get" and not kwargs and 1 <= len(args) <= 2:
            v = self._lookup(tx, args[0])
            return v if v is not None else (args[1] if len(args) > 1 else V.ConstantValue(None))
        if name == "__getitem__" and len(args) == 1:
            return self.getitem(tx, args[0])
        if name == "__setitem__" and len(args) == 2:
            self.setitem(tx, args[0], args[1])
            return V.ConstantValue(None)
        if name == "__contains__" and len(args) == 1:
            return V.ConstantValue(self.contains(tx, args[0]))
        raise Unsupported("K0019", f"{type(self.obj).__name__}.{name} on a dict keyed by tensors")

    def getattr(self, tx, name):
        if name == "__class__":
            return V.ClassValue(type(self.obj))
        return V.BoundContainerMethod(self, name)

    # --- the entry code ---------------------------------------------------------------
    def referenced(self) -> list:
        return [v for _, v in self._inserted] + [k for k, _ in self._inserted]

    def rebuild(self, cg) -> str:
        return cg.read(self.source)

    def write_back(self, cg, val, apply):
        """The entries the trace stored (new ones, replaced ones), written into the real
        dict after the graph; a stored dict that came from the real dict is itself
        (its own changes are its own side effect)."""
        target = cg.read(self.source)
        for k, v in self._inserted:
            apply.append(f"{target}[{cg.read(k.source)}] = {val(cg.expr(v))}")

    def __repr__(self):
        return f"TensorKeyedDict({len(self._entries)} read)"
