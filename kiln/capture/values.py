"""Symbolic values: what the interpreter keeps on its stack and in its locals.

A handful of small classes, each knowing its *source* (where it came from, for guards
and for rebuilding it at run time) and the behaviour of the Python type it stands for:
constants, tensors (an FX node plus a fake tensor), containers, functions, modules,
objects. Behaviour that belongs to a Python type lives with that value class; calls that
reach into PyTorch go through ``OutputGraph.op`` so they land in the graph.
"""
from __future__ import annotations

import types
from typing import TYPE_CHECKING

import torch

from kiln.capture.errors import InternalError, Unsupported, UserException
from kiln.capture.sources import AttrSource, ItemSource

if TYPE_CHECKING:  # pragma: no cover
    from kiln.capture.interpreter import Frame


class _Rules:
    """Value behaviour that needs the layers above this one (wrapping Python objects,
    torch's op rules, inlining): those modules register their functions here when they
    are imported (``@rule``), so values never imports them. ``tracer`` imports them
    all before any trace starts."""

    def __getattr__(self, name):
        raise InternalError(f"no capture rule {name!r} registered (its module was not imported)")


rules = _Rules()


def rule(fn=None, *, name=None):
    """Register ``fn`` in ``rules`` under its own name (or ``name``)."""
    if fn is None:
        return lambda f: rule(f, name=name)
    setattr(rules, name or fn.__name__, fn)
    return fn


class Value:
    source = None

    def python_type(self):
        raise Unsupported("K0013", f"type of {self} is not known")

    def is_const(self) -> bool:
        return False

    def const(self):
        raise Unsupported("K0011", f"{self} is not a Python constant")

    def getattr(self, tx: "Frame", name: str) -> "Value":
        raise Unsupported("K0009", f"attribute {name!r} of {self}")

    def setattr(self, tx: "Frame", name: str, value: "Value"):
        raise Unsupported("K0025", f"setting attribute {name!r} on {self}")

    def call(self, tx: "Frame", args: list, kwargs: dict) -> "Value":
        raise Unsupported("K0010", f"calling {self}")

    def call_method(self, tx, name, args, kwargs):
        return self.getattr(tx, name).call(tx, args, kwargs)

    def unpack(self, tx) -> list:
        raise Unsupported("K0012", f"iterating over {self}")

    def truth(self, tx) -> bool:
        raise Unsupported("K0012", f"truth value of {self}")

    def __repr__(self):
        return f"{type(self).__name__}()"


class BoundContainerMethod(Value):
    """``lst.append`` / ``d.get`` read as an attribute, called later."""

    def __init__(self, owner, name):
        self.owner = owner
        self.name = name

    def python_type(self):
        return types.BuiltinMethodType

    def call(self, tx, args, kwargs):
        return self.owner.call_method(tx, self.name, args, kwargs)


def _container_getattr(self, tx, name):
    t = self.python_type()
    if name == "__class__":
        return ClassValue(t)
    if not hasattr(t, name):
        raise UserException(ExceptionValue(AttributeError, [ConstantValue(
            f"{t.__name__!r} object has no attribute {name!r}")]))
    return BoundContainerMethod(self, name)


class LazyArg(Value):
    """A root-frame argument not read yet: wrapped (and guarded) on first use only."""

    def __init__(self, real, source):
        self.real = real
        self.source = source


class NullValue(Value):
    """The NULL that CPython 3.11/3.12 push below a callable."""

    def __repr__(self):
        return "NULL"


NULL = NullValue()


class ConstantValue(Value):
    """An immutable Python value known at trace time (int, str, None, dtype, slice…)."""

    def __init__(self, value, source=None):
        self.value = value
        self.source = source

    def python_type(self):
        return type(self.value)

    def is_const(self):
        return True

    def const(self):
        return self.value

    def truth(self, tx):
        return bool(self.value)

    def unpack(self, tx):
        try:
            items = list(self.value)
        except TypeError:
            raise UserException(ExceptionValue(TypeError, [ConstantValue(
                f"{type(self.value).__name__!r} object is not iterable")]))
        if self.source is not None and isinstance(self.value, (tuple, list)):
            return [ConstantValue(v, ItemSource(self.source, i)) for i, v in enumerate(items)]
        return [ConstantValue(v) for v in items]

    def getattr(self, tx, name):
        try:
            v = getattr(self.value, name)
        except AttributeError as e:
            raise UserException(ExceptionValue(AttributeError, [ConstantValue(str(e))]))
        if isinstance(v, (types.BuiltinMethodType, types.MethodWrapperType)):
            return BuiltinValue(v)
        return rules.wrap_static(v)

    def __repr__(self):
        return f"Const({self.value!r})"


