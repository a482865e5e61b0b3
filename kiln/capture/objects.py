"""Attribute reads and writes, dunder calls and truth of user objects (``ObjectValue``).

Reads follow Python's lookup order (data descriptors, instance dict, class attributes,
``__getattr__``) without running unknown descriptors; writes are kept on the Value and
applied to the real object after the graph runs.
"""
from __future__ import annotations

import types

import torch

from kiln.capture import values as V
from kiln.capture.builder import lookup_class_attr, lookup_guarded, wrap, wrap_class_attr
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.sources import AttrSource, ItemSource


def _attr_src(ov, name):
    return AttrSource(ov.source, name) if ov.source is not None else None


def _attr_error(obj_type, name):
    return UserException(V.ExceptionValue(AttributeError, [V.ConstantValue(
        f"{obj_type.__qualname__!r} object has no attribute {name!r}")]))


DELETED = V.DELETED  # an attribute the program deleted


def object_delattr(tx, ov, name):
    object_getattr(tx, ov, name)  # AttributeError if it does not exist
    if isinstance(ov, V.NewObjectValue):
        ov.attrs.pop(name, None)
        return
    if ov.source is None:
        raise Unsupported("K0025", "deleting an attribute of an object kiln cannot re-read")
    if name in ov.attrs and name not in getattr(ov.obj, "__dict__", {}):
        ov.attrs.pop(name)  # set and deleted within the trace: the real object never sees it
        if ov.source is not None:
            tx.output.guards.expression(f"not hasattr({ov.source.expr()}, {name!r})",
                                        f"{ov.source.pretty()} has no attribute {name!r}")
        return
    ov.attrs[name] = DELETED
    tx.output.mark_mutated(ov)


@V.rule
def object_getattr(tx, ov, name):
    if name in ov.attrs:
        if ov.attrs[name] is DELETED:
            raise _attr_error(ov.python_type(), name)
        return ov.attrs[name]
    cls = ov.python_type()
    if name == "__class__":
        return V.ClassValue(cls)
    if name == "__dict__":
        if isinstance(ov, V.NewObjectValue):
            from kiln.capture.new_object_dicts import attrs_dict

            return attrs_dict(ov)
        raise Unsupported("K0025", "reading obj.__dict__")
    if name in ("_parameters", "_buffers") and getattr(ov, "functional_overrides", 0):
        raise Unsupported("K0037", f"reading Module.{name} inside torch.func.functional_call")
    from kiln.capture.environ import EnvironRead, is_environ
    from kiln.capture.logging_calls import is_logger, logger_attr

    if is_logger(getattr(ov, "obj", None)) and name not in ov.attrs:
        found = logger_attr(ov, name)
        if found is not None:
            return found

    if is_environ(getattr(ov, "obj", None)) and name in ("get", "__getitem__", "__contains__"):
        return EnvironRead(name)
    from kiln.capture.pure_methods import PureMethodValue, is_pure_method

    _, method = lookup_class_attr(cls, name)
    if isinstance(method, types.FunctionType) and is_pure_method(method) \
            and name not in getattr(getattr(ov, "obj", None), "__dict__", {}):
        tx.output.guards.class_attr(cls, name)
        return PureMethodValue(ov, method)
    if not isinstance(ov, V.NewObjectValue) and _custom_getattribute(cls):
        # a Python __getattribute__ (transformers' configs map aliases through one):
        # read through it for real; the guard re-reads the same way at run time
        try:
            real = getattr(ov.obj, name)
        except AttributeError:
            if ov.source is not None:
                tx.output.guards.expression(f"not hasattr({ov.source.expr()}, {name!r})",
                                            f"{ov.source.pretty()} has no attribute {name!r}")
            raise _attr_error(cls, name) from None
        return wrap(tx, real, _attr_src(ov, name))
    owner, attr = lookup_class_attr(cls, name)
    is_data_descr = owner is not None and (isinstance(attr, property) or (
        hasattr(type(attr), "__set__") and not isinstance(attr, (types.FunctionType,))))
    if is_data_descr and isinstance(attr, property):
        return wrap_class_attr(tx, ov, cls, name)
    if isinstance(ov, V.NewObjectValue):
        if owner is not None:
            return wrap_class_attr(tx, ov, cls, name)
        raise _attr_error(cls, name)
    obj = ov.obj
    if isinstance(obj, torch.nn.Module):
        found = V.rules.module_getattr(tx, ov, name)
        if found is not None:
            return found
    d = getattr(obj, "__dict__", None)
    if d is not None and name in d and not is_data_descr:
        return wrap(tx, d[name], _attr_src(ov, name))
    if owner is not None:
        if is_data_descr and not isinstance(attr, property):
            # slots and C-level descriptors: read the value through the source
            return wrap(tx, getattr(obj, name), _attr_src(ov, name))
        return wrap_class_attr(tx, ov, cls, name)
    ga_owner, ga = lookup_class_attr(cls, "__getattr__")
    if ga_owner is not None and ga_owner is not object and isinstance(ga, types.FunctionType) \
            and ga is not torch.nn.Module.__getattr__:  # the module tables were searched above
        tx.output.guards.class_attr(cls, "__getattr__")
        return V.UserFunctionValue(ga).call(tx, [ov, V.ConstantValue(name)], {})
    if ov.source is not None:
        tx.output.guards.expression(f"not hasattr({ov.source.expr()}, {name!r})",
                                    f"{ov.source.pretty()} has no attribute {name!r}")
    raise _attr_error(cls, name)


