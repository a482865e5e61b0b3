"""Which sizes of a compiled function's arguments are traced symbolic.

``kiln.config.dynamic_shapes`` (``kiln.compile(dynamic=...)``): "auto" (torch's
``dynamic=None``) traces every size static first, and when a later call misses only
because an argument's size (or a Python int argument) changed, that dim (that int) is
symbolic from the next trace on, so a stream of sizes makes two graphs; "true" makes
every size of every argument symbolic from the first trace; "false" never. Sizes 0 and
1 stay static unless the user marks the dim (``kiln.mark_dynamic``), as PyTorch does.
Only the frame's own arguments are tracked this way (parameters and globals keep their
sizes); the user's marks count wherever the tensor is read.
"""
from __future__ import annotations

import torch

from kiln import config
from kiln.capture.sources import LocalSource
from kiln.shapes.marks import marked


def mode() -> str:
    m = config.dynamic_shapes
    return {"none": "auto", "1": "true", "0": "false"}.get(str(m).lower(), str(m).lower())


class DynamicPolicy:
    """Per compiled function (one code object): what its first trace saw and which
    dims have since changed."""

    def __init__(self):
        self.seen: dict = {}        # argument name -> shape tuple or int
        self.auto_dims: dict = {}   # argument name -> set of dims now dynamic
        self.auto_ints: set = set()

    # --- what a trace asks --------------------------------------------------------
    def tensor_dims(self, source, real: torch.Tensor) -> dict:
        """{dim: (min, max, marked)} of the dims traced symbolic."""
        dyn, maybe, static = marked(real)
        out = {d: (lo, hi, True) for d, (lo, hi) in dyn.items()}
        m = mode()
        if m == "false" and not out:
            return {}
        name = source.name if isinstance(source, LocalSource) else None
        for d, n in enumerate(real.shape):
            if d in out or d in static or n in (0, 1):
                continue
            if d in maybe or (name is not None and (
                    m == "true" or d in self.auto_dims.get(name, ()))):
                out[d] = (None, None, False)
        return out

    def int_dynamic(self, source, value) -> bool:
        if type(value) is not int or value in (0, 1) or not isinstance(source, LocalSource):
            return False
        m = mode()
        return m == "true" or (m == "auto" and source.name in self.auto_ints)

    # --- what calls show ------------------------------------------------------------
    def record(self, bound: dict) -> None:
        for name, v in bound.items():
            if name not in self.seen:
                s = _summary(v)
                if s is not None:
                    self.seen[name] = s

    def changes(self, bound: dict) -> list:
        """(name, dim or None) of each size (int) that differs from the first call's."""
        out = []
        for name, v in bound.items():
            old, new = self.seen.get(name), _summary(v)
            if old is None or new is None or type(old) is not type(new):
                continue
            if isinstance(new, int):
                if old != new:
                    out.append((name, None))
            elif len(old) == len(new):
                out += [(name, d) for d, (a, b) in enumerate(zip(old, new)) if a != b]
        return out

    def observe(self, bound: dict) -> list:
        """Make the changed sizes dynamic ("auto" only); the log lines saying so."""
        if mode() != "auto":
            return []
        said = []
        for name, d in self.changes(bound):
            if d is None:
                if name not in self.auto_ints:
                    self.auto_ints.add(name)
                    said.append(f"L[{name!r}] is now dynamic")
            elif d not in self.auto_dims.setdefault(name, set()):
                self.auto_dims[name].add(d)
                said.append(f"dim {d} of L[{name!r}] is now dynamic")
        return said


def _summary(v):
    if isinstance(v, torch.Tensor):
        return tuple(v.shape)
    if type(v) is int:
        return v
    return None
