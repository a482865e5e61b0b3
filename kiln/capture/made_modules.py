"""``nn.Module``s constructed inside the compiled function.

A ``torch.nn`` layer without parameters or buffers (``nn.ReLU()``, ``nn.Softmax(dim)``,
``nn.Dropout(p)``, a ``Sequential`` of such layers) made from constant arguments is
built for real at trace time — its ``__init__`` is torch's own, which only stores the
arguments — and called like any module. The built object is a template private to the
trace: attribute writes the program makes (``m.eval()``) stay on the Value, and a
module that would outlive the graph (returned, stored) is a graph break, since eager
hands back a new object on every call.

Layers that make parameters or buffers (random initialisation each call) and user
subclasses (whose ``__init__`` may do anything) are graph breaks.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.operators import fold


class MadeModuleValue(V.ModuleValue):
    made_in_trace = True

    def __init__(self, mod):
        super().__init__(mod, None)
        self.shared = False  # handed to another made module: its writes would not reach it

    def setattr(self, tx, name, value):
        if self.shared:
            raise Unsupported("setting an attribute of a module made in the trace after it was put in another")
        if isinstance(value, V.TensorValue):
            raise Unsupported("storing a tensor on a module made in the trace")
        self.attrs[name] = value

    def __repr__(self):
        return f"MadeModule({type(self.mod).__qualname__})"


def _real_arg(v):
    if isinstance(v, MadeModuleValue):
        if v.attrs:
            raise Unsupported("a module made in the trace, changed since, passed to another module")
        v.shared = True
        return v.mod
    return v.const()


def construct(tx, cls, args, kwargs):
    if not (cls.__module__ or "").startswith("torch.nn."):
        raise Unsupported(f"creating an nn.Module ({cls.__qualname__}) inside a compiled region: "
                          "its __init__ is user code")
    try:
        rargs = [_real_arg(a) for a in args]
        rkw = {k: _real_arg(v) for k, v in kwargs.items()}
    except Unsupported as e:
        raise Unsupported(f"creating {cls.__qualname__} inside a compiled region from non-constant arguments ({e})")
    mod = fold(cls, *rargs, **rkw)
    if any(True for _ in mod.parameters()) or any(True for _ in mod.buffers()):
        raise Unsupported(f"creating {cls.__qualname__} inside a compiled region makes parameters or buffers")
    return tx.output.remember(mod, MadeModuleValue(mod))
