"""Constants: immutable Python values known at trace time, and exceptions made or
raised by the traced program (what a failing operation on any value raises)."""
from __future__ import annotations

import types

from kiln.capture.errors import Unsupported, UserException
from kiln.capture.sources import ItemSource
from kiln.capture.values.base import Value, kinds, rules


class ConstantValue(Value):
    """An immutable Python value known at trace time (int, str, None, dtype, slice…)."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def is_const(self):
        return True

    def const(self):
        return self.value

    def truth(self, tx):
        return bool(self.value)

    def unpack(self, tx):
        try:
            items = list(self.value)
        except TypeError:
            raise UserException(ExceptionValue(TypeError, [ConstantValue(
                f"{type(self.value).__name__!r} object is not iterable")]))
        if self.source is not None and isinstance(self.value, (tuple, list)):
            return [ConstantValue(v, ItemSource(self.source, i)) for i, v in enumerate(items)]
        return [ConstantValue(v) for v in items]

    def getattr(self, tx, name):
        try:
            v = getattr(self.value, name)
        except AttributeError as e:
            raise UserException(ExceptionValue(AttributeError, [ConstantValue(str(e))]))
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)):
            return kinds.BuiltinValue(v)
        return rules.wrap_static(v)

    def __repr__(self):
        return f"Const({self.value!r})"


class ExceptionValue(Value):
    """An exception instance raised or created by the traced program: its ``args`` and
    the attributes its ``__init__`` set (``custom_init``: that ``__init__`` is Python
    code, so it is rebuilt from this state, not by calling the class again)."""

    def __init__(self, cls, args, custom_init=False):
        self.cls = cls
        self.args = list(args)
        self.attrs: dict = {}
        self.custom_init = custom_init

    @classmethod
    def of_real(cls_, e: BaseException):
        """The Value of a real exception raised while tracing (by a folded builtin, an
        op): its args and attributes as they are."""
        _, init = rules.lookup_class_attr(type(e), "__init__")
        ev = cls_(type(e), [rules.wrap_static(a) for a in e.args], custom_init=isinstance(init, types.FunctionType))
        if ev.custom_init:
            ev.attrs = {k: rules.wrap_static(a) for k, a in vars(e).items()}
        return ev

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        if name == "args":
            return kinds.TupleValue(self.args)
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return kinds.ClassValue(self.cls)
        if name in ("__cause__", "__context__", "__traceback__", "__notes__", "__suppress_context__"):
            raise Unsupported("K0031", f"{name} of an exception made in the trace")
        if name == "value" and issubclass(self.cls, StopIteration) and not self.custom_init:
            return self.args[0] if self.args else ConstantValue(None)
        _, attr = rules.lookup_class_attr(self.cls, name)
        if isinstance(attr, (types.MemberDescriptorType, types.GetSetDescriptorType)):
            raise Unsupported("K0031", f"{self.cls.__name__}.{name} (kept by the exception's C code)")
        return rules.wrap_class_attr(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        if name == "args":
            self.args = value.unpack(tx)
            return
        if name.startswith("__"):
            raise Unsupported("K0031", f"setting {name} of an exception")
        self.attrs[name] = value

    def __repr__(self):
        return f"Exception({self.cls.__name__}, {self.args})"


def C(v) -> ConstantValue:
    """A constant (the short name rule tables write)."""
    return ConstantValue(v)


def is_none(v) -> bool:
    """Is ``v`` the constant None (an argument left out)?"""
    return isinstance(v, ConstantValue) and v.value is None
