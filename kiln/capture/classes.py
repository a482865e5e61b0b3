"""Calling a class during a trace: builtin types, torch value types, grad-mode context
managers, exceptions, namedtuples, and user classes (a new object whose ``__init__`` is
inlined)."""
from __future__ import annotations

import abc
import types

import torch

from kiln.capture import values as V
from kiln.capture.builder import lookup_class_attr, lookup_guarded
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.rule_tables import BUILTINS
from kiln.capture.sources import AttrSource


# torch classes whose instances are plain Python objects made by Python code: traced as
# a user class's are (``__init__`` inlined)
TRACED_TORCH_CLASSES = ("torch.distributions.",)


@V.rule(name="construct_class")
def construct(tx, cv, args, kwargs):
    cls = cv.cls
    h = BUILTINS.get(cls)
    if h is not None:
        from kiln.capture.builtins import apply_rule

        return apply_rule(tx, cls, h, args, kwargs)
    from kiln.capture.stdlib_collections import construct_subclass

    made = construct_subclass(tx, cls, args, kwargs)
    if made is not None:
        return made
    if cls in (torch.Size, torch.device, torch.dtype, torch.finfo, torch.iinfo):
        try:
            return V.ConstantValue(cls(*[a.const() for a in args], **{k: v.const() for k, v in kwargs.items()}))
        except Unsupported:
            raise Unsupported("K0011", f"{cls.__name__}() from non-constant values")
    if cls is torch.no_grad:
        return V.GradModeValue(False)
    if cls is torch.enable_grad:
        return V.GradModeValue(True)
    if issubclass(cls, torch.amp.autocast):
        from kiln.capture import autocast

        return autocast.construct(tx, cls, args, kwargs)
    if cls is torch.set_grad_enabled:
        from kiln.capture.torch_rules import _set_grad_enabled

        return _set_grad_enabled(tx, args, kwargs)
    if issubclass(cls, BaseException):
        return _construct_exception(tx, cls, args, kwargs)
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
                raise Unsupported("K0024", f"namedtuple {cls.__name__} missing {f}")
        return V.NamedTupleValue(cls, vals)
    from kiln.capture import dataclass_dicts

    if dataclass_dicts.is_dataclass_dict(cls):
        return dataclass_dicts.construct(tx, cls, args, kwargs)
    if issubclass(cls, torch.nn.Module):
        from kiln.capture import made_modules

        return made_modules.construct(tx, cls, args, kwargs)
    if issubclass(cls, torch.Tensor):
        raise Unsupported("K0024", f"constructing {cls.__qualname__} directly")
    if cls.__module__ in ("builtins",) or (cls.__module__.startswith("torch")
                                           and not cls.__module__.startswith(TRACED_TORCH_CLASSES)):
        raise Unsupported("K0024", f"constructing {cls.__qualname__}")
    if type(cls) is abc.ABCMeta and cls.__abstractmethods__:
        raise Unsupported("K0024", f"instantiating abstract class {cls.__qualname__}")
    if type(cls) not in (type, abc.ABCMeta):  # ABCMeta only adds the abstract-method check
        raise Unsupported("K0024", f"a class with metaclass {type(cls).__qualname__}")
    if cls.__new__ is not object.__new__:
        raise Unsupported("K0024", f"{cls.__qualname__} defines __new__")
    obj = V.NewObjectValue(cls)
    owner, init = lookup_guarded(tx, cls, "__init__")
    if owner is object:
        if args or kwargs:
            raise Unsupported("K0024", f"{cls.__qualname__}() takes no arguments")
    elif isinstance(init, types.FunctionType):
        V.UserFunctionValue(init).call(tx, [obj] + list(args), kwargs)
    else:
        raise Unsupported("K0024", f"{cls.__qualname__}.__init__ is not Python code")
    return obj


# exception classes whose __init__ only stores its arguments as ``args``
PLAIN_EXCEPTION_INIT = (BaseException, Exception, ArithmeticError, AssertionError, LookupError,
                        IndexError, KeyError, ValueError, TypeError, RuntimeError,
                        NotImplementedError, ZeroDivisionError, OverflowError, RecursionError,
                        Warning, UserWarning, DeprecationWarning, RuntimeWarning, FutureWarning)


