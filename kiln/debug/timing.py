"""Compile-time accounting per stage, shown by ``kiln.compile_times()``.

Stages wrap their work in ``with timed("capture"):``; totals and counts accumulate in
this process. The report is a small table, slowest stage first.
"""
from __future__ import annotations

import contextlib
import time
from collections import defaultdict

_totals: dict[str, float] = defaultdict(float)
_counts: dict[str, int] = defaultdict(int)
#: stage, seconds -> None: the trace directory's per-compile accounting, when one is on
observer = None


@contextlib.contextmanager
def timed(stage: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        dt = time.perf_counter() - t0
        _totals[stage] += dt
        _counts[stage] += 1
        if observer is not None:
            observer(stage, dt)


def totals() -> dict[str, float]:
    return dict(_totals)


def clear() -> None:
    _totals.clear()
    _counts.clear()


def report() -> str:
    if not _totals:
        return "kiln compile times: nothing compiled yet"
    rows = sorted(_totals.items(), key=lambda kv: -kv[1])
    w = max(len(k) for k, _ in rows)
    lines = [f"{'stage'.ljust(w)}  seconds   calls"]
    for k, v in rows:
        lines.append(f"{k.ljust(w)}  {v:8.4f}  {_counts[k]:6d}")
    return "\n".join(lines)
