"""Calling a ``functools.lru_cache`` / ``functools.cache`` wrapped function during a
trace: the wrapped Python function is inlined and the cache is neither read nor
written. The traced result is what the function computes; a function whose answer
depends on its cache (an impure one) is outside what a cache may wrap anyway.

The wrapper itself is guarded by identity where it was read; ``__wrapped__`` of an
lru_cache wrapper is fixed when it is made.
"""
from __future__ import annotations

import functools
import types

from kiln.capture import values as V
from kiln.capture.errors import Unsupported

LRU_WRAPPER = functools._lru_cache_wrapper  # the C type of both decorators' result


class CachedFunctionValue(V.Value):
    def __init__(self, wrapper, source=None):
        self.fn = wrapper
        self.source = source

    def python_type(self):
        return LRU_WRAPPER

    def call(self, tx, args, kwargs):
        inner = self.fn.__wrapped__
        if not isinstance(inner, types.FunctionType):
            raise Unsupported(f"a cached {type(inner).__qualname__} (not Python code)")
        return V.UserFunctionValue(inner).call(tx, args, kwargs)

    def getattr(self, tx, name):
        from kiln.capture.builder import wrap_static

        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return wrap_static(getattr(self.fn, name))
        raise Unsupported(f"attribute {name!r} of an lru_cache wrapper")

    def __repr__(self):
        return f"Cached({self.fn.__wrapped__.__qualname__})"


def wrap_cached(tx, obj, source):
    if source is not None:
        tx.output.guards.identity(source, obj)
    return CachedFunctionValue(obj, source)
