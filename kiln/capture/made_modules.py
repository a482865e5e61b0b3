"""``nn.Module``s constructed inside the compiled function.

A ``torch.nn`` layer without parameters or buffers (``nn.ReLU()``, ``nn.Softmax(dim)``,
``nn.Dropout(p)``, a ``Sequential`` of such layers) made from constant arguments is
built for real at trace time — its ``__init__`` is torch's own, which only stores the
arguments — and called like any module. A user subclass gets a real template made by
``nn.Module.__init__`` alone; its own ``__init__`` is traced on it (its
``super().__init__()`` is then nothing more to do). The template is private to the
trace: plain attribute writes (``self.scale = s``, ``m.eval()``) stay on the Value,
submodules go into the template's table as ``nn.Module.__setattr__`` puts them, and a
module that would outlive the graph (returned, stored) is a graph break, since eager
hands back a new object on every call.

Modules that make parameters or buffers (random initialisation each call: kiln breaks,
where PyTorch's compiler traces them) and user classes with their own attribute protocol are
graph breaks.
"""
from __future__ import annotations

import types

from torch import nn

from kiln.capture import values as V
from kiln.capture.optimizers import INLINE_RULES
from kiln.capture.errors import Unsupported
from kiln.capture.operators import fold


class MadeModuleValue(V.ModuleValue):
    made_in_trace = True

    def __init__(self, mod):
        super().__init__(mod, None)

    def setattr(self, tx, name, value):
        if isinstance(value, V.TensorValue):
            raise Unsupported("K0023", "storing a tensor on a module made in the trace (a parameter or buffer)")
        if isinstance(value, V.ModuleValue):
            if value.mod is self.mod:
                raise Unsupported("K0023", "a module made in the trace storing itself")
            self.mod._modules[name] = value.mod  # registered, as nn.Module.__setattr__ does
            self.attrs.pop(name, None)
            return
        self.attrs[name] = value

    def __repr__(self):
        return f"MadeModule({type(self.mod).__qualname__})"


def _real_arg(v):
    if isinstance(v, MadeModuleValue):
        if v.attrs:
            raise Unsupported("K0023", "a module made in the trace, changed since, passed to another module")
        return v.mod
    return v.const()


_OWN_PROTOCOL = ("__new__", "__setattr__", "__getattr__", "__getattribute__", "__delattr__")


def _user_class_ok(cls) -> bool:
    if type(cls) is not type:
        return False
    for klass in cls.__mro__:
        if klass is nn.Module:
            return True
        if any(n in vars(klass) for n in _OWN_PROTOCOL):
            return False
    return False


def _construct_user(tx, cls, args, kwargs):
    from kiln.capture.builder import lookup_guarded

    if not _user_class_ok(cls):
        raise Unsupported("K0023", f"creating {cls.__qualname__} inside a compiled region (its own attribute protocol)")
    # the rule follows nn.Module.__init__ as it is now (PyTorch's compiler, once loaded,
    # wraps it in a function of its own)
    INLINE_RULES.setdefault(nn.Module.__init__.__code__, _module_init)
    mod = cls.__new__(cls)
    nn.Module.__init__(mod)
    value = tx.output.remember(mod, MadeModuleValue(mod))
    _, init = lookup_guarded(tx, cls, "__init__")
    if init is not nn.Module.__init__:
        if not isinstance(init, types.FunctionType):
            raise Unsupported("K0023", f"{cls.__qualname__}.__init__ is not Python code")
        V.UserFunctionValue(init).call(tx, [value] + list(args), kwargs)
    elif args or kwargs:
        raise Unsupported("K0023", f"{cls.__qualname__}() with arguments and no __init__")
    return value


def _module_init(tx, fnv, args, kwargs):
    """``super().__init__()`` inside the ``__init__`` of a module made in the trace: its
    template already ran ``nn.Module.__init__``."""
    if len(args) == 1 and not kwargs and isinstance(args[0], MadeModuleValue):
        return V.ConstantValue(None)
    raise Unsupported("K0023", "nn.Module.__init__ of a module kiln did not make")


def construct(tx, cls, args, kwargs):
    if not (cls.__module__ or "").startswith("torch.nn."):
        return _construct_user(tx, cls, args, kwargs)
    try:
        rargs = [_real_arg(a) for a in args]
        rkw = {k: _real_arg(v) for k, v in kwargs.items()}
    except Unsupported as e:
        raise Unsupported("K0023", f"creating {cls.__qualname__} inside a compiled region from non-constant arguments ({e})")
    mod = fold(cls, *rargs, **rkw)
    if any(True for _ in mod.parameters()) or any(True for _ in mod.buffers()):
        raise Unsupported("K0023", f"creating {cls.__qualname__} inside a compiled region makes parameters or buffers")
    return tx.output.remember(mod, MadeModuleValue(mod))
