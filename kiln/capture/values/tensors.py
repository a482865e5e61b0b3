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