def _construct_exception(tx, cls, args, kwargs):
    """``E(*args)``: BaseException.__new__ keeps the arguments as ``args``; a Python
    ``__init__`` then runs inlined (``super().__init__(a)`` resets ``args``, and the
    attributes it sets stay on the Value)."""
    new_owner, _ = lookup_guarded(tx, cls, "__new__")
    if new_owner is None or new_owner.__module__ != "builtins":
        raise Unsupported("K0024", f"{cls.__qualname__} defines __new__")
    _, init = lookup_guarded(tx, cls, "__init__")
    if isinstance(init, types.FunctionType):
        ev = V.ExceptionValue(cls, args, custom_init=True)
        V.UserFunctionValue(init).call(tx, [ev] + list(args), kwargs)
        return ev
    if kwargs:
        raise Unsupported("K0024", f"{cls.__qualname__}() with keyword arguments")
    return V.ExceptionValue(cls, args)


@V.rule
def exception_init(tx, cls, args, kwargs):
    """``BaseException.__init__(self, *args)`` (``super().__init__(msg)`` in a user
    exception's ``__init__``): sets ``self.args``."""
    if cls not in PLAIN_EXCEPTION_INIT or kwargs:
        raise Unsupported("K0024", f"{cls.__qualname__}.__init__ with these arguments")
    args[0].args = list(args[1:])
    return V.ConstantValue(None)


@V.rule
def metaclass_getattr(tx, cv, name):
    """``cls.name`` where ``type(cls)`` is a user metaclass, as ``type.__getattribute__``
    looks it up: a data descriptor of the metaclass (a ``@property``) first, then the
    class's own MRO (None: the caller reads it there), then the metaclass's other
    attributes and its ``__getattr__``."""
    cls = cv.cls
    meta = type(cls)
    m_owner, m_attr = lookup_guarded(tx, meta, name)
    if m_owner is type or m_owner is object:
        m_owner = None  # type's own attributes: ClassValue.getattr and the MRO read them
    if m_owner is not None and _is_data_descriptor(m_attr):
        if isinstance(m_attr, property):
            if m_attr.fget is None:
                raise UserException(V.ExceptionValue(AttributeError, [V.ConstantValue(
                    f"property {name!r} of {meta.__qualname__!r} object has no getter")]))
            return _function_value(m_attr.fget).call(tx, [cv], {})
        return _read_for_real(tx, cv, name)
    if lookup_class_attr(cls, name)[0] is not None:
        return None
    if m_owner is not None:
        if isinstance(m_attr, types.FunctionType):
            return V.MethodValue(V.UserFunctionValue(m_attr), cv)
        if isinstance(m_attr, (staticmethod, classmethod)) or hasattr(type(m_attr), "__get__"):
            return _read_for_real(tx, cv, name)
        from kiln.capture.builder import wrap, wrap_static

        return wrap(tx, m_attr, AttrSource(cv.source, name)) if cv.source is not None else wrap_static(m_attr)
    ga_owner, ga = lookup_class_attr(meta, "__getattr__")
    if ga_owner not in (None, type, object) and isinstance(ga, types.FunctionType):
        return V.UserFunctionValue(ga).call(tx, [cv, V.ConstantValue(name)], {})
    return None


def _is_data_descriptor(attr) -> bool:
    t = type(attr)
    return hasattr(t, "__set__") or hasattr(t, "__delete__")


def _function_value(fn):
    return V.UserFunctionValue(fn) if isinstance(fn, types.FunctionType) else V.BuiltinValue(fn)


def _read_for_real(tx, cv, name):
    """A C-level descriptor of the metaclass: read through the class's source (the
    guard re-reads it the same way)."""
    if cv.source is None:
        raise Unsupported("K0026", f"metaclass attribute {name!r} of {cv.cls.__qualname__} (no source to re-read)")
    from kiln.capture.builder import wrap

    return wrap(tx, getattr(cv.cls, name), AttrSource(cv.source, name))
