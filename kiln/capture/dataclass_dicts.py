"""Dataclasses that are also dicts: transformers' ``ModelOutput`` family.

Every transformers model returns one (``CausalLMOutputWithPast`` and ~300 others): a
``@dataclass`` subclass of ``OrderedDict`` whose dict holds the fields that are not
None, in field order, while every field is also an attribute. Inlining its
``__post_init__``/``__setattr__``/``__setitem__`` would need ``super()`` calls into
C-level dict methods, so kiln models the type directly instead: a ``DictValue`` (the
items) plus the attributes. The model applies only when the class keeps ModelOutput's
own methods; a subclass that overrides them is traced as an ordinary object (or
breaks), never approximated.
"""
from __future__ import annotations

import dataclasses

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException

# the methods whose semantics this module implements; a class overriding any of them
# below the ModelOutput base is not modelled
_MODELLED = ("__post_init__", "__setattr__", "__setitem__", "__getitem__", "to_tuple",
             "__delitem__", "setdefault", "pop", "update")
_REFUSED = ("__delitem__", "setdefault", "pop", "update", "popitem", "clear")


def _model_output_base(cls):
    for klass in cls.__mro__:
        if klass.__name__ == "ModelOutput" and "__post_init__" in klass.__dict__ \
                and issubclass(klass, dict):
            return klass
    return None


def is_dataclass_dict(cls) -> bool:
    """``cls`` is a ModelOutput dataclass whose dict/attribute behaviour is the base's."""
    if not (isinstance(cls, type) and issubclass(cls, dict) and dataclasses.is_dataclass(cls)):
        return False
    base = _model_output_base(cls)
    if base is None:
        return False
    for klass in cls.__mro__:
        if klass is base:
            return True
        if any(name in klass.__dict__ for name in _MODELLED):
            return False
    return False


class DataclassDictValue(V.DictValue):
    """A ModelOutput built during the trace: ``items`` is its dict, ``attrs`` every
    field (and any attribute set later)."""

    def __init__(self, cls, attrs: dict, items: dict):
        super().__init__(items, None, cls)
        self.attrs = dict(attrs)

    def __repr__(self):
        return f"{self.cls.__name__}({list(self.items)})"

    def field_names(self):
        return [f.name for f in dataclasses.fields(self.cls)]

    # --- attribute access -----------------------------------------------------------
    def getattr(self, tx, name):
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return V.ClassValue(self.cls)
        if name == "to_tuple":
            return V.BoundContainerMethod(self, name)
        if hasattr(dict, name):
            return V.BoundContainerMethod(self, name)
        from kiln.capture.builder import wrap_class_attr

        return wrap_class_attr(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        # ModelOutput.__setattr__: a field set to a non-None value is also an item
        if name in self.field_names() and not _is_none(value):
            self.items[name] = value
        self.attrs[name] = value

    # --- the dict side --------------------------------------------------------------
    def call_method(self, tx, name, args, kwargs):
        if name in self.attrs:
            return self.attrs[name].call(tx, args, kwargs)
        if name == "to_tuple":
            return V.TupleValue(list(self.items.values()))
        if name in _REFUSED:
            raise UserException(V.ExceptionValue(Exception, [V.ConstantValue(
                f"You cannot use ``{name}`` on a {self.cls.__name__} instance.")]))
        if name == "__getitem__":
            return self.getitem(tx, args[0])
        if name == "__setitem__":
            self.setitem(tx, args[0], args[1])
            return V.ConstantValue(None)
        if hasattr(dict, name) and name != "copy":
            return super().call_method(tx, name, args, kwargs)
        from kiln.capture.builder import wrap_class_attr

        return wrap_class_attr(tx, self, self.cls, name).call(tx, args, kwargs)

    def getitem(self, tx, k):
        key = k.const()
        if isinstance(key, str):
            if key not in self.items:
                raise UserException(V.ExceptionValue(KeyError, [k]))
            return self.items[key]
        values = list(self.items.values())
        try:
            r = values[key]
        except (IndexError, TypeError) as e:
            raise UserException(V.ExceptionValue(type(e), [V.ConstantValue(str(e))]))
        return V.TupleValue(r) if isinstance(key, slice) else r

    def setitem(self, tx, k, v):
        key = k.const()
        self.items[key] = v
        self.attrs[key] = v

    def rebuild_kwargs(self):
        """Constructor keyword arguments that rebuild this object exactly, or None
        when the state is one the constructor cannot produce."""
        names = self.field_names()
        if set(self.attrs) - set(names):
            return None
        natural = {n: self.attrs[n] for n in names if n in self.attrs and not _is_none(self.attrs[n])}
        if list(natural) != list(self.items) or any(natural[k] is not self.items[k] for k in natural):
            return None
        return {n: self.attrs[n] for n in names if n in self.attrs}


_is_none = V.is_none


def construct(tx, cls, args, kwargs):
    """``cls(*args, **kwargs)``: the dataclass ``__init__`` then ModelOutput's
    ``__post_init__`` (fields that are not None become items, in field order)."""
    fields = [f for f in dataclasses.fields(cls)]
    init_fields = [f for f in fields if f.init]
    if len(args) > len(init_fields):
        raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
            f"{cls.__name__}.__init__() takes {len(init_fields) + 1} positional arguments")]))
    attrs = {}
    for f, a in zip(init_fields, args):
        attrs[f.name] = a
    for k, a in kwargs.items():
        if k in attrs or k not in {f.name for f in init_fields}:
            raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
                f"{cls.__name__}.__init__() got an unexpected or repeated keyword argument {k!r}")]))
        attrs[k] = a
    for f in fields:
        if f.name in attrs:
            continue
        if f.default is not dataclasses.MISSING:
            from kiln.capture.builder import wrap_static

            attrs[f.name] = wrap_static(f.default)
        elif f.init:
            raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
                f"{cls.__name__}.__init__() missing required argument {f.name!r}")]))
        else:
            raise Unsupported("K0024", f"{cls.__name__}: a field with a default factory")
    if not fields:
        raise UserException(V.ExceptionValue(ValueError, [V.ConstantValue(f"{cls.__name__} has no fields.")]))
    first = attrs[fields[0].name]
    others_none = all(_is_none(attrs[f.name]) for f in fields[1:])
    items = {}
    if others_none and not isinstance(first, V.TensorValue):
        if not _is_none(first):
            # ModelOutput then treats the first field as an iterator of (key, value)
            raise Unsupported("K0024", f"{cls.__name__} built from a non-tensor first field")
    else:
        for f in fields:
            if not _is_none(attrs[f.name]):
                items[f.name] = attrs[f.name]
    return DataclassDictValue(cls, attrs, items)
