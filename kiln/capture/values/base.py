"""The bottom of the Value classes: ``Value`` (what every symbolic value can be asked),
the NULL CPython pushes below a callable, a lazily wrapped argument, and the two
registries through which values reach what is above them: ``rules`` (behaviour that
needs wrapping, torch's op rules or inlining, registered by the rule modules) and
``kinds`` (classes of a higher family of this package).
"""
from __future__ import annotations

from kiln.capture.errors import InternalError, Unsupported

# "Frame" in annotations: the running interpreter frame (kiln.capture.interpreter.Frame),
# named only: importing it here, even for type checkers, would point an import upward


class _Rules:
    """Value behaviour that needs the layers above this one (wrapping Python objects,
    torch's op rules, inlining): those modules register their functions here when they
    are imported (``@rule``), so values never imports them. ``tracer`` imports them
    all before any trace starts."""

    def __getattr__(self, name):
        raise InternalError(f"no capture rule {name!r} registered (its module was not imported)")


rules = _Rules()


def rule(fn=None, *, name=None):
    """Register ``fn`` in ``rules`` under its own name (or ``name``)."""
    if fn is None:
        return lambda f: rule(f, name=name)
    setattr(rules, name or fn.__name__, fn)
    return fn


class _Kinds:
    """Value classes of higher families, by name, for the few places a lower family makes
    one (a constant's bound builtin method, an exception's ``args`` tuple and class): each
    family registers them when imported (``@kind``) and the package imports every family,
    so the files of this package import only downward."""

    def __getattr__(self, name):
        raise InternalError(f"no Value class {name!r} registered (its family was not imported)")


kinds = _Kinds()


def kind(cls):
    """Register the class ``cls`` in ``kinds`` under its name."""
    setattr(kinds, cls.__name__, cls)
    return cls


class Value:
    source = None

    def python_type(self):
        raise Unsupported("K0013", f"type of {self} is not known")

    def is_const(self) -> bool:
        return False

    def const(self):
        raise Unsupported("K0011", f"{self} is not a Python constant")

    def getattr(self, tx: "Frame", name: str) -> "Value":
        raise Unsupported("K0009", f"attribute {name!r} of {self}")

    def setattr(self, tx: "Frame", name: str, value: "Value"):
        raise Unsupported("K0025", f"setting attribute {name!r} on {self}")

    def call(self, tx: "Frame", args: list, kwargs: dict) -> "Value":
        raise Unsupported("K0010", f"calling {self}")

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx) -> list:
        raise Unsupported("K0012", f"iterating over {self}")

    def truth(self, tx) -> bool:
        raise Unsupported("K0012", f"truth value of {self}")

    def __repr__(self):
        return f"{type(self).__name__}()"


class LazyArg(Value):
    """A root-frame argument not read yet: wrapped (and guarded) on first use only."""

    def __init__(self, real, source):
        self.real = real
        self.source = source


class NullValue(Value):
    """The NULL that CPython 3.11/3.12 push below a callable."""

    def __repr__(self):
        return "NULL"


NULL = NullValue()


def is_mutable(v: Value) -> bool:
    return getattr(v, "mutable", False)
