"""Logging and warnings inside traced code: ``logger.warning_once(...)``,
``logger.info(...)``, ``warnings.warn(...)``.

They change nothing a graph computes, so they must not break it — but dropping them
would lose the user's messages. kiln records each call (with constant arguments) as a
deferred side effect: it runs, for real, after the graph, in program order with the
other side effects. ``logger.isEnabledFor(level)`` is answered at trace time and guarded.
A message built from a tensor's values needs those values: that is a graph break.
"""
from __future__ import annotations

import logging
import warnings

from kiln.capture import values as V
from kiln.capture.errors import Unsupported

LOG_METHODS = frozenset({"debug", "info", "warning", "warn", "error", "critical", "exception",
                         "log", "warning_once", "info_once", "warning_advice"})


def is_logger(obj) -> bool:
    return isinstance(obj, (logging.Logger, logging.LoggerAdapter))


def _constant_args(name, args, kwargs):
    def ok(v):
        if isinstance(v, V.ConstantValue):
            return True
        if isinstance(v, (V.TupleValue, V.ListValue)):
            return all(ok(i) for i in v.items)
        return isinstance(v, V.ClassValue)
    if not all(ok(a) for a in list(args) + list(kwargs.values())):
        raise Unsupported("K0018", f"{name}() with a message built from traced values")


def defer_call(tx, fn, args, kwargs, name):
    """Record ``fn(*args, **kwargs)`` to run after the graph."""
    _constant_args(name, args, kwargs)
    tx.output.mutated.append(("call", fn, list(args), dict(kwargs)))
    return V.ConstantValue(None)


class LoggerMethod(V.Value):
    """``logger.<method>`` of a real logger."""

    def __init__(self, ov, name):
        self.ov = ov
        self.name = name

    def python_type(self):
        return type(getattr(self.ov.obj, self.name))

    def call(self, tx, args, kwargs):
        logger = self.ov.obj
        if self.name in ("isEnabledFor", "getEffectiveLevel"):
            try:
                cargs = [a.const() for a in args]
            except Unsupported:
                raise Unsupported("K0018", f"logger.{self.name} on traced values")
            result = getattr(logger, self.name)(*cargs)
            g = tx.output.guards
            ref = g.const(logger, "log")
            g.expression(f"{ref}.{self.name}(*{g.const(tuple(cargs), 'a')}) == {result!r}",
                         f"logger {getattr(logger, 'name', '?')!r}.{self.name}{tuple(cargs)} is {result!r}")
            return V.ConstantValue(result)
        return defer_call(tx, getattr(logger, self.name), args, kwargs, f"logger.{self.name}")


def logger_attr(ov, name):
    if name in LOG_METHODS or name in ("isEnabledFor", "getEffectiveLevel"):
        return LoggerMethod(ov, name)
    return None


def warn_rule(tx, *args, **kwargs):
    return defer_call(tx, warnings.warn, args, kwargs, "warnings.warn")
