"""``collections`` containers made during a trace, and the class-level constructors
of dicts: ``OrderedDict`` (and subclasses that add no behaviour), ``deque``,
``Counter``, ``namedtuple`` class creation, ``dict.fromkeys`` and friends.

Each is the Value of its container kind with the type's own extra behaviour: an
OrderedDict's ``move_to_end`` / ``popitem(last=)``, a Counter's missing keys reading 0
(without storing them), a deque's two ends and ``maxlen``. The entry code rebuilds them
as their real type. Real deques and Counters passed in stay opaque objects.
"""
from __future__ import annotations

import collections
import types

from kiln.capture import iterators
from kiln.capture import values as V
from kiln.capture.operators import fold
from kiln.capture.rule_tables import BUILTINS
from kiln.capture.containers import _err, dict_items_of
from kiln.capture.errors import Unsupported, UserException


C = V.C


# --- OrderedDict -------------------------------------------------------------------
class OrderedDictValue(V.DictValue):
    def getattr(self, tx, name):
        if self.cls is not collections.OrderedDict and _defined_above(self.cls, collections.OrderedDict, name):
            from kiln.capture.builder import wrap_class_attr

            return wrap_class_attr(tx, self, self.cls, name)  # what the subclass adds (guarded)
        return super().getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "move_to_end":
            key = args[0].const()
            last = (args[1] if len(args) > 1 else kwargs.get("last", C(True))).const()
            if key not in self.items:
                raise UserException(V.ExceptionValue(KeyError, [args[0]]))
            v = self.items.pop(key)
            self.items = {key: v, **self.items} if not last else {**self.items, key: v}
            self._mutated(tx)
            return C(None)
        if name == "popitem":
            last = (args[0] if args else kwargs.get("last", C(True))).const()
            if not self.items:
                raise _err(KeyError, "dictionary is empty")
            key = next(reversed(self.items)) if last else next(iter(self.items))
            v = self.items.pop(key)
            self._mutated(tx)
            return V.TupleValue([C(key), v])
        if name == "copy":
            return OrderedDictValue(dict(self.items), cls=self.cls)
        return super().call_method(tx, name, args, kwargs)

    def _mutated(self, tx):
        if self.source is not None:
            tx.output.mark_mutated(self)


_DATA_NAMES = ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__slots__",
               "__annotations__", "__orig_bases__", "__parameters__")


def _adds_no_behaviour(cls, base) -> bool:
    """A subclass whose classes up to ``base`` override nothing of ``base``: they add
    data and new Python methods only, so an instance stores and reads as ``base``'s."""
    for klass in cls.__mro__:
        if klass is base:
            return True
        for name, attr in vars(klass).items():
            if name in _DATA_NAMES:
                continue
            if hasattr(base, name) or name.startswith("__"):
                return False
            if (callable(attr) or hasattr(attr, "__get__")) and not isinstance(attr, types.FunctionType):
                return False
    return False


def _defined_above(cls, base, name) -> bool:
    """Whether a class above ``base`` in ``cls``'s MRO defines ``name``."""
    for klass in cls.__mro__:
        if klass is base:
            return False
        if name in vars(klass):
            return True
    return False


def _dict_items(tx, args, kwargs):
    if len(args) > 1:
        raise Unsupported("K0016", "a dict constructor with more than one positional argument")
    items = dict(dict_items_of(tx, args[0])) if args else {}
    items.update(kwargs)
    return items


def _ordered_dict(cls):
    def rule(tx, *args, **kwargs):
        return OrderedDictValue(_dict_items(tx, args, kwargs), cls=cls)

    return rule


# --- Counter -----------------------------------------------------------------------
class CounterValue(V.DictValue):
    """Counts are constants (``most_common`` sorts them at trace time)."""

    def getitem(self, tx, k):
        key = k.const()
        return self.items[key] if key in self.items else C(0)

    def call_method(self, tx, name, args, kwargs):
        if name in ("update", "subtract"):
            sign = 1 if name == "update" else -1
            for src in list(args[:1]) + ([V.DictValue(kwargs)] if kwargs else []):
                self._count(tx, src, sign)
            return C(None)
        if name == "most_common":
            n = args[0].const() if args else None
            pairs = sorted(((k, v.const()) for k, v in self.items.items()), key=lambda kv: kv[1], reverse=True)
            return V.ListValue([V.TupleValue([C(k), C(c)]) for k, c in (pairs if n is None else pairs[:n])])
        if name == "total":
            return C(sum(v.const() for v in self.items.values()))
        if name == "elements":
            return V.IteratorValue([C(k) for k, v in self.items.items() for _ in range(v.const())])
        if name == "copy":
            return CounterValue(dict(self.items), cls=self.cls)
        return super().call_method(tx, name, args, kwargs)

    def _count(self, tx, src, sign):
        if isinstance(src, V.DictValue):
            for k, v in src.items.items():
                self.items[k] = C(self.getitem(tx, C(k)).const() + sign * v.const())
        else:
            for x in iterators.iterate(tx, src):
                k = x.const()
                self.items[k] = C(self.getitem(tx, C(k)).const() + sign)
        if self.source is not None:
            tx.output.mark_mutated(self)


