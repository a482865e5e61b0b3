"""What a compiled graph keeps alive, step by step, from its plan alone (no run).

A training step's peak memory is usually inside its backward graph. ``timeline(rt)``
replays a ``Runtime``'s allocation plan (``alloc_at``/``drop_at``, library results as
their steps make them) and gives, for each step, the bytes alive while it runs and
which buffers hold them; ``peak(rt)`` the largest. Inputs count as alive until their
last reader, as in a boxed call (the backward's). Used by tests and when asking why a graph's memory
is what it is; it allocates nothing.
"""
from __future__ import annotations

from .. import ir


def _nbytes(sizes, strides, dtype) -> int:
    return ir.span(sizes, strides) * dtype.itemsize


def _buffer_bytes(b) -> int:
    return _nbytes(b.sizes, b.strides, b.dtype)


def timeline(rt) -> list[tuple[int, dict]]:
    """Per step: (bytes alive while it runs, {holder: bytes}); a holder is a buffer name
    or, for a memory slot shared by several buffers, its members joined by '|'. A step
    of several kernels (a launch segment) holds every slot it uses for its whole run."""
    live: dict[str, int] = {}
    for _, name in rt.inputs:
        live[name] = _buffer_bytes(rt.buffers[name])
    slot_key = {}
    for s, members in (x for at in rt.alloc_at for x in at):
        slot_key[s] = "|".join(members)
    out = []

    def alloc(todo):
        for s, members in todo:
            sz, st, dt = rt.slot_specs[s]
            live[slot_key[s]] = _nbytes(sz, st, dt)
    for i, step in enumerate(rt.steps):
        alloc(rt.alloc_at[i])
        b = getattr(step, "b", None)
        if isinstance(b, ir.Extern):
            for name in (b.name, *b.outputs):
                buf = rt.buffers.get(name)
                if buf is not None and name not in rt.sched.slots:
                    live[name] = _buffer_bytes(buf)
        out.append((sum(live.values()), dict(live)))
        dropped = set(rt.drop_at[i])
        for key in [k for k in live if set(k.split("|")) & dropped]:
            del live[key]
    return out


def peak(rt) -> tuple[int, int, dict]:
    """(peak bytes, step index, {holder: bytes} alive there)."""
    tl = timeline(rt)
    if not tl:
        return 0, -1, {}
    i = max(range(len(tl)), key=lambda k: tl[k][0])
    return tl[i][0], i, tl[i][1]
