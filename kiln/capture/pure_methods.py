"""Library methods that are pure functions of their receiver's state, evaluated for
real at trace time instead of being interpreted.

transformers' ``PreTrainedConfig.get_text_config()`` deep-copies the config and
renames keys through ``to_dict()`` (encoder-decoder models call it each forward when
they build their cache): hundreds of lines of serialization code with no tensor in
sight. kiln calls it once while tracing and keeps the result as a constant, guarded by
a snapshot of the receiver's ``__dict__`` (compared with ``==``: a changed config
recompiles). The result has no source, so the program cannot write to it without a
graph break.
"""
from __future__ import annotations

import copy

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.sources import AttrSource

# (module prefix, qualified names) of the methods treated as pure
_PURE = {
    "transformers": ("PreTrainedConfig.get_text_config", "PretrainedConfig.get_text_config"),
}


def is_pure_method(fn) -> bool:
    mod = getattr(fn, "__module__", "") or ""
    names = _PURE.get(mod.split(".")[0])
    return bool(names) and getattr(fn, "__qualname__", None) in names


class PureMethodValue(V.Value):
    """``obj.method`` for a pure method of a source-backed object."""

    def __init__(self, ov, fn):
        self.ov = ov
        self.fn = fn

    def call(self, tx, args, kwargs):
        ov = self.ov
        if ov.source is None or ov.attrs:
            raise Unsupported("K0011", f"{self.fn.__qualname__} on an object changed or made during the trace")
        try:
            cargs = [a.const() for a in args]
            ckw = {k: a.const() for k, a in kwargs.items()}
        except Unsupported:
            raise Unsupported("K0011", f"{self.fn.__qualname__} with non-constant arguments")
        obj = ov.obj
        snapshot = copy.deepcopy(obj.__dict__)
        g = tx.output.guards
        g.equal(AttrSource(ov.source, "__dict__"), snapshot,
                f"{ov.source.pretty()} is unchanged since it was traced ({self.fn.__qualname__})")
        result = self.fn(obj, *cargs, **ckw)
        from kiln.capture.builder import wrap_static

        return wrap_static(result)