def _counter(tx, *args, **kwargs):
    c = CounterValue({}, cls=collections.Counter)
    if args or kwargs:
        c.call_method(tx, "update", list(args), kwargs)
    return c


# --- deque -------------------------------------------------------------------------
class DequeValue(V.Value):
    """A deque made in the trace: its items as Values, two ends and an optional maxlen.
    Not a list Value: a deque compares, adds and slices differently, and those stay
    plain Python (a break) rather than list behaviour."""

    mutable = True

    def __init__(self, items, maxlen=None):
        self.items = list(items)
        self.maxlen = maxlen
        self.source = None
        self.version = 0   # mutations, for iterators made before them
        self._trim(right=True)

    def python_type(self):
        return collections.deque

    def truth(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return list(self.items)

    def length(self):
        return len(self.items)

    def make_iter(self, tx):
        return DequeIterator(self)

    def getitem(self, tx, k):
        if isinstance(k, V.TensorValue):
            from kiln.capture.tensor_builtins import index_value

            k = index_value(tx, k)
        return self.items[fold(_index_of, len(self.items), k.const())]

    def setitem(self, tx, k, v):
        self.items[fold(_index_of, len(self.items), k.const())] = v
        self.version += 1

    def contains(self, tx, item):
        from kiln.capture.operators import values_equal

        return any(values_equal(tx, i, item) for i in list(self.items))

    def referenced(self):
        return list(self.items)

    def rebuild(self, cg):
        body = "[" + ", ".join(cg.expr(i) for i in self.items) + "]"
        return f"{cg.ref(collections.deque, 'deque')}({body}, {self.maxlen!r})"

    def getattr(self, tx, name):
        if name == "maxlen":
            return C(self.maxlen)
        if name == "__class__":
            return V.ClassValue(collections.deque)
        if not hasattr(collections.deque, name):
            raise _err(AttributeError, f"'collections.deque' object has no attribute {name!r}")
        return V.BoundContainerMethod(self, name)

    def _trim(self, right):
        if self.maxlen is not None and len(self.items) > self.maxlen:
            extra = len(self.items) - self.maxlen
            if right:
                del self.items[:extra]
            else:
                del self.items[self.maxlen:]

    def call_method(self, tx, name, args, kwargs):
        from kiln.capture.operators import values_equal

        items = self.items
        if kwargs:
            raise Unsupported("K0019", f"deque.{name} with keyword arguments")
        if name in _DEQUE_READS:
            return _DEQUE_READS[name](tx, self, args)
        self.version += 1
        if name == "append":
            items.append(args[0])
            self._trim(right=True)
        elif name == "appendleft":
            items.insert(0, args[0])
            self._trim(right=False)
        elif name == "extend":
            for x in list(iterators.iterate(tx, args[0])):
                items.append(x)
                self._trim(right=True)
        elif name == "extendleft":
            for x in list(iterators.iterate(tx, args[0])):
                items.insert(0, x)
                self._trim(right=False)
        elif name in ("pop", "popleft"):
            if args:
                raise _err(TypeError, f"deque.{name}() takes no arguments ({len(args)} given)")
            if not items:
                raise _err(IndexError, f"{name} from an empty deque")
            return items.pop(-1 if name == "pop" else 0)
        elif name == "rotate":
            n = args[0].const() if args else 1
            if items:
                n %= len(items)
                if n:
                    items[:] = items[-n:] + items[:-n]
        elif name == "clear":
            items.clear()
        elif name == "reverse":
            items.reverse()
        elif name == "remove":
            for i, x in enumerate(items):
                if values_equal(tx, x, args[0]):
                    del items[i]
                    break
            else:
                raise _err(ValueError, f"{args[0]!r} is not in deque")
        elif name == "insert":
            if self.maxlen is not None and len(items) >= self.maxlen:
                raise _err(IndexError, "deque already at its maximum size")
            items.insert(args[0].const(), args[1])
        else:
            raise Unsupported("K0019", f"deque.{name}")
        return C(None)

    def __repr__(self):
        return f"Deque({self.items}, maxlen={self.maxlen})"


def _index_of(n, i):
    """The position deque[i] reads (its errors are deque's)."""
    return collections.deque.__getitem__(collections.deque(range(n)), i)


def _deque_index(tx, dq, args):
    from kiln.capture.operators import values_equal

    for i, x in enumerate(dq.items):
        if values_equal(tx, x, args[0]):
            return C(i)
    raise _err(ValueError, "deque.index(x): x not in deque")


def _deque_count(tx, dq, args):
    from kiln.capture.operators import values_equal

    return C(sum(1 for x in list(dq.items) if values_equal(tx, x, args[0])))


_DEQUE_READS = {
    "copy": lambda tx, dq, args: DequeValue(list(dq.items), dq.maxlen),
    "__len__": lambda tx, dq, args: C(len(dq.items)),
    "__getitem__": lambda tx, dq, args: dq.getitem(tx, args[0]),
    "__contains__": lambda tx, dq, args: C(dq.contains(tx, args[0])),
    "index": _deque_index,
    "count": _deque_count,
}


class DequeIterator(iterators.LazyIterator):
    """``iter(deque)``: one item per ``next``; a deque changed meanwhile raises, as
    CPython's does."""

    def __init__(self, dq):
        super().__init__()
        self.dq = dq
        self.pos = 0
        self.version = dq.version

    def python_type(self):
        return type(iter(collections.deque()))

    def next(self, tx):
        if self.dq.version != self.version:
            raise _err(RuntimeError, "deque mutated during iteration")
        if self.pos >= len(self.dq.items):
            return None
        self.pos += 1
        return self.dq.items[self.pos - 1]

    def referenced(self):
        return [self.dq]

    def rebuild(self, cg):
        return f"{cg.ref(iterators.advanced, 'f')}(iter({cg.expr(self.dq)}), {self.pos})"


def _deque(tx, iterable=None, maxlen=None):
    m = None if maxlen is None else maxlen.const()
    if m is not None and (not isinstance(m, int) or m < 0):
        fold(collections.deque, (), m)  # eager's own error
    items = [] if iterable is None else list(iterators.iterate(tx, iterable))
    return DequeValue(items, m)


# --- namedtuple classes and fromkeys ----------------------------------------------
def _namedtuple(tx, typename, field_names, **kwargs):
    """A new class made at trace time from constant arguments (eager makes an equal one
    per call; the compiled code reuses one)."""
    from kiln.capture.builder import wrap_static

    try:
        ckw = {k: v.const() for k, v in kwargs.items()}
        names = field_names.const()
    except Unsupported:
        raise Unsupported("K0011", "namedtuple() from non-constant arguments")
    if ckw.get("module") is None:
        ckw["module"] = tx.f_globals.get("__name__", "__main__") if hasattr(tx, "f_globals") else None
    return wrap_static(fold(collections.namedtuple, typename.const(), names, **ckw))


def _fromkeys(cls, make):
    def rule(tx, iterable, value=None):
        keys = [x.const() for x in iterators.iterate(tx, iterable)]
        v = value if value is not None else C(None)
        return make(cls, dict.fromkeys(keys, v))

    return rule


def _defaultdict_of(cls, items):
    from kiln.capture.default_dicts import DefaultDictValue

    return DefaultDictValue(items, C(None))


BUILTINS[collections.OrderedDict] = _ordered_dict(collections.OrderedDict)
BUILTINS[collections.Counter] = _counter
BUILTINS[collections.deque] = _deque
BUILTINS[collections.namedtuple] = _namedtuple
BUILTINS[dict.fromkeys] = _fromkeys(dict, lambda cls, items: V.DictValue(items))
BUILTINS[collections.OrderedDict.fromkeys] = _fromkeys(collections.OrderedDict,
                                                       lambda cls, items: OrderedDictValue(items, cls=cls))
BUILTINS[collections.defaultdict.fromkeys] = _fromkeys(collections.defaultdict, _defaultdict_of)


def construct_subclass(tx, cls, args, kwargs):
    """``MyDict(...)`` for a subclass of OrderedDict that adds no behaviour; None when
    this module has no rule for ``cls``."""
    if issubclass(cls, collections.OrderedDict) and _adds_no_behaviour(cls, collections.OrderedDict):
        return OrderedDictValue(_dict_items(tx, args, kwargs), cls=cls)
    return None
