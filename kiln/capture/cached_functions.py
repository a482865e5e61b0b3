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


# typing's generic-alias subscription (``List[torch.Tensor]``) is cached this way: a pure
# function of constant types, evaluated for real rather than traced through typing.
_PURE_MODULES = ("typing", "typing_extensions")


def _real(v):
    if isinstance(v, V.ObjectValue) and v.obj is not None and not v.attrs:
        return v.obj
    if isinstance(v, V.TupleValue):
        return tuple(_real(i) for i in v.items)
    return v.const()


def _fold(fn, args, kwargs):
    from kiln.capture.builder import wrap_static
    from kiln.capture.operators import fold

    try:
        real_args = [_real(a) for a in args]
        real_kw = {k: _real(v) for k, v in kwargs.items()}
    except Unsupported:
        raise Unsupported("K0011", f"{fn.__qualname__} of non-constant arguments")
    return wrap_static(fold(fn, *real_args, **real_kw))


@V.kind
class CachedFunctionValue(V.Value):
    def __init__(self, wrapper, source=None):
        self.fn = wrapper
        self.source = source

    def python_type(self):
        return LRU_WRAPPER

    def call(self, tx, args, kwargs):
        inner = self.fn.__wrapped__
        if getattr(inner, "__module__", None) in _PURE_MODULES:
            return _fold(self.fn, args, kwargs)
        if not isinstance(inner, types.FunctionType):
            raise Unsupported("K0016", f"a cached {type(inner).__qualname__} (not Python code)")
        return V.UserFunctionValue(inner).call(tx, args, kwargs)

    def getattr(self, tx, name):
        from kiln.capture.builder import wrap_static

        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__wrapped__"):
            return wrap_static(getattr(self.fn, name))
        raise Unsupported("K0009", f"attribute {name!r} of an lru_cache wrapper")

    def __repr__(self):
        return f"Cached({self.fn.__wrapped__.__qualname__})"


@V.rule
def wrap_cached(tx, obj, source):
    if source is not None:
        tx.output.guards.identity(source, obj)
    return CachedFunctionValue(obj, source)
