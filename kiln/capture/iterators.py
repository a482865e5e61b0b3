"""Iterators during a trace, lazy and live as Python's are.

A Python iterator does its work one item at a time, when its consumer asks: ``map``
calls its function then, ``zip`` pulls from each argument in turn and stops at the
first that is exhausted, a list's iterator reads the list as it is at that moment.
Running one ahead would run code eager never runs (side effects, exceptions) or miss
a mutation, so each iterator Value here keeps its position and produces one Value per
``next(tx)`` (``None`` when it is exhausted). ``get_iter`` is Python's ``iter()``,
``next_of`` its ``next()``, and ``iterate`` walks an iterable lazily for the builtins
that stop early (``any``, ``in``) or work between items (``min`` with a key).

At a graph break, or when one is returned, an iterator is rebuilt (``rebuild``) as a
real iterator of the same kind at the same position, once per Value so that aliases
stay one object; one that cannot be (a generator suspended at a ``yield``) is
Unsupported, and the frame runs eagerly.
"""
from __future__ import annotations

import itertools

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException


def _error(cls, msg):
    return UserException(V.ExceptionValue(cls, [V.ConstantValue(msg)]))


class LazyIterator(V.IteratorValue):
    """Base of the iterators that compute their items on demand."""

    def __init__(self):
        super().__init__([])

    def unpack(self, tx):
        out = []
        while (v := self.next(tx)) is not None:
            out.append(v)
        return out

    def referenced(self) -> list:
        return []

    def rebuild(self, cg) -> str:
        raise Unsupported("K0021", f"rebuilding {type(self).__name__} after the graph")


# --- helpers the rebuilt iterators call at run time ----------------------------------------
def iter_at(it, index):
    """A list or tuple iterator (forward or reversed) moved to ``index``."""
    it.__setstate__(index)
    return it


def advanced(it, n):
    """``it`` after ``n`` items were taken from it."""
    for _ in range(n):
        next(it)
    return it


def exhausted(it):
    """``it`` run to its end: an exhausted iterator of the same type."""
    for _ in it:
        pass
    return it


# --- live iterators over containers ------------------------------------------------------
class ListIterator(LazyIterator):
    """``iter(lst)`` / ``reversed(lst)``: reads the list at each step, as CPython's does
    (items appended during the loop are seen; once exhausted it stays exhausted)."""

    def __init__(self, seq, reverse=False):
        super().__init__()
        self.seq = seq
        self.reverse = reverse
        self.pos = len(seq.items) - 1 if reverse else 0
        self.done = False

    def python_type(self):
        return type(reversed([])) if self.reverse else type(iter([]))

    def next(self, tx):
        items = self.seq.items
        if not self.done and 0 <= self.pos < len(items):
            v = items[self.pos]
            self.pos += -1 if self.reverse else 1
            return v
        self.done = True
        return None

    def referenced(self):
        return [self.seq]

    def rebuild(self, cg):
        make = "reversed" if self.reverse else "iter"
        if self.done:
            return f"{cg.ref(exhausted, 'f')}({make}([]))"
        return f"{cg.ref(iter_at, 'f')}({make}({cg.expr(self.seq)}), {self.pos})"


_DICT_ITER_TYPES = {"keys": type(iter({})), "values": type(iter({}.values())),
                    "items": type(iter({}.items()))}


class DictIterator(LazyIterator):
    """``iter(d)``, ``iter(d.values())``, ``for k, v in d.items()``: live on the dict;
    a change of its size while iterating is the user's RuntimeError, as in CPython."""

    def __init__(self, d, kind):
        super().__init__()
        self.d = d
        self.kind = kind
        self.keys = tuple(d.items)
        self.pos = 0
        self.state = "live"  # live | done | failed

    def python_type(self):
        return _DICT_ITER_TYPES[self.kind]

    def _check(self):
        keys = tuple(self.d.items)
        if len(keys) != len(self.keys):
            self.state = "failed"
            raise _error(RuntimeError, "dictionary changed size during iteration")
        if keys != self.keys:
            raise Unsupported("K0020", "a dict's keys replaced (same size) while it is iterated")
        return keys

    def next(self, tx):
        if self.state == "done":
            return None
        if self.state == "failed":
            raise _error(RuntimeError, "dictionary changed size during iteration")
        keys = self._check()
        if self.pos >= len(keys):
            self.state = "done"
            return None
        k = keys[self.pos]
        self.pos += 1
        if self.kind == "keys":
            return V.ConstantValue(k)
        if self.kind == "values":
            return self.d.items[k]
        return V.TupleValue([V.ConstantValue(k), self.d.items[k]])

    def referenced(self):
        return [self.d]

    def rebuild(self, cg):
        if self.state == "done":
            return f"{cg.ref(exhausted, 'f')}(iter({{}}.{self.kind}()))"
        if self.state == "failed" or tuple(self.d.items) != self.keys:
            raise Unsupported("K0020", "rebuilding an iterator over a dict changed since it was made")
        return f"{cg.ref(advanced, 'f')}(iter({cg.expr(self.d)}.{self.kind}()), {self.pos})"


