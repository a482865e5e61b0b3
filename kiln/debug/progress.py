"""A progress line on a terminal during a long compile (``KILN_PROGRESS``): after
``DELAY_S`` seconds of one compile, stderr shows, rewritten in place, the function,
the number of graphs handed to backends so far and the stage running now (the stages
of ``timing.timed``); the line is cleared when the compile ends. Silent when stderr is
not a terminal (logs, CI), unless forced on.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import time

from kiln import config

#: A compile shorter than this shows nothing.
DELAY_S = 1.0

_state = threading.local()


def enabled() -> bool:
    mode = config.progress
    if mode == "auto":
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty())
    return mode not in ("0", "", "off", "false")


@contextlib.contextmanager
def compiling(name: str):
    """Around one compile (nested compiles count as part of the outermost one)."""
    if getattr(_state, "start", None) is not None or not enabled():
        yield
        return
    _state.start, _state.name, _state.graphs, _state.shown = time.perf_counter(), name, 0, False
    try:
        yield
    finally:
        if _state.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
        _state.start = None


def graph() -> None:
    """A graph was handed to a backend."""
    if getattr(_state, "start", None) is not None:
        _state.graphs += 1


def stage(name: str) -> None:
    """A stage starts (called by ``timing.timed``)."""
    start = getattr(_state, "start", None)
    if start is None:
        return
    elapsed = time.perf_counter() - start
    if elapsed < DELAY_S:
        return
    _state.shown = True
    sys.stderr.write(f"\r\x1b[K[kiln] compiling {_state.name}: graph {max(1, _state.graphs)}, "
                     f"{name} ({elapsed:.0f}s)")
    sys.stderr.flush()
