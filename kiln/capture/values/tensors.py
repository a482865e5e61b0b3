"""Tensors: an FX node and a fake tensor with its metadata; attributes and methods are
torch's rules (``torch_rules``)."""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported, UserException
from kiln.capture.values.base import Value, rules
from kiln.capture.values.constants import ConstantValue, ExceptionValue


class TensorValue(Value):
    """A tensor: the FX node that computes it and a fake tensor with its metadata."""

    def __init__(self, node, fake, source=None):
        self.node = node
        self.fake = fake
        self.source = source

    def python_type(self):
        return type(self.fake) if not hasattr(self.fake, "fake_device") else torch.Tensor

    def truth(self, tx):
        raise Unsupported("K0006", "branching on a tensor's value (data-dependent control flow)")

    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise UserException(ExceptionValue(TypeError, [ConstantValue("iteration over a 0-d tensor")]))
        return list(tx.output.op("call_method", "unbind", [self], {}).unpack(tx))

    def getattr(self, tx, name):
        return rules.tensor_attribute(tx, self, name)

    def setattr(self, tx, name, value):
        if name == "grad":
            return rules.write_grad(tx, self, value)
        raise Unsupported("K0025", f"setting attribute {name!r} on a tensor")

    def call_method(self, tx, name, args, kwargs):
        return rules.tensor_method(tx, self, name, args, kwargs)

    def __repr__(self):
        return f"Tensor({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


class SymIntValue(Value):
    """A number the trace keeps symbolic: a tensor's size, a Python int argument, or
    arithmetic on them. ``node`` computes it in the graph at run time; ``fake`` is the
    ``torch.SymInt`` (or SymFloat) ops receive while tracing. Whatever needs a plain
    int (``const()``, ``range(n)``) gets the traced value and a guard fixing it."""

    def __init__(self, node, sym, source=None):
        self.node = node
        self.fake = sym
        self.source = source

    def python_type(self):
        return float if isinstance(self.fake, torch.SymFloat) else int

    def is_const(self):
        return False

    def const(self):
        return float(self.fake) if isinstance(self.fake, torch.SymFloat) else int(self.fake)

    def truth(self, tx):
        return bool(self.fake != 0)

    def getattr(self, tx, name):     # int's own attributes (bit_length…): of the traced value
        return ConstantValue(self.const()).getattr(tx, name)

    def call_method(self, tx, name, args, kwargs):
        return ConstantValue(self.const()).call_method(tx, name, args, kwargs)

    def __repr__(self):
        return f"SymInt({self.node.name}, {self.fake})"


class SymSliceValue(Value):
    """``a:b:c`` with a symbolic bound (``x[:, : s // 2]``): ops receive a slice of
    SymInts while tracing and the graph a slice of the nodes computing them."""

    def __init__(self, start, stop, step):
        self.parts = (start, stop, step)

    def python_type(self):
        return slice

    def is_const(self):
        return False

    def const(self):
        return slice(*(p.const() for p in self.parts))

    def __repr__(self):
        return f"SymSlice{self.parts}"