# --- lazy builtins -------------------------------------------------------------------------
class MapIterator(LazyIterator):
    def __init__(self, fn, its):
        super().__init__()
        self.fn = fn
        self.its = its

    def python_type(self):
        return map

    def next(self, tx):
        vals = []
        for it in self.its:
            v = next_of(tx, it)
            if v is None:
                return None
            vals.append(v)
        return self.fn.call(tx, vals, {})

    def referenced(self):
        return [self.fn] + self.its

    def rebuild(self, cg):
        return f"map({cg.expr(self.fn)}, {', '.join(cg.expr(i) for i in self.its)})"


def is_none(v):
    return isinstance(v, V.ConstantValue) and v.value is None


class FilterIterator(LazyIterator):
    def __init__(self, fn, it):
        super().__init__()
        self.fn = fn
        self.it = it

    def python_type(self):
        return filter

    def next(self, tx):
        while (v := next_of(tx, self.it)) is not None:
            keep = v if is_none(self.fn) else self.fn.call(tx, [v], {})
            if keep.truth(tx):
                return v
        return None

    def referenced(self):
        return [self.fn, self.it]

    def rebuild(self, cg):
        return f"filter({cg.expr(self.fn)}, {cg.expr(self.it)})"


class ZipIterator(LazyIterator):
    """Pulls from each argument in order; the first exhausted one ends the tuple (items
    already pulled from the ones before it are dropped, as in CPython)."""

    def __init__(self, its, strict=False):
        super().__init__()
        self.its = its
        self.strict = strict

    def python_type(self):
        return zip

    def next(self, tx):
        if not self.its:
            return None
        vals = []
        for i, it in enumerate(self.its):
            v = next_of(tx, it)
            if v is None:
                if self.strict:
                    self._strict_check(tx, i)
                return None
            vals.append(v)
        return V.TupleValue(vals)

    def _strict_check(self, tx, i):
        if i > 0:
            raise _error(ValueError, f"zip() argument {i + 1} is shorter than argument{'s 1-' if i > 1 else ' '}{i}")
        for j, it in enumerate(self.its[1:], start=1):
            if next_of(tx, it) is not None:
                raise _error(ValueError, f"zip() argument {j + 1} is longer than argument{'s 1-' if j > 1 else ' '}{j}")

    def referenced(self):
        return list(self.its)

    def rebuild(self, cg):
        strict = ", strict=True" if self.strict else ""
        return f"zip({', '.join(cg.expr(i) for i in self.its)}{strict})"


class EnumerateIterator(LazyIterator):
    def __init__(self, it, start):
        super().__init__()
        self.it = it
        self.count = start

    def python_type(self):
        return enumerate

    def next(self, tx):
        v = next_of(tx, self.it)
        if v is None:
            return None
        r = V.TupleValue([V.ConstantValue(self.count), v])
        self.count += 1
        return r

    def referenced(self):
        return [self.it]

    def rebuild(self, cg):
        return f"enumerate({cg.expr(self.it)}, {self.count!r})"


class ChainIterator(LazyIterator):
    """``itertools.chain(*its)`` and ``chain.from_iterable(outer)``: takes the next
    iterable from ``outer`` only when the current one is exhausted."""

    def __init__(self, outer):
        super().__init__()
        self.outer = outer
        self.current = None

    def python_type(self):
        return itertools.chain

    def next(self, tx):
        while True:
            if self.current is None:
                src = next_of(tx, self.outer)
                if src is None:
                    return None
                self.current = get_iter(tx, src)
            v = next_of(tx, self.current)
            if v is not None:
                return v
            self.current = None

    def referenced(self):
        return [self.outer] + ([self.current] if self.current is not None else [])

    def rebuild(self, cg):
        chain = cg.ref(itertools.chain, "chain")
        outer = cg.expr(self.outer)
        if self.current is not None:
            outer = f"{chain}(({cg.expr(self.current)},), {outer})"
        return f"{chain}.from_iterable({outer})"


class IsliceIterator(LazyIterator):
    """``itertools.islice``, stepping as CPython's: skips to the next index it yields,
    and stops taking items from its source at ``stop``."""

    def __init__(self, it, start, stop, step):
        super().__init__()
        self.it = it
        self.next_index = start
        self.stop = stop
        self.step = step
        self.count = 0  # items taken from the source
        self.done = False

    def python_type(self):
        return itertools.islice

    def next(self, tx):
        if self.done:
            return None
        while self.count < self.next_index:
            if next_of(tx, self.it) is None:
                self.done = True
                return None
            self.count += 1
        if self.stop is not None and self.count >= self.stop:
            self.done = True
            return None
        v = next_of(tx, self.it)
        if v is None:
            self.done = True
            return None
        self.count += 1
        self.next_index += self.step
        if self.stop is not None and self.next_index > self.stop:
            self.next_index = self.stop
        return v

    def referenced(self):
        return [] if self.done else [self.it]

    def rebuild(self, cg):
        islice = cg.ref(itertools.islice, "islice")
        if self.done:
            return f"{islice}((), 0)"
        stop = None if self.stop is None else self.stop - self.count
        return f"{islice}({cg.expr(self.it)}, {self.next_index - self.count}, {stop!r}, {self.step})"


