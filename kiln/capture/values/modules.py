"""Modules: Python modules (their members wrapped and guarded as read) and
``nn.Module`` instances (calls inline forward and hooks: ``modules.py``'s rules)."""
from __future__ import annotations

import types

from kiln.capture.errors import UserException
from kiln.capture.sources import AttrSource
from kiln.capture.values.base import Value, rules
from kiln.capture.values.constants import ConstantValue, ExceptionValue
from kiln.capture.values.objects import ObjectValue


class PythonModuleValue(Value):
    """A Python module (torch, math, operator, the user's own)."""

    def __init__(self, mod, source=None):
        self.mod = mod
        self.source = source

    def python_type(self):
        return types.ModuleType

    def getattr(self, tx, name):
        try:
            v = getattr(self.mod, name)
        except AttributeError as e:
            if self.source is not None:     # the program may set it later
                tx.output.guards.expression(f"not hasattr({self.source.expr()}, {name!r})",
                                            f"{self.source.pretty()} has no attribute {name!r}")
            raise UserException(ExceptionValue(AttributeError, [ConstantValue(str(e))]))
        return rules.wrap(tx, v, AttrSource(self.source, name) if self.source else None, module_member=True)

    def __repr__(self):
        return f"Module({self.mod.__name__})"


class ModuleValue(ObjectValue):
    """An ``nn.Module`` instance; calls inline its forward (and hooks)."""

    def __init__(self, mod, source=None):
        super().__init__(mod, source)

    @property
    def mod(self):
        return self.obj

    def call(self, tx, args, kwargs):
        return rules.call_module(tx, self, args, kwargs)

    def unpack(self, tx):
        return rules.module_items(tx, self)

    def truth(self, tx):
        return True

    def __repr__(self):
        return f"NNModule({type(self.obj).__qualname__})"