class TensorValue(Value):
    """A tensor: the FX node that computes it and a fake tensor with its metadata."""

    def __init__(self, node, fake, source=None):
        self.node = node
        self.fake = fake
        self.source = source

    def python_type(self):
        return type(self.fake) if not hasattr(self.fake, "fake_device") else torch.Tensor

    def truth(self, tx):
        raise Unsupported("K0006", "branching on a tensor's value (data-dependent control flow)")

    def unpack(self, tx):
        if self.fake.dim() == 0:
            raise UserException(ExceptionValue(TypeError, [ConstantValue("iteration over a 0-d tensor")]))
        return list(tx.output.op("call_method", "unbind", [self], {}).unpack(tx))

    def getattr(self, tx, name):
        return rules.tensor_attribute(tx, self, name)

    def setattr(self, tx, name, value):
        if name == "grad":
            return rules.write_grad(tx, self, value)
        raise Unsupported("K0025", f"setting attribute {name!r} on a tensor")

    def call_method(self, tx, name, args, kwargs):
        return rules.tensor_method(tx, self, name, args, kwargs)

    def __repr__(self):
        return f"Tensor({self.node.name}, {tuple(self.fake.shape)}, {self.fake.dtype})"


class _Sequence(Value):
    mutable = False

    def __init__(self, items, source=None):
        self.items = list(items)
        self.source = source

    def unpack(self, tx):
        return list(self.items)

    def truth(self, tx):
        return len(self.items) > 0

    getattr = _container_getattr

    def is_const(self):
        return all(i.is_const() for i in self.items)

    def __repr__(self):
        return f"{type(self).__name__}({self.items})"


class TupleValue(_Sequence):
    def python_type(self):
        return tuple

    def const(self):
        return tuple(i.const() for i in self.items)

    def call_method(self, tx, name, args, kwargs):
        return rules.tuple_method(tx, self, name, args, kwargs)


class NamedTupleValue(TupleValue):
    def __init__(self, cls, items, source=None):
        super().__init__(items, source)
        self.cls = cls

    def python_type(self):
        return self.cls

    def const(self):
        return self.cls(*[i.const() for i in self.items])

    def getattr(self, tx, name):
        fields = getattr(self.cls, "_fields", ()) or getattr(self, "fields", ())
        if name in fields:
            return self.items[fields.index(name)]
        if name in ("_replace", "_asdict", "index", "count"):
            return BoundContainerMethod(self, name)
        return rules.wrap_class_attr(tx, self, self.cls, name)


class ListValue(_Sequence):
    mutable = True

    def python_type(self):
        return list

    def const(self):
        return [i.const() for i in self.items]

    def is_const(self):
        return False  # lists are mutable: never folded into a constant

    def call_method(self, tx, name, args, kwargs):
        return rules.list_method(tx, self, name, args, kwargs)


class DictValue(Value):
    """A dict (or OrderedDict) with constant keys; values are Values."""

    mutable = True

    def __init__(self, items: dict, source=None, cls=dict):
        self.items = dict(items)
        self.source = source
        self.cls = cls

    def python_type(self):
        return self.cls

    def truth(self, tx):
        return len(self.items) > 0

    def unpack(self, tx):
        return [ConstantValue(k) for k in self.items]

    def call_method(self, tx, name, args, kwargs):
        return rules.dict_method(tx, self, name, args, kwargs)

    def getitem(self, tx, k):
        """``d[k]`` (subclasses with their own item protocol override this)."""
        key = k.const()
        if key not in self.items:
            raise UserException(ExceptionValue(KeyError, [k]))
        return self.items[key]

    def setitem(self, tx, k, v):
        self.items[k.const()] = v
        if self.source is not None:
            tx.output.mark_mutated(self)

    getattr = _container_getattr

    def __repr__(self):
        return f"Dict({self.items})"


class SetValue(Value):
    """A set of constants, kept in a real Python set that goes through the program's own
    additions and removals: it iterates (and pops) in the order eager's set does."""

    mutable = True

    def __init__(self, items, source=None):
        self.items = items if type(items) is set else set(items)
        self.source = source

    def python_type(self):
        return set

    def truth(self, tx):
        return bool(self.items)

    def unpack(self, tx):
        return [ConstantValue(v) for v in self.items]

    getattr = _container_getattr

    def call_method(self, tx, name, args, kwargs):
        return rules.set_method(tx, self, name, args, kwargs)


