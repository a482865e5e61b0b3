"""Calling a real ``weakref.ref`` during a trace (``opt = opt_ref()``, as the wrapper an
LR scheduler puts around ``optimizer.step`` does).

The referent is read at trace time through the call itself, ``ref()``, as its source:
the guards re-read it that way, so a dead reference (None) or another object on a later
call is a guard failure, not a stale answer.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from kiln.capture import values as V
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
