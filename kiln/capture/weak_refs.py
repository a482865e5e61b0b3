"""Weak references during a trace.

*Calling a real one* (``opt = opt_ref()``, as the wrapper an LR scheduler puts around
``optimizer.step`` does): the referent is read at trace time through the call itself,
``ref()``, as its source: the guards re-read it that way, so a dead reference (None) or
another object on a later call is a guard failure, not a stale answer.

*Making one* (``self._inv = weakref.ref(inv)``, as torch 2.11's distribution transforms
do): a ``NewWeakRefValue`` pointing at the referent's Value. It can be stored anywhere
a Value can, compared with None, and is rebuilt after the graph as a real
``weakref.ref(referent)`` (an attribute write on an existing object replays that way).
It is rebuilt where the entry returns, not at a graph break (the entry's temporaries
would keep the referent alive while the user's code resumes). Calling it answers the
referent only where the referent is provably alive: reachable
through strong references the trace tracks, from the live frames' locals, stacks and
cells. Whether an object nothing reachable holds is dead depends on reference counts
and on when the cycle collector runs, so such a call is a graph break.
``weakref.ref(o)`` is ``weakref.ref(o)`` in CPython (the plain reference is shared):
one Value per referent keeps that, and identity against any other weak reference is a
break.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from kiln.capture import values as V
from kiln.capture.builtins import BUILTINS
from kiln.capture.errors import Unsupported
from kiln.capture.sources import Source


@dataclass(frozen=True)
class RefCallSource(Source):
    """``ref()``: what the weak reference ``ref`` points to."""

    ref: Source

    def expr(self):
        return f"{self.ref.expr()}()"

    def pretty(self):
        return f"{self.ref.pretty()}()"


class WeakRefValue(V.Value):
    def __init__(self, ref, source):
        self.ref = ref
        self.source = source

    def python_type(self):
        return type(self.ref)

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("K0016", "calling a weak reference with arguments")
        from kiln.capture.builder import wrap

        return wrap(tx, self.ref(), RefCallSource(self.source))

    def __repr__(self):
        return f"WeakRef({self.ref!r})"


@V.rule
def wrap_ref(tx, ref, source):
    """The Value of a plain ``weakref.ref`` read from ``source`` (its type guarded)."""
    if type(ref) is not weakref.ref or source is None:
        return None
    tx.output.guards.type_is(source, weakref.ref)
    return WeakRefValue(ref, source)


# --- weak references the program makes ----------------------------------------------
class NewWeakRefValue(V.Value):
    """``weakref.ref(target)`` made by the traced program."""

    shared_identity = True      # ``is`` against another weak reference: see operators

    def __init__(self, target: V.Value):
        self.target = target

    def python_type(self):
        return weakref.ref

    def truth(self, tx):
        return True             # weak references define no truth value of their own

    def call(self, tx, args, kwargs):
        if args or kwargs:
            raise Unsupported("K0016", "calling a weak reference with arguments")
        if not strongly_reachable(tx, self.target):
            raise Unsupported("K0058", "calling a weak reference made in the compiled region "
                              "whose referent nothing the trace tracks keeps alive (eager's "
                              "answer depends on reference counts and the cycle collector)")
        return self.target

    def referenced(self) -> list:
        return [self.target]

    def rebuild(self, cg) -> str:
        if cg.continues:
            # the entry's temporaries would keep the referent alive while the user's
            # code resumes, where eager's may die
            raise Unsupported("K0021", "rebuilding a weak reference made in the compiled "
                              "region at a graph break")
        return f"{cg.ref(weakref.ref, 'weakref_ref')}({cg.expr(self.target)})"

    def __repr__(self):
        return f"NewWeakRef({self.target!r})"


def _weakrefable(v) -> bool:
    """Whether eager can make a weak reference to ``v``'s object (its type has a
    ``__weakref__`` slot); only objects are taken (the type is guarded for them)."""
    if isinstance(v, V.NewObjectValue):
        cls = v.cls
    elif isinstance(v, V.ModuleValue):
        cls = type(v.mod)
    elif isinstance(v, V.ObjectValue) and v.obj is not None:
        cls = type(v.obj)
    else:
        return False
    return cls.__weakrefoffset__ != 0


def make_ref(tx, target, callback=None):
    """``weakref.ref(target[, callback])`` in traced code."""
    if callback is not None and not (isinstance(callback, V.ConstantValue) and callback.value is None):
        raise Unsupported("K0016", "weakref.ref with a callback (it runs when the referent dies)")
    if not _weakrefable(target):
        raise Unsupported("K0016", f"weakref.ref of {target}")
    made = tx.output.__dict__.setdefault("weak_refs_made", {})
    hit = made.get(id(target))
    if hit is None:             # CPython shares the plain reference to one object
        hit = made[id(target)] = (target, NewWeakRefValue(target))
    return hit[1]


BUILTINS[weakref.ref] = make_ref


# --- liveness -------------------------------------------------------------------------
def _frames(tx):
    f = tx
    while f is not None:
        yield f
        f = getattr(f, "parent", None)


def _roots(tx):
    for f in _frames(tx):
        yield from f.locals.values()
        yield from f.stack
        yield from f.cells.values()
        yield from f.closure or ()


def _edges(v):
    """The Values ``v`` holds strong references to (as far as the trace tracks them)."""
    if isinstance(v, NewWeakRefValue):
        return ()
    if isinstance(v, V._Sequence):
        return v.items
    if isinstance(v, V.DictValue):
        return list(v.items.values()) + list(getattr(v, "attrs", {}).values())
    if isinstance(v, V.ObjectValue):
        return v.attrs.values()
    if isinstance(v, V.MethodValue):
        return (v.self_value, v.func)
    if isinstance(v, V.CellValue):
        return (v.value,)
    if isinstance(v, V.ExceptionValue):
        return list(v.args) + list(v.attrs.values())
    if isinstance(v, V.NestedFunctionValue):
        return list(v.defaults or ()) + list(v.closure or ())
    written = getattr(v, "written", None)           # a real closure cell written
    return (written,) if isinstance(written, V.Value) else ()


def _real(v):
    if isinstance(v, V.LazyArg):
        return v.real
    if isinstance(v, V.ModuleValue):
        return v.mod
    if isinstance(v, V.ObjectValue) and not isinstance(v, V.NewObjectValue):
        return v.obj
    return None


def strongly_reachable(tx, target) -> bool:
    """Whether a chain of strong references the trace tracks leads from a live frame
    to ``target`` (its Value, or another Value of the same existing object)."""
    real = _real(target)
    seen, todo = set(), list(_roots(tx))
    while todo:
        v = todo.pop()
        if not isinstance(v, V.Value) or id(v) in seen:
            continue
        seen.add(id(v))
        if v is target or (real is not None and _real(v) is real):
            return True
        todo.extend(_edges(v))
    return False
