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
from kiln.capture.sources import ItemSource, LocalSource
from kiln.shapes.marks import marked


def mode() -> str:
    m = config.dynamic_shapes
    return {"none": "auto", "1": "true", "0": "false"}.get(str(m).lower(), str(m).lower())


class DynamicPolicy:
    """Per compiled function (one code object): the sizes its first trace read from
    the call's tensors and ints, and those that have since changed. A tensor is
    tracked by its source (``L['x']``, ``L['kwargs']['ids']``, ``L['out'].logits``)
    when that source starts at the frame's arguments; parameters and globals are not."""

    def __init__(self):
        self.seen: dict = {}        # source expression -> (source, shape tuple)
        self.seen_ints: dict = {}   # argument name -> int
        self.auto_dims: dict = {}   # source expression -> set of dims now dynamic
        self.auto_ints: set = set()

    # --- what a trace asks --------------------------------------------------------
    def tensor_dims(self, source, real: torch.Tensor) -> dict:
        """{dim: (min, max, marked)} of the dims traced symbolic."""
        dyn, maybe, static = marked(real)
        out = {d: (lo, hi, True) for d, (lo, hi) in dyn.items()}
        m = mode()
        if m == "false" and not out:
            return {}
        auto = self.auto_dims.get(source.expr(), ()) if m == "auto" else ()
        every = m == "true" and _argument(source) and not isinstance(real, torch.nn.Parameter)
        for d, n in enumerate(real.shape):
            if d in out or d in static or n in (0, 1):
                continue
            if d in maybe or every or d in auto:
                out[d] = (None, None, False)
        return out

    def specialises_small(self, source, real: torch.Tensor) -> bool:
        """Is a dim of ``real`` that would be symbolic (automatic, ``dynamic=True``, or
        maybe-marked) static in this trace only because its size is 0 or 1? Such a
        trace is one size of a stream (``kernels/size_prebuild`` may build it on a
        thread)."""
        dyn, maybe, static = marked(real)
        m = mode()
        if m == "false":
            return False
        auto = self.auto_dims.get(source.expr(), ()) if m == "auto" else ()
        every = m == "true" and _argument(source) and not isinstance(real, torch.nn.Parameter)
        return any(n in (0, 1) and d not in dyn and d not in static
                   and (d in maybe or every or d in auto) for d, n in enumerate(real.shape))

    def int_dynamic(self, source, value) -> bool:
        if type(value) is not int or value in (0, 1) or not isinstance(source, LocalSource):
            return False
        m = mode()
        return m == "true" or (m == "auto" and source.name in self.auto_ints)

    # --- what calls show ------------------------------------------------------------
    def record(self, entry, bound: dict) -> None:
        """After a trace: the sizes of the argument-rooted tensors it read."""
        for source, shape in entry.tensor_inputs:
            if _rooted(source):
                self.seen.setdefault(source.expr(), (source, shape))
        for name, v in bound.items():
            if type(v) is int:
                self.seen_ints.setdefault(name, v)

    def changes(self, bound: dict, namespace: dict) -> list:
        """(source, dim) of each size that differs from the first trace's, and
        (argument name, None) of each int."""
        with torch._C.DisableTorchFunction():   # a user's function mode sees none of this
            return self._changes(bound, namespace)

    def _changes(self, bound, namespace):
        env = dict(namespace)
        env.update(bound)
        out = []
        for e, (source, old) in self.seen.items():
            try:
                new = eval(e, env)   # noqa: S307  (a source expression kiln generated)
            except Exception:  # noqa: BLE001  (not there any more: not a size change)
                continue
            if isinstance(new, torch.Tensor) and new.dim() == len(old):
                out += [(source, d) for d, (a, b) in enumerate(zip(old, new.shape)) if a != b]
        for name, old in self.seen_ints.items():
            v = bound.get(name)
            if type(v) is int and v != old:
                out.append((name, None))
        return out

    def observe(self, bound: dict, namespace: dict) -> list:
        """Make the changed sizes dynamic ("auto" only); the log lines saying so."""
        if mode() != "auto":
            return []
        said = []
        for src, d in self.changes(bound, namespace):
            if d is None:
                if src not in self.auto_ints:
                    self.auto_ints.add(src)
                    said.append(f"L[{src!r}] is now dynamic")
            elif d not in self.auto_dims.setdefault(src.expr(), set()):
                self.auto_dims[src.expr()].add(d)
                said.append(f"dim {d} of {src.pretty()} is now dynamic")
        return said


def _rooted(source) -> bool:
    """Whether ``source`` starts at one of the frame's arguments."""
    while not isinstance(source, LocalSource):
        source = getattr(source, "base", None)
        if source is None:
            return False
    return True


def _argument(source) -> bool:
    """An argument, or an item of one (``*args``, ``**kwargs``, a list passed in)."""
    while isinstance(source, ItemSource):
        source = source.base
    return isinstance(source, LocalSource)