class IteratorValue(Value):
    """An iterator over a fixed list of values (a tuple's or a constant's items); the
    lazy and live ones (generators, map, a list's iterator) are in iterators.py."""

    mutable = True

    def __init__(self, items, index=0):
        self.items = list(items)
        self.index = index

    def next(self, tx):
        """The next item, or None when exhausted."""
        if self.index >= len(self.items):
            return None
        v = self.items[self.index]
        self.index += 1
        return v

    def unpack(self, tx):
        rest = self.items[self.index:]
        self.index = len(self.items)
        return rest

    def python_type(self):
        return type(iter(()))

    def truth(self, tx):
        return True

    getattr = _container_getattr

    def call_method(self, tx, name, args, kwargs):
        return rules.iterator_method(tx, self, name, args, kwargs)

    def referenced(self) -> list:
        """The Values a rebuilt iterator is made of."""
        return self.items[self.index:]

    def rebuild(self, cg) -> str:
        """Python source making this iterator, in its current position."""
        return f"iter(({''.join(cg.expr(i) + ', ' for i in self.items[self.index:])}))"


class CellValue(Value):
    """A closure cell created during the trace."""

    def __init__(self, value=None):
        self.value = value


class FunctionValue(Value):
    """Something the interpreter inlines when called."""


class UserFunctionValue(FunctionValue):
    def __init__(self, fn: types.FunctionType, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        modelled = rules.inline_rule(self.fn)  # a wrapper kiln models rather than inlines
        if modelled is not None:
            return modelled(tx, self, args, kwargs)
        return tx.inline_function(self, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__", "__doc__", "__code__"):
            return ConstantValue(getattr(self.fn, name))
        if name == "__class__":
            return ClassValue(types.FunctionType)
        if name in ("__defaults__", "__kwdefaults__"):
            return rules.wrap_static(getattr(self.fn, name))
        if name == "__get__":  # the descriptor protocol by hand: fn.__get__(obj, cls)
            return _FunctionGet(self)
        if name in self.fn.__dict__:
            return rules.wrap(tx, self.fn.__dict__[name],
                              AttrSource(self.source, name) if self.source else None)
        raise Unsupported("K0009", f"attribute {name!r} of function {self.fn.__qualname__}")

    def __repr__(self):
        return f"Function({self.fn.__qualname__})"


class _FunctionGet(Value):
    """``fn.__get__``: called with an instance, the method bound to it; with None, ``fn``."""

    def __init__(self, fnv):
        self.fnv = fnv

    def call(self, tx, args, kwargs):
        if kwargs or not 1 <= len(args) <= 2:
            raise Unsupported("K0044", "function.__get__ with these arguments")
        obj = args[0]
        if isinstance(obj, ConstantValue) and obj.value is None:
            return self.fnv
        return MethodValue(self.fnv, obj)


class NestedFunctionValue(FunctionValue):
    """A function created by MAKE_FUNCTION during the trace (a lambda, an inner def)."""

    def __init__(self, code, f_globals, defaults, kwdefaults, closure, qualname):
        self.code = code
        self.f_globals = f_globals
        self.defaults = defaults  # tuple of Values or None
        self.kwdefaults = kwdefaults  # dict name -> Value or None
        self.closure = closure  # tuple of CellValue or None
        self.qualname = qualname

    def python_type(self):
        return types.FunctionType

    def call(self, tx, args, kwargs):
        return tx.inline_function(self, args, kwargs)

    def getattr(self, tx, name):
        attrs = self.__dict__.get("attrs")
        if attrs and name in attrs:  # set by functools.update_wrapper (function_attrs.py)
            return attrs[name]
        if name in ("__name__", "__qualname__"):
            return ConstantValue(self.qualname.rsplit(".", 1)[-1] if name == "__name__" else self.qualname)
        if name == "__class__":
            return ClassValue(types.FunctionType)
        raise Unsupported("K0009", f"attribute {name!r} of a nested function")

    def __repr__(self):
        return f"NestedFunction({self.qualname})"


class MethodValue(Value):
    """A function bound to a self value."""

    def __init__(self, func: Value, self_value: Value, source=None):
        self.func = func
        self.self_value = self_value
        self.source = source

    def python_type(self):
        return types.MethodType

    def call(self, tx, args, kwargs):
        return self.func.call(tx, [self.self_value] + list(args), kwargs)

    def getattr(self, tx, name):
        if name == "__self__":
            return self.self_value
        if name == "__func__":
            return self.func
        return self.func.getattr(tx, name)


class _CallableRef(Value):
    """A callable kept by reference (not inlined): ``fn`` and where it was read."""

    def __init__(self, fn, source=None):
        self.fn = fn
        self.source = source

    def python_type(self):
        return type(self.fn)


class BuiltinValue(_CallableRef):
    """A builtin function or method implemented in C (len, print, math.sqrt, dict.get…)."""

    def call(self, tx, args, kwargs):
        return rules.call_builtin(tx, self.fn, args, kwargs)

    def getattr(self, tx, name):
        if name in ("__name__", "__qualname__", "__module__"):
            return ConstantValue(getattr(self.fn, name, None))
        if name == "__class__":
            return ClassValue(type(self.fn))
        raise Unsupported("K0009", f"attribute {name!r} of builtin {self.fn!r}")

    def __repr__(self):
        return f"Builtin({getattr(self.fn, '__qualname__', self.fn)!r})"


class TorchFunctionValue(_CallableRef):
    """A PyTorch callable that becomes a graph node (torch.add, F.relu, torch.Tensor.add)."""

    def call(self, tx, args, kwargs):
        return rules.call_torch_function(tx, self.fn, args, kwargs)

    def getattr(self, tx, name):
        return rules.wrap(tx, getattr(self.fn, name), AttrSource(self.source, name) if self.source else None)

    def __repr__(self):
        return f"Torch({getattr(self.fn, '__name__', self.fn)})"


class PythonModuleValue(Value):
    """A Python module (torch, math, operator, the user's own)."""

    def __init__(self, mod, source=None):
        self.mod = mod
        self.source = source

    def python_type(self):
        return types.ModuleType

    def getattr(self, tx, name):
        try:
            v = getattr(self.mod, name)
        except AttributeError as e:
            if self.source is not None:     # the program may set it later
                tx.output.guards.expression(f"not hasattr({self.source.expr()}, {name!r})",
                                            f"{self.source.pretty()} has no attribute {name!r}")
            raise UserException(ExceptionValue(AttributeError, [ConstantValue(str(e))]))
        return rules.wrap(tx, v, AttrSource(self.source, name) if self.source else None, module_member=True)

    def __repr__(self):
        return f"Module({self.mod.__name__})"


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


class NewObjectValue(ObjectValue):
    """An instance of a user class created during the trace."""

    def __init__(self, cls):
        super().__init__(None, None)
        self.cls = cls

    def python_type(self):
        return self.cls


class ModuleValue(ObjectValue):
    """An ``nn.Module`` instance; calls inline its forward (and hooks)."""

    def __init__(self, mod, source=None):
        super().__init__(mod, source)

    @property
    def mod(self):
        return self.obj

    def call(self, tx, args, kwargs):
        return rules.call_module(tx, self, args, kwargs)

    def unpack(self, tx):
        return rules.module_items(tx, self)

    def truth(self, tx):
        return True

    def __repr__(self):
        return f"NNModule({type(self.obj).__qualname__})"


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


class ExceptionValue(Value):
    """An exception instance raised or created by the traced program: its ``args`` and
    the attributes its ``__init__`` set (``custom_init``: that ``__init__`` is Python
    code, so it is rebuilt from this state, not by calling the class again)."""

    def __init__(self, cls, args, custom_init=False):
        self.cls = cls
        self.args = list(args)
        self.attrs: dict = {}
        self.custom_init = custom_init

    @classmethod
    def of_real(cls_, e: BaseException):
        """The Value of a real exception raised while tracing (by a folded builtin, an
        op): its args and attributes as they are."""
        _, init = rules.lookup_class_attr(type(e), "__init__")
        ev = cls_(type(e), [rules.wrap_static(a) for a in e.args], custom_init=isinstance(init, types.FunctionType))
        if ev.custom_init:
            ev.attrs = {k: rules.wrap_static(a) for k, a in vars(e).items()}
        return ev

    def python_type(self):
        return self.cls

    def getattr(self, tx, name):
        if name == "args":
            return TupleValue(self.args)
        if name in self.attrs:
            return self.attrs[name]
        if name == "__class__":
            return ClassValue(self.cls)
        if name in ("__cause__", "__context__", "__traceback__", "__notes__", "__suppress_context__"):
            raise Unsupported("K0031", f"{name} of an exception made in the trace")
        if name == "value" and issubclass(self.cls, StopIteration) and not self.custom_init:
            return self.args[0] if self.args else ConstantValue(None)
        _, attr = rules.lookup_class_attr(self.cls, name)
        if isinstance(attr, (types.MemberDescriptorType, types.GetSetDescriptorType)):
            raise Unsupported("K0031", f"{self.cls.__name__}.{name} (kept by the exception's C code)")
        return rules.wrap_class_attr(tx, self, self.cls, name)

    def setattr(self, tx, name, value):
        if name == "args":
            self.args = value.unpack(tx)
            return
        if name.startswith("__"):
            raise Unsupported("K0031", f"setting {name} of an exception")
        self.attrs[name] = value

    def __repr__(self):
        return f"Exception({self.cls.__name__}, {self.args})"


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


def is_mutable(v: Value) -> bool:
    return getattr(v, "mutable", False)


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
