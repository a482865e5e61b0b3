"""``os.environ`` reads during a trace (library switches such as
``os.environ.get("TRANSFORMERS_SDPA_FORCE_GQA", "0")``): answered at trace time and
guarded on the variable's value, so changing it recompiles."""
from __future__ import annotations

import os

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException

_READS = ("get", "__getitem__", "__contains__")


def is_environ(obj) -> bool:
    return obj is os.environ


class EnvironRead(V.Value):
    """A bound read method of ``os.environ``."""

    def __init__(self, name):
        self.name = name

    def python_type(self):
        return type(os.environ.get)

    def call(self, tx, args, kwargs):
        return environ_read(tx, self.name, args, kwargs)


def environ_read(tx, name, args, kwargs):
    if name not in _READS or kwargs:
        raise Unsupported("K0019", f"os.environ.{name}")
    key = args[0].const()
    if not isinstance(key, str):
        raise Unsupported("K0011", "os.environ read with a non-string key")
    value = os.environ.get(key)
    g = tx.output.guards
    env = g.const(os.environ, "env")
    g.expression(f"{env}.get({key!r}) == {value!r}",
                 f"os.environ[{key!r}] is {value!r}" if value is not None else f"{key} is not set",
                 f"{env}.get({key!r})")
    if name == "__contains__":
        return V.ConstantValue(value is not None)
    if value is None:
        if name == "get":
            return args[1] if len(args) > 1 else V.ConstantValue(None)
        raise UserException(V.ExceptionValue(KeyError, [args[0]]))
    return V.ConstantValue(value)
