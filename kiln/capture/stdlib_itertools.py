"""``itertools`` during a trace, as CPython's own behaves.

Two kinds of rule, registered in ``rule_tables.BUILTINS``:

* the combinatoric ones (``combinations``, ``permutations``,
  ``combinations_with_replacement``) read their whole input when made, as CPython's do,
  so the index tuples are computed by the real function over ``range(n)`` and the items
  picked from the pool (errors and order are CPython's own);
* the lazy ones (``count``, ``cycle``, ``groupby``, ``takewhile``, ``starmap``, ``tee``…)
  call user code or never end, so they are the Python generators below, traced like any
  user generator: one item per ``next``, user callbacks inlined where they are called.
"""
from __future__ import annotations

import itertools
import operator

from kiln.capture import iterators
from kiln.capture import values as V
from kiln.capture.operators import fold
from kiln.capture.rule_tables import BUILTINS
from kiln.capture.errors import UserException


# --- the lazy ones: generators kiln traces like the user's own ----------------------
def _count(start=0, step=1):
    n = start
    while True:
        yield n
        n += step


def _cycle(iterable):
    saved = []
    for element in iterable:
        yield element
        saved.append(element)
    while saved:
        for element in saved:
            yield element


def _repeat(obj):
    while True:
        yield obj


def _takewhile(predicate, iterable):
    for x in iterable:
        if predicate(x):
            yield x
        else:
            break


def _dropwhile(predicate, iterable):
    it = iter(iterable)
    for x in it:
        if not predicate(x):
            yield x
            break
    for x in it:
        yield x


def _filterfalse(predicate, iterable):
    if predicate is None:
        predicate = bool
    for x in iterable:
        if not predicate(x):
            yield x


def _starmap(function, iterable):
    for args in iterable:
        yield function(*args)


def _compress(data, selectors):
    for d, s in zip(data, selectors):
        if s:
            yield d


def _pairwise(iterable):
    it = iter(iterable)
    for a in it:
        for b in it:
            yield a, b
            a = b
        break


def _groupby_group(state, key):
    """One group of ``groupby``: the items whose key equals ``key``, read from the
    shared state (``[iterator, current key, current value, exhausted]``)."""
    while not state[3] and state[1] == key:
        yield state[2]
        _groupby_advance(state)


def _groupby_advance(state):
    for v in state[0]:
        state[1] = state[4](v)
        state[2] = v
        return
    state[3] = True


def _groupby(iterable, key=None):
    state = [iter(iterable), None, None, False, key if key is not None else _identity]
    _groupby_advance(state)
    while not state[3]:
        k = state[1]
        yield k, _groupby_group(state, k)
        while not state[3] and state[1] == k:  # the rest of an unconsumed group
            _groupby_advance(state)


def _identity(x):
    return x


def _tee_one(it, buffers, mine):
    while True:
        if not mine:
            for value in it:
                for b in buffers:
                    b.append(value)
                break
            else:
                return
        yield mine.pop(0)


def _tee(iterable, n=2):
    it = iter(iterable)
    buffers = [[] for _ in range(n)]
    return tuple(_tee_one(it, buffers, b) for b in buffers)


def _lazy(poly):
    def rule(tx, *args, **kwargs):
        return V.UserFunctionValue(poly).call(tx, list(args), kwargs)

    return rule


for _fn, _poly in ((itertools.count, _count), (itertools.cycle, _cycle),
                   (itertools.takewhile, _takewhile), (itertools.dropwhile, _dropwhile),
                   (itertools.filterfalse, _filterfalse), (itertools.starmap, _starmap),
                   (itertools.compress, _compress), (itertools.pairwise, _pairwise),
                   (itertools.groupby, _groupby), (itertools.tee, _tee)):
    BUILTINS[_fn] = _lazy(_poly)


def _repeat_rule(tx, x, times=None):
    if times is None:
        return V.UserFunctionValue(_repeat).call(tx, [x], {})
    return V.IteratorValue([x] * max(times.const(), 0))


BUILTINS[itertools.repeat] = _repeat_rule


# --- the combinatoric ones: CPython's index order over the pool ---------------------
def _combinatoric(fn):
    def rule(tx, iterable, *rest, **kwargs):
        pool = [x for x in iterators.iterate(tx, iterable)]
        crest = [r.const() for r in rest]
        ckw = {k: v.const() for k, v in kwargs.items()}
        index_tuples = fold(lambda *a, **k: list(fn(*a, **k)), range(len(pool)), *crest, **ckw)
        return V.IteratorValue([V.TupleValue([pool[i] for i in idx]) for idx in index_tuples])

    return rule


for _fn in (itertools.combinations, itertools.permutations, itertools.combinations_with_replacement):
    BUILTINS[_fn] = _combinatoric(_fn)
