"""``functools.update_wrapper`` (and so ``functools.wraps``) applied during a trace to a
function made in it: the wrapped function's name, qualname, module, docstring,
annotations and ``__dict__`` are copied onto the new function's attributes, with
``__wrapped__``, as CPython's does. The attributes live on the function's Value
(``attrs``); such a function cannot be rebuilt after the graph (a break there).
"""
from __future__ import annotations

import functools
import types

from kiln.capture import values as V
from kiln.capture.rule_tables import BUILTINS
from kiln.capture.errors import Unsupported


def _nested_attr(fv, name):
    """What ``getattr`` gives for a function made in the trace (None: not known)."""
    attrs = getattr(fv, "attrs", {})
    if name in attrs:
        return attrs[name]
    if name == "__module__":
        return V.ConstantValue(fv.f_globals.get("__name__"))
    if name == "__name__":
        return V.ConstantValue(fv.qualname.rsplit(".", 1)[-1])
    if name == "__qualname__":
        return V.ConstantValue(fv.qualname)
    if name == "__doc__":
        consts = fv.code.co_consts
        return V.ConstantValue(consts[0] if consts and isinstance(consts[0], str) else None)
    if name == "__annotations__" and not getattr(fv, "has_annotations", True):
        return V.DictValue({})
    if name == "__type_params__":
        return V.ConstantValue(())
    if name == "__dict__":
        return V.DictValue({k: v for k, v in attrs.items() if not k.startswith("__")})
    return None


def _real_attrs(fn, names):
    from kiln.capture.builder import wrap_static

    out = {}
    for name in names:
        if hasattr(fn, name):
            out[name] = wrap_static(getattr(fn, name))
    return out


def _update_wrapper(tx, wrapper, wrapped, assigned=None, updated=None):
    assigned = functools.WRAPPER_ASSIGNMENTS if assigned is None else assigned.const()
    updated = functools.WRAPPER_UPDATES if updated is None else updated.const()
    if not isinstance(wrapper, V.NestedFunctionValue) or tuple(updated) not in ((), ("__dict__",)):
        raise Unsupported("K0009", "functools.update_wrapper of a function kiln did not make in the trace")
    if isinstance(wrapped, V.NestedFunctionValue):
        values = {}
        for name in assigned:
            v = _nested_attr(wrapped, name)
            if v is None:
                raise Unsupported("K0009", f"functools.update_wrapper reading {name!r} of a function made in the trace")
            values[name] = v
        extra = dict(getattr(wrapped, "attrs", {})) if updated else {}
    elif isinstance(getattr(wrapped, "fn", None), (types.FunctionType, types.BuiltinFunctionType)) or \
            hasattr(getattr(wrapped, "fn", None), "__wrapped__"):
        real = wrapped.fn
        values = _real_attrs(real, assigned)
        extra = _real_attrs(real, list(getattr(real, "__dict__", {}))) if updated else {}
    else:
        raise Unsupported("K0009", f"functools.update_wrapper of {wrapped}")
    attrs = wrapper.__dict__.setdefault("attrs", {})
    attrs.update(values)
    for k, v in extra.items():
        if k != "__wrapped__":
            attrs[k] = v
    attrs["__wrapped__"] = wrapped
    return wrapper


BUILTINS[functools.update_wrapper] = _update_wrapper
