"""How many CUDA-graph recordings one compiled graph's size variants keep (``graph_replay``).

A graph compiled for a stream of input sizes has one ``Runtime`` per size, and each
would keep a recording and the memory its temporaries hold in the pool. ``Recordings``
bounds them at ``config.cudagraph_max_recordings``: recording one more drops the least
recently replayed one. A dropped variant records again if it is called again; dropped
a second time (sizes cycling through more variants than the bound), it makes plain
launches for good, so a cycle never records on every call. The first drop is logged
once per graph (``KILN_LOGS=perf_hints``).
"""
from __future__ import annotations

import weakref
from collections import OrderedDict

from ... import config
from ...debug.logs import log_for

_log = log_for("perf_hints")


class Recordings:
    """The size variants of one graph that hold a recording, least recently used first."""

    def __init__(self, limit: int | None = None):
        self.limit = limit            # None: config.cudagraph_max_recordings, read per use
        self.order: OrderedDict = OrderedDict()     # id(replay) -> weakref to it
        self.logged = False
        #: what the variants learned, for a new one to start from (``graph_replay``):
        #: the inputs' addresses at the latest call of any variant (their argument
        #: positions, the addresses; None before any call), the positions of inputs
        #: found moving, of outputs handed out as copies
        self.last_ptrs: tuple | None = None
        self.moving: set = set()
        self.copied: set = set()

    def bound(self) -> int:
        return max(1, self.limit if self.limit is not None else config.cudagraph_max_recordings)

    def touch(self, replay) -> None:
        """``replay`` was just replayed: the most recently used."""
        key = id(replay)
        if key in self.order:
            self.order.move_to_end(key)

    def add(self, replay) -> list:
        """``replay`` holds a new recording; returns the replays to drop (oldest first)
        that take the count back to the bound."""
        self.order[id(replay)] = weakref.ref(replay, lambda _, k=id(replay): self.order.pop(k, None))
        self.order.move_to_end(id(replay))
        out = []
        while len(self.order) > self.bound():
            _, ref = self.order.popitem(last=False)
            r = ref()
            if r is not None:
                out.append(r)
        if out and not self.logged:
            self.logged = True
            _log.info("CUDA graph recordings of one graph's input sizes exceed %d "
                      "(KILN_CUDAGRAPH_MAX_RECORDINGS): the least recently used are dropped, "
                      "and a size dropped twice makes plain launches", self.bound())
        return out

    def drop(self, replay) -> None:
        """``replay`` holds no recording any more."""
        self.order.pop(id(replay), None)

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, replay) -> bool:
        return id(replay) in self.order
