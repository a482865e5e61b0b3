"""``tensor.grad`` during a trace: read from the real tensor, written after the graph.

An optimizer reads every parameter's ``.grad`` (and ``zero_grad`` sets it to None).
The gradient of an input leaf is itself an input, read from ``p.grad`` and guarded
like any tensor (or guarded None: eager then skips the parameter, and so does the
trace). A write (``p.grad = None`` or a tensor of the same shape, dtype and device, the
assignments eager accepts) is seen by later reads in the trace and applied to the
real tensor after the graph, in program order with the other side effects.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.sources import AttrSource


class GradWrites(V.ObjectValue):
    """The attribute writes the trace made on one input tensor (applied as
    ``setattr(source, name, value)`` by the entry code, like an object's)."""

    def __init__(self, tv):
        super().__init__(None, tv.source)
        self.tensor = tv

    def python_type(self):
        return torch.Tensor

    def __repr__(self):
        return f"GradWrites({self.tensor})"


def _writes(tx, tv, create=False):
    table = tx.output.grad_writes
    w = table.get(id(tv))
    if w is None and create:
        w = table[id(tv)] = GradWrites(tv)
    return w


def read_grad(tx, tv):
    w = _writes(tx, tv)
    if w is not None and "grad" in w.attrs:
        return w.attrs["grad"]
    real = tx.output.real_input(tv) if tv.source is not None else None
    if real is None:
        if not tv.fake.requires_grad:
            return V.ConstantValue(None)  # a tensor made in the graph has no gradient yet
        raise Unsupported("K0039", "reading .grad of a tensor computed in the graph")
    if real.requires_grad and not real.is_leaf:
        raise Unsupported("K0039", "reading .grad of a non-leaf tensor")
    from kiln.capture.builder import wrap

    return wrap(tx, real.grad, AttrSource(tv.source, "grad"))


@V.rule
def write_grad(tx, tv, value):
    if tv.source is None or tx.output.real_input(tv) is None:
        raise Unsupported("K0039", "setting .grad of a tensor computed in the graph")
    if isinstance(value, V.TensorValue):
        f, g = tv.fake, value.fake
        if (f.shape, f.dtype, f.device) != (g.shape, g.dtype, g.device):
            raise Unsupported("K0039", "assigning a .grad of another shape, dtype or device")
    elif not (isinstance(value, V.ConstantValue) and value.value is None):
        raise Unsupported("K0039", f"assigning {value} to .grad")
    w = _writes(tx, tv, create=True)
    w.attrs["grad"] = value
    tx.output.mark_mutated(w)
