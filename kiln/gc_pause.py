"""Python's cyclic garbage collector paused while kiln compiles: a frame's capture (and
its backend), and a graph's kernels built at its first call (``kernels/compile.py``).

A compile allocates hundreds of thousands of objects (FX nodes, meta tensors, loop IR),
so the collector runs often, and each full collection walks the whole heap: the user's
model included. On a 24-layer GPT-2's training compile that was 0.5 s (a tenth of the
compile, growing with the depth). Paused, garbage made during the compile waits for the
first collection after it (the collector's normal thresholds: a young collection scans
what the compile left, not the old heap; reference counting still frees everything
acyclic at once). Nested compiles leave the pause to the outermost one.
``config.pause_gc`` (``KILN_PAUSE_GC``) turns it off.
"""
from __future__ import annotations

import contextlib
import gc

from kiln import config


@contextlib.contextmanager
def paused():
    """The collector off for the block, when it was on and ``config.pause_gc`` is set."""
    if not config.pause_gc or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
