"""Objects: classes, user objects (their attribute protocol is ``objects.py``'s rules),
``super()``, ``autograd.Function.apply``, and context managers the trace models as state."""
from __future__ import annotations

import torch

from kiln.capture.errors import Unsupported
from kiln.capture.values.base import Value, kind, rules
from kiln.capture.values.constants import ConstantValue
from kiln.capture.values.tensors import TensorValue


@kind
class ClassValue(Value):
    """A class: builtin types, torch classes, user classes."""

    def __init__(self, cls, source=None):
        self.cls = cls
        self.source = source

    def python_type(self):
        return type(self.cls)

    def is_const(self):
        return True

    def const(self):
        return self.cls

    def call(self, tx, args, kwargs):
        return rules.construct_class(tx, self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__mro__", "__bases__", "__doc__"):
            return rules.wrap_static(getattr(self.cls, name))
        if name == "__class__":  # the metaclass (not object's __class__ descriptor)
            return ClassValue(type(self.cls))
        if name == "apply" and isinstance(self.cls, type) and issubclass(self.cls, torch.autograd.Function) \
                and _defined_by_torch(self.cls, "apply"):
            return AutogradFunctionApply(self.cls)
        if type(self.cls) is not type:  # a metaclass's data descriptors come first
            found = rules.metaclass_getattr(tx, self, name)
            if found is not None:
                return found
        return rules.wrap_class_attr(tx, None, self.cls, name, source=self.source)

    def __repr__(self):
        return f"Class({self.cls.__qualname__})"


def _defined_by_torch(cls, name) -> bool:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return (klass.__module__ or "").startswith("torch")
    return False


class AutogradFunctionApply(Value):
    """``MyFunction.apply``: one graph node. Its fake result comes from running the
    user's forward on fake tensors; eager backends call it for real, and the autograd
    stage traces the user's backward through PyTorch's engine like any other op."""

    _targets: dict = {}

    def __init__(self, cls):
        self.cls = cls
        self.fn = self._target(cls)

    @classmethod
    def _target(cls_, fn_cls):
        """A named Python function for the graph node (FX cannot name a builtin
        classmethod of a user class)."""
        fn = cls_._targets.get(fn_cls)
        if fn is None:
            def apply(*args, **kwargs):
                return fn_cls.apply(*args, **kwargs)
            apply.__name__ = f"{fn_cls.__name__}_apply"
            apply.__qualname__ = apply.__name__
            apply.__module__ = fn_cls.__module__
            fn = cls_._targets[fn_cls] = apply
        return fn

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        if any(not isinstance(a, (TensorValue, ConstantValue)) for a in list(args) + list(kwargs.values())):
            raise Unsupported("K0045", f"{self.cls.__qualname__}.apply with non-tensor, non-constant arguments")
        return tx.output.op("call_function", self.fn, list(args), dict(kwargs))

    def __repr__(self):
        return f"AutogradFunctionApply({self.cls.__qualname__})"


class ObjectValue(Value):
    """An existing Python object reached through a source (a config, a user object)."""

    mutable = True

    def __init__(self, obj, source=None):
        self.obj = obj
        self.source = source
        self.attrs: dict = {}  # attribute writes made by the traced program

    def python_type(self):
        return type(self.obj)

    def getattr(self, tx, name):
        return rules.object_getattr(tx, self, name)

    def setattr(self, tx, name, value):
        rules.object_setattr(tx, self, name, value)

    def call(self, tx, args, kwargs):
        return rules.call_dunder(tx, self, "__call__", args, kwargs)

    def truth(self, tx):
        return rules.object_truth(tx, self)

    def unpack(self, tx):
        return rules.object_unpack(tx, self)

    def __repr__(self):
        return f"Object({self.python_type().__qualname__})"


#: the value of an attribute the traced program deleted (in ``ObjectValue.attrs``)
DELETED = ConstantValue(object())


class NewObjectValue(ObjectValue):
    """An instance of a user class created during the trace."""

    def __init__(self, cls):
        super().__init__(None, None)
        self.cls = cls

    def python_type(self):
        return self.cls


class SuperValue(Value):
    def __init__(self, cls, self_value):
        self.cls = cls
        self.self_value = self_value

    def getattr(self, tx, name):
        mro = self.self_value.python_type().__mro__
        i = mro.index(self.cls)
        for klass in mro[i + 1:]:
            if name in klass.__dict__:
                return rules.wrap_class_attr(tx, self.self_value, klass, name)
        raise Unsupported("K0044", f"super().{name} not found")


class ContextValue(Value):
    """A context manager whose entering and leaving the trace models as state
    (``enter``/``exit``), rebuilt as a real one when a graph break falls inside it."""

    def enter(self, tx):
        raise NotImplementedError

    def exit(self, tx):
        raise NotImplementedError


class GradModeValue(ContextValue):
    """``torch.no_grad()`` / ``enable_grad()`` / ``set_grad_enabled(b)`` as a context
    manager (also usable as a decorator's effect on an inlined call)."""

    def __init__(self, enabled: bool, applied_from=None):
        self.enabled = enabled
        self.prev = applied_from
        # ``set_grad_enabled(b)`` applies its mode when made, remembering the previous
        # one; its ``__enter__`` changes nothing
        self.applied = applied_from is not None

    def python_type(self):
        return torch.no_grad if not self.enabled else torch.enable_grad

    def getattr(self, tx, name):
        if name == "__class__":
            return ClassValue(torch.enable_grad if self.enabled else torch.no_grad)
        raise Unsupported("K0009", f"attribute {name!r} of a grad-mode context manager")

    def call(self, tx, args, kwargs):
        # used as a decorator: no_grad()(fn) -> a function that runs fn in this mode;
        # set_grad_enabled(b)(fn) first undoes what making it did
        if self.applied:
            tx.output.set_grad_enabled(self.prev)
        return _GradModeWrapped(self.enabled, args[0])

    def enter(self, tx):
        if not self.applied:
            self.prev = tx.output.grad_enabled
        tx.output.enter_grad_block(self.prev, self.enabled)
        return ConstantValue(None)

    def exit(self, tx):
        tx.output.exit_grad_block(self.prev)
        return ConstantValue(None)


class ExitValue(Value):
    """The bound ``__exit__`` a with-statement keeps on the stack."""

    def __init__(self, ctx):
        self.ctx = ctx

    def call(self, tx, args, kwargs):
        if isinstance(self.ctx, ContextValue):
            return self.ctx.exit(tx)
        return rules.call_dunder(tx, self.ctx, "__exit__", args, kwargs)


class _GradModeWrapped(Value):
    """``torch.no_grad()(fn)`` made during a trace: calls ``fn`` under the mode."""

    def __init__(self, enabled, fn):
        self.enabled = enabled
        self.fn = fn

    def call(self, tx, args, kwargs):
        ctx = GradModeValue(self.enabled)
        ctx.enter(tx)
        try:
            return self.fn.call(tx, args, kwargs)
        finally:
            ctx.exit(tx)