class ZipLongestIterator(LazyIterator):
    def __init__(self, its, fill):
        super().__init__()
        self.its = list(its)
        self.active = [True] * len(its)
        self.fill = fill

    def python_type(self):
        return itertools.zip_longest

    def next(self, tx):
        if not any(self.active):
            return None
        vals = []
        for i, it in enumerate(self.its):
            v = next_of(tx, it) if self.active[i] else None
            if v is None:
                if self.active[i]:
                    self.active[i] = False
                    if not any(self.active):
                        return None
                v = self.fill
            vals.append(v)
        return V.TupleValue(vals)

    def referenced(self):
        return self.its + [self.fill]


class AccumulateIterator(LazyIterator):
    def __init__(self, it, func, initial):
        super().__init__()
        self.it = it
        self.func = func
        self.total = initial
        self.pending_initial = initial is not None

    def python_type(self):
        return itertools.accumulate

    def next(self, tx):
        if self.pending_initial:
            self.pending_initial = False
            return self.total
        v = next_of(tx, self.it)
        if v is None:
            return None
        if self.total is None:
            self.total = v
        elif self.func is None or is_none(self.func):
            from kiln.capture.operators import binary_op

            self.total = binary_op(tx, "NB_ADD", self.total, v)
        else:
            self.total = self.func.call(tx, [self.total, v], {})
        return self.total

    def referenced(self):
        return [self.it] + [v for v in (self.func, self.total) if v is not None]


# --- the protocol ----------------------------------------------------------------------------
def _python_dunder(v, name):
    from kiln.capture.objects import has_dunder

    return isinstance(v, V.ObjectValue) and not isinstance(v, V.ModuleValue) and has_dunder(v, name)


def is_iterator(v) -> bool:
    return isinstance(v, V.IteratorValue) or _python_dunder(v, "__next__")


def get_iter(tx, v):
    """Python's ``iter(v)``."""
    if isinstance(v, V.IteratorValue):
        return v
    if type(v) is V.ListValue:
        return ListIterator(v)
    if hasattr(v, "make_iter"):  # a container with an iterator of its own (deque)
        return v.make_iter(tx)

    if isinstance(v, V.kinds.DictViewValue):
        return DictIterator(v.d, v.kind)
    if type(v) is V.DictValue:
        return DictIterator(v, "keys")
    if _python_dunder(v, "__iter__"):
        from kiln.capture.objects import call_dunder

        it = call_dunder(tx, v, "__iter__", [], {})
        if not is_iterator(it):
            raise _error(TypeError, f"iter() returned non-iterator of type {it.python_type().__name__!r}")
        return it
    return V.IteratorValue(v.unpack(tx))


def next_of(tx, it):
    """The next Value of iterator ``it``, or None once it is exhausted."""
    if isinstance(it, V.IteratorValue):
        return it.next(tx)
    if _python_dunder(it, "__next__"):
        from kiln.capture.objects import call_dunder

        try:
            return call_dunder(tx, it, "__next__", [], {})
        except UserException as e:
            if issubclass(e.value.python_type(), StopIteration):
                return None
            raise
    raise Unsupported("K0016", f"next() on {it}")


@V.rule
def iterate(tx, v):
    """The items of iterable ``v``, taken one at a time as the caller asks."""
    it = get_iter(tx, v)
    while (x := next_of(tx, it)) is not None:
        yield x


def unpack_exactly(tx, v, n):
    """``a, b = v``: at most n + 1 items are taken, as CPython's UNPACK_SEQUENCE does."""
    if not (isinstance(v, LazyIterator) or _python_dunder(v, "__iter__") or _python_dunder(v, "__next__")):
        return v.unpack(tx)
    it = get_iter(tx, v)
    items = []
    while len(items) <= n and (x := next_of(tx, it)) is not None:
        items.append(x)
    return items


@V.rule
def iterator_method(tx, it, name, args, kwargs):
    """Methods every iterator Value has (generators add send/throw/close)."""
    if name == "__next__":
        v = it.next(tx)
        if v is None:
            raise UserException(stop_iteration(it))
        return v
    if name == "__iter__":
        return it
    if name == "__length_hint__" and type(it) is V.IteratorValue:
        return V.ConstantValue(len(it.items) - it.index)
    raise Unsupported("K0019", f"{it.python_type().__name__}.{name}")


def stop_iteration(it):
    """The StopIteration ``next()`` raises at the end of ``it`` (a generator's carries
    its return value, once)."""
    value = getattr(it, "take_return_value", lambda: None)()
    return V.ExceptionValue(StopIteration, [] if value is None or is_none(value) else [value])
