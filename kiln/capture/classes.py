"""Calling a class during a trace: builtin types, torch value types, grad-mode context
managers, exceptions, namedtuples, and user classes (a new object whose ``__init__`` is
inlined)."""
from __future__ import annotations

import abc
import types

import torch

from kiln.capture import values as V
from kiln.capture.builder import lookup_guarded
from kiln.capture.errors import Unsupported


def construct(tx, cv, args, kwargs):
    from kiln.capture.builtins import BUILTINS

    cls = cv.cls
    h = BUILTINS.get(cls)
    if h is not None:
        return h(tx, *args, **kwargs)
    if cls in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo):
        try:
            return V.ConstantValue(cls(*[a.const() for a in args], **{k: v.const() for k, v in kwargs.items()}))
        except Unsupported:
            raise Unsupported(f"{cls.__name__}() from non-constant values")
    if cls is torch.no_grad:
        return V.GradModeValue(False)
    if cls is torch.enable_grad:
        return V.GradModeValue(True)
    if cls is torch.set_grad_enabled:
        from kiln.capture.torch_rules import _set_grad_enabled

        return _set_grad_enabled(tx, args, kwargs)
    if issubclass(cls, BaseException):
        return V.ExceptionValue(cls, args)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        fields = cls._fields
        vals = list(args)
        defaults = getattr(cls, "_field_defaults", {})
        for f in fields[len(vals):]:
            if f in kwargs:
                vals.append(kwargs[f])
            elif f in defaults:
                from kiln.capture.builder import wrap_static

                vals.append(wrap_static(defaults[f]))
            else:
                raise Unsupported(f"namedtuple {cls.__name__} missing {f}")
        return V.NamedTupleValue(cls, vals)
    from kiln.capture import dataclass_dicts

    if dataclass_dicts.is_dataclass_dict(cls):
        return dataclass_dicts.construct(tx, cls, args, kwargs)
    if issubclass(cls, torch.nn.Module):
        raise Unsupported(f"creating an nn.Module ({cls.__qualname__}) inside a compiled region")
    if issubclass(cls, torch.Tensor):
        raise Unsupported(f"constructing {cls.__qualname__} directly")
    if cls.__module__ in ("builtins",) or cls.__module__.startswith("torch"):
        raise Unsupported(f"constructing {cls.__qualname__}")
    if type(cls) is abc.ABCMeta and cls.__abstractmethods__:
        raise Unsupported(f"instantiating abstract class {cls.__qualname__}")
    if type(cls) not in (type, abc.ABCMeta):  # ABCMeta only adds the abstract-method check
        raise Unsupported(f"a class with metaclass {type(cls).__qualname__}")
    if cls.__new__ is not object.__new__:
        raise Unsupported(f"{cls.__qualname__} defines __new__")
    obj = V.NewObjectValue(cls)
    owner, init = lookup_guarded(tx, cls, "__init__")
    if owner is object:
        if args or kwargs:
            raise Unsupported(f"{cls.__qualname__}() takes no arguments")
    elif isinstance(init, types.FunctionType):
        V.UserFunctionValue(init).call(tx, [obj] + list(args), kwargs)
    else:
        raise Unsupported(f"{cls.__qualname__}.__init__ is not Python code")
    return obj
