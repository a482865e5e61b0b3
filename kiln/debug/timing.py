"""Compile-time accounting per stage, shown by ``kiln.compile_times()``.

Stages wrap their work in ``with timed("capture"):``; totals and counts accumulate in
this process. The report is a small table, slowest stage first. Stages nest (the
kernels a backend builds run inside the capture that called it), so each stage also
keeps its *own* time, its total less the stages timed inside it (``own()``): the own
times of all stages add up to the time spent compiling, once.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

from kiln.debug import progress

_totals: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)
_own: dict[str, float] = defaultdict(float)
#: per thread, the time of the stages nested in each open one (innermost last)
_open = threading.local()
#: stage, seconds -> None: the trace directory's per-compile accounting, when one is on
observer = None


@contextlib.contextmanager
def timed(stage: str):
    progress.stage(stage)
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    stack.append(0.0)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        inner = stack.pop()
        if stack:
            stack[-1] += dt
        _totals[stage] += dt
        _own[stage] += dt - inner
        _counts[stage] += 1
        if observer is not None:
            observer(stage, dt)


def events() -> int:
    """How many stage runs this process has timed: a count that grows whenever kiln
    compiles anything (``perf_fallback.one_off_work``)."""
    return sum(_counts.values())


def totals() -> dict[str, float]:
    return dict(_totals)


def own() -> dict[str, float]:
    """Per stage, its time less that of the stages timed inside it."""
    return dict(_own)


def clear() -> None:
    _totals.clear()
    _counts.clear()
    _own.clear()


def report() -> str:
    if not _totals:
        return "kiln compile times: nothing compiled yet"
    rows = sorted(_totals.items(), key=lambda kv: -kv[1])
    w = max(len(k) for k, _ in rows)
    lines = [f"{'stage'.ljust(w)}  seconds       own   calls"]
    for k, v in rows:
        lines.append(f"{k.ljust(w)}  {v:8.4f}  {_own[k]:8.4f}  {_counts[k]:6d}")
    return "\n".join(lines)