def _custom_getattribute(cls) -> bool:
    owner, attr = lookup_class_attr(cls, "__getattribute__")
    return owner not in (None, object, torch.nn.Module) and isinstance(attr, types.FunctionType)


@V.rule
def object_setattr(tx, ov, name, value):
    cls = ov.python_type()
    owner, attr = lookup_guarded(tx, cls, name)
    if owner is not None and isinstance(attr, property):
        if attr.fset is None:
            raise UserException(V.ExceptionValue(AttributeError, [V.ConstantValue(f"property {name!r} has no setter")]))
        V.UserFunctionValue(attr.fset).call(tx, [ov, value], {})
        return
    sa_owner, _ = lookup_class_attr(cls, "__setattr__")
    if sa_owner not in (object, None, torch.nn.Module) and not isinstance(ov, V.NewObjectValue):
        raise Unsupported("K0025", f"{cls.__qualname__} defines __setattr__")
    if isinstance(ov, V.ModuleValue) and isinstance(value, V.TensorValue):
        mod = ov.mod
        if name in mod._parameters:
            raise Unsupported("K0025", "assigning a module parameter inside a compiled region")
    if not isinstance(ov, V.NewObjectValue) and ov.source is None:
        raise Unsupported("K0025", f"setting an attribute of an object kiln cannot re-read")
    ov.attrs[name] = value
    if not isinstance(ov, V.NewObjectValue):
        tx.output.mark_mutated(ov)


def has_dunder(ov, name) -> bool:
    owner, attr = lookup_class_attr(ov.python_type(), name)
    return owner is not None and owner is not object and isinstance(attr, types.FunctionType)


@V.rule
def call_dunder(tx, ov, name, args, kwargs):
    from kiln.capture.environ import environ_read, is_environ

    if is_environ(getattr(ov, "obj", None)):
        return environ_read(tx, name, args, kwargs)
    cls = ov.python_type()
    if cls is dict and name in ("__getitem__", "__contains__", "get") and not ov.attrs:
        return V.rules.opaque_dict_read(tx, ov.obj, name, list(args))
    owner, attr = lookup_guarded(tx, cls, name)
    if owner is None or owner is object:
        raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
            f"{cls.__qualname__!r} object does not support {name}")]))
    if isinstance(attr, types.FunctionType):
        return V.UserFunctionValue(attr).call(tx, [ov] + list(args), kwargs)
    raise Unsupported("K0015", f"{cls.__qualname__}.{name} is implemented in C")


@V.rule
def object_truth(tx, ov):
    for dunder in ("__bool__", "__len__"):
        owner, attr = lookup_guarded(tx, ov.python_type(), dunder)
        if owner is not None and owner is not object:
            if isinstance(attr, types.FunctionType):
                r = V.UserFunctionValue(attr).call(tx, [ov], {})
                return bool(r.const())
            raise Unsupported("K0012", f"truth of {ov}")
    return True


@V.rule
def object_unpack(tx, ov):
    owner, attr = lookup_guarded(tx, ov.python_type(), "__iter__")
    if owner is not None and isinstance(attr, types.FunctionType):
        return list(V.rules.iterate(tx, ov))
    if has_dunder(ov, "__getitem__") and has_dunder(ov, "__len__"):
        n = call_dunder(tx, ov, "__len__", [], {}).const()
        return [call_dunder(tx, ov, "__getitem__", [V.ConstantValue(i)], {}) for i in range(n)]
    if isinstance(ov.obj, (list, tuple)) and ov.source is not None:
        tx.output.guards.length(ov.source, len(ov.obj))
        return [wrap(tx, x, (ItemSource(ov.source, i) if ov.source is not None else None)) for i, x in enumerate(ov.obj)]
    raise Unsupported("K0012", f"iterating over {ov}")


def object_mapping_items(tx, ov):
    obj = ov.obj
    if isinstance(obj, dict) and ov.source is not None:
        tx.output.guards.dict_keys(ov.source, tuple(obj.keys()))
        return [(k, wrap(tx, v, (ItemSource(ov.source, k) if ov.source is not None else None))) for k, v in obj.items()]
    raise Unsupported("K0012", f"** of {ov}")
