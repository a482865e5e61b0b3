"""The compiled variants of one symbolic graph, one per concrete size signature.

A backend that compiles per concrete size (the kiln kernels, ``autograd/specialize.py``;
``backends_dynamic.PerSizeCompiled``) keeps its variants here: every size of a stream
is compiled at its first call (the kernel binaries are shared between sizes, so a
variant costs a lowering and its plan), at most ``config.dynamic_specializations`` of
them kept, the least recently used dropped. A stream that cycles through more sizes
than that would compile on every call; so once as many variants have been dropped as
the bound holds (the stream has come round again), a new size is no longer compiled
and runs the graph op by op (``admit`` says no), and the log says so once.
"""
from __future__ import annotations

import collections
import contextlib
import threading

from kiln import config

_size = threading.local()


@contextlib.contextmanager
def stream_size(which: str):
    """Compiling, and first calling, a size of a symbolic graph: ``which`` is "first"
    (the graph's first size) or "later" (a graph with a compiled size already). A
    backend may then build that size's new kernels in the background
    (``kernels/size_prebuild``)."""
    old = getattr(_size, "which", None)
    _size.which = which
    try:
        yield
    finally:
        _size.which = old


def current_stream_size() -> str | None:
    """The ``stream_size`` being compiled in this thread ("first", "later"), or None."""
    return getattr(_size, "which", None)


class SizeVariants:
    """An LRU map signature -> compiled variant, with the calls counted.

    ``compiled_calls`` / ``uncompiled_calls``: calls served by a variant / by the graph
    run op by op (beyond the bound); ``compiles``, ``evictions``: what it cost."""

    def __init__(self):
        self.table: collections.OrderedDict = collections.OrderedDict()
        self.compiles = 0
        self.evictions = 0
        self.compiled_calls = 0
        self.uncompiled_calls = 0
        self.thrashing = False

    @staticmethod
    def bound() -> int:
        return max(1, config.dynamic_specializations)

    def get(self, key):
        """The variant for ``key`` (made most recently used), or None."""
        hit = self.table.get(key)
        if hit is not None:
            self.table.move_to_end(key)
            self.compiled_calls += 1
        return hit

    def admit(self) -> bool:
        """May a new signature be compiled? Makes room (dropping the least recently
        used) when the table is full, unless the stream has cycled past the bound."""
        bound = self.bound()
        while len(self.table) >= bound:
            if self.evictions >= bound:
                self.thrashing = True
                return False
            self.table.popitem(last=False)
            self.evictions += 1
        return True

    def put(self, key, variant):
        self.table[key] = variant
        self.compiles += 1
        self.compiled_calls += 1
        return variant

    def values(self):
        return list(self.table.values())

    def __len__(self):
        return len(self.table)

    def __contains__(self, key):
        return key in self.table
