"""Functions: inlined user functions (module-level and made by MAKE_FUNCTION), bound
methods, closure cells, ``functools.partial``, callables kept by reference (builtins,
torch functions), and the callables kiln's marks make (a call that breaks the graph, a
function allowed in the graph as one node, the grad-mode factory of ``@no_grad()``)."""
from __future__ import annotations

import types

from kiln.capture.errors import Unsupported
from kiln.capture.sources import AttrSource
from kiln.capture.values.base import Value, kind, rules
from kiln.capture.values.constants import ConstantValue
from kiln.capture.values.containers import DictValue, TupleValue
from kiln.capture.values.objects import ClassValue, GradModeValue


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


@kind
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


class PartialValue(FunctionValue):
    """``functools.partial(func, *args, **kw)``."""

    def __init__(self, func, args, kwargs, source=None):
        self.func = func
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.source = source

    def getattr(self, tx, name):
        if name == "func":
            return self.func
        if name == "args":
            return TupleValue(self.args)
        if name == "keywords":
            return DictValue(self.kwargs)
        raise Unsupported("K0009", f"attribute {name!r} of functools.partial")

    def call(self, tx, args, kwargs):
        kw = dict(self.kwargs)
        kw.update(kwargs)
        return self.func.call(tx, self.args + list(args), kw)


class _BreakingFunction(Value):
    """kiln.graph_break(), kiln.disable'd and disallow_in_graph'd functions: a call is a
    graph break, so the callee runs as plain Python."""

    def __init__(self, fn, break_id, why):
        self.fn = fn
        self.break_id = break_id
        self.why = why

    def call(self, tx, args, kwargs):
        raise Unsupported(self.why, break_id=self.break_id)


class _GradModeFactory(Value):
    def __init__(self, fn, enabled):
        self.fn = fn
        self.enabled = enabled

    def call(self, tx, args, kwargs):
        return GradModeValue(self.enabled)


class _AllowedFunction(Value):
    def __init__(self, fn):
        self.fn = fn

    def call(self, tx, args, kwargs):
        return tx.output.op("call_function", self.fn, args, kwargs)
