"""From real Python objects to Values, adding the guards each assumption needs.

``wrap`` is called whenever the interpreter reads something from outside the frame
(an argument, a global, an attribute of a real object). What it guards depends on what
the trace will assume: a tensor's metadata, an int's value, a list's length, a
function's identity, an object's type.
"""
from __future__ import annotations

import builtins
import collections
import functools
import inspect
import types
import weakref

import torch

from kiln.capture import marks
from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.frame_access import frame_function
from kiln.capture.rule_tables import BUILTINS, CONST_FOLD
from kiln.capture.sources import AttrSource, ItemSource

_CONST_TYPES = (int, float, bool, str, bytes, complex, type(None), type(Ellipsis),
                type(NotImplemented))
_TORCH_CONST_TYPES = (torch.dtype, torch.device, torch.layout, torch.memory_format,
                      torch.Size, slice, range)
# Members of these modules are taken as stable: read without guards.
_STABLE_MODULE_PREFIXES = ("torch", "math", "operator", "functools", "itertools",
                           "collections", "typing", "numpy", "builtins", "warnings",
                           "logging", "inspect", "dataclasses", "enum", "types", "abc",
                           "copy", "re", "os", "sys", "contextlib", "kiln")


def _stable_module(mod) -> bool:
    name = getattr(mod, "__name__", "") or ""
    return name.split(".")[0] in _STABLE_MODULE_PREFIXES


@V.rule
def wrap(tx, obj, source, module_member=False):
    """The Value for ``obj`` read from ``source`` (None: no guard, not re-readable).

    Special objects first (kiln's own marks, NumPy), then one mutable object keeps one
    Value; then ``_BY_TYPE`` (exact types), then ``_BY_PREDICATE`` in order (subclasses
    and properties: the first that matches wraps), else a generic object."""
    special = _special(obj)
    if special is not None:
        return special
    special = V.rules.numpy_maybe_wrap(tx, obj, source)  # arrays, scalars, NumPy callables
    if special is not None:
        return special
    t = type(obj)
    if t in (list, dict, set) or (isinstance(obj, dict) and t.__module__ == "collections"):
        # one mutable object, one Value: mutations made through any alias are seen by all
        known = tx.output.known_value(obj, source)
        if known is not None:
            return known
    g = tx.output.guards if source is not None else None
    wrapper = _BY_TYPE.get(t)
    if wrapper is not None:
        return wrapper(tx, obj, source, g, module_member)
    for matches, wrapper in _BY_PREDICATE:
        if matches(obj, source):
            return wrapper(tx, obj, source, g, module_member)
    return _wrap_object(tx, obj, source)


def _items(tx, obj, source):
    return [wrap(tx, x, ItemSource(source, i) if source is not None else None)
            for i, x in enumerate(obj)]


def _wrap_tensor(tx, obj, source, g, module_member):
    if source is None:
        raise Unsupported("K0026", "a tensor that kiln cannot re-read at run time (no source)")
    return tx.output.input_tensor(obj, source)


def _wrap_constant(tx, obj, source, g, module_member):
    policy = tx.output.policy
    if g and policy is not None and policy.int_dynamic(source, obj):
        return V.rules.int_input(tx.output, obj, source)
    if g:
        g.constant(source, obj)
    return V.ConstantValue(obj, source)


def _wrap_sequence(tx, obj, source, g, module_member):
    t = type(obj)
    if g and t is tuple and constant_tuple(obj):
        g.constant_tuple(source, obj)     # one guard for the whole tuple, not per item
        return _constant_tuple_value(obj, source)
    if g:
        g.type_is(source, t)
        g.length(source, len(obj))
    items = _items(tx, obj, source)
    if t is tuple:
        return V.TupleValue(items, source)
    return tx.output.remember(obj, V.ListValue(items, source))


#: the item types of a tuple guarded whole (``GuardSet.constant_tuple``): immutable,
#: compared exactly by ``same_value``; never symbolic (only int arguments are:
#: ``shapes.policy.int_dynamic``)
_TUPLE_ITEM_TYPES = (int, float, bool, str, bytes, type(None))


def constant_tuple(obj) -> bool:
    """A plain tuple of constants (and of such tuples), of at most 64 items in all."""
    todo, n = [obj], 0
    while todo:
        for x in todo.pop():
            n += 1
            if type(x) is tuple:
                todo.append(x)
            elif type(x) not in _TUPLE_ITEM_TYPES or n > 64:
                return False
    return True


def _constant_tuple_value(obj, source):
    """The TupleValue of a tuple guarded whole: its items need no guard of their own."""
    return V.TupleValue([_constant_tuple_value(x, ItemSource(source, i)) if type(x) is tuple
                         else V.ConstantValue(x, ItemSource(source, i))
                         for i, x in enumerate(obj)], source)


def _wrap_namedtuple(tx, obj, source, g, module_member):
    if g:
        g.type_is(source, type(obj))
    return V.NamedTupleValue(type(obj), _items(tx, obj, source), source)


def _wrap_dict(tx, obj, source, g, module_member):
    t = type(obj)
    keys = tuple(obj.keys())
    if not all(type(k) in (str, int, bool, type(None), float) and k == k for k in keys):
        # a NaN key is found by identity alone: no source expression can name it
        return _wrap_object(tx, obj, source)
    if g:
        g.type_is(source, t)
        g.dict_keys(source, keys)
    items = {k: wrap(tx, v, ItemSource(source, k) if source is not None else None)
             for k, v in obj.items()}
    if t is collections.defaultdict:
        return tx.output.remember(obj, V.rules.defaultdict_wrap_real(tx, obj, items, source))
    return tx.output.remember(obj, V.DictValue(items, source, cls=t))


def _wrap_set(tx, obj, source, g, module_member):
    if not all(type(k) in _CONST_TYPES for k in obj):
        raise Unsupported("K0011", "a set of non-constant items")
    if type(obj) is frozenset:
        return _wrap_constant(tx, obj, source, g, module_member)
    if g:
        g.type_is(source, set)
        g.equal(source, set(obj))
    return tx.output.remember(obj, V.SetValue(set(obj), source))


def _wrap_nn_module(tx, obj, source, g, module_member):
    if g:
        g.type_is(source, type(obj))
    return tx.output.object_value(obj, source, V.ModuleValue)


def _by_identity(value_cls, always=False):
    """A wrapper guarding ``obj``'s identity (members of stable modules excepted unless
    ``always``) and making ``value_cls(obj, source)``."""
    def wrapper(tx, obj, source, g, module_member):
        if g and (always or not module_member):
            g.identity(source, obj)
        return value_cls(obj, source)

    return wrapper


def _wrap_function(tx, obj, source, g, module_member):
    if g:
        g.identity(source, obj)

    return V.rules.prebuilt_value(tx, obj, source) or V.UserFunctionValue(obj, source)


def _wrap_cached(tx, obj, source, g, module_member):
    return V.rules.wrap_cached(tx, obj, source)


def _is_grad_mode_exit(obj, source):
    return type(obj) is types.MethodType and isinstance(obj.__self__, (torch.no_grad, torch.enable_grad)) \
        and obj.__func__.__name__ == "__exit__"


def _wrap_grad_mode_exit(tx, obj, source, g, module_member):
    # the exit of a grad-mode with-block entered before a graph break
    cm = obj.__self__
    if g:
        g.type_is(AttrSource(source, "__self__"), type(cm))
        g.constant(AttrSource(AttrSource(source, "__self__"), "prev"), cm.prev)
    gv = V.GradModeValue(isinstance(cm, torch.enable_grad))
    gv.prev = cm.prev
    return V.ExitValue(gv)


def _wrap_autocast(tx, obj, source, g, module_member):
    return V.rules.autocast_wrap_real(tx, obj, source)


def _wrap_method(tx, obj, source, g, module_member):
    func = wrap(tx, obj.__func__, AttrSource(source, "__func__") if source else None)
    self_v = wrap(tx, obj.__self__, AttrSource(source, "__self__") if source else None)
    return V.MethodValue(func, self_v, source)


def _wrap_partial(tx, obj, source, g, module_member):
    if g:
        g.type_is(source, type(obj))
    func = wrap(tx, obj.func, AttrSource(source, "func") if source else None)
    args = [wrap(tx, a, ItemSource(AttrSource(source, "args"), i) if source else None)
            for i, a in enumerate(obj.args)]
    kw = {k: wrap(tx, a, ItemSource(AttrSource(source, "keywords"), k) if source else None)
          for k, a in obj.keywords.items()}
    return V.PartialValue(func, args, kw, source)


def _wrap_grad_mode(tx, obj, source, g, module_member):
    return V.GradModeValue(isinstance(obj, torch.enable_grad))


def _wrap_optimizer(tx, obj, source, g, module_member):
    return V.rules.wrap_optimizer(tx, obj, source)


def _wrap_weakref(tx, obj, source, g, module_member):
    return V.rules.wrap_ref(tx, obj, source)


def _is_torch_callable(obj, source):
    return V.rules.is_torch_callable(obj)


def _exactly(t):
    return lambda obj, source: type(obj) is t


def _instance_of(*classes):
    return lambda obj, source: isinstance(obj, classes)


#: exact type -> wrapper. Only types no earlier rule of ``_BY_PREDICATE`` can claim
#: (tensors, torch callables, classes never have these types).
_BY_TYPE = {
    **{t: _wrap_constant for t in _CONST_TYPES + _TORCH_CONST_TYPES},
    tuple: _wrap_sequence, list: _wrap_sequence,
    dict: _wrap_dict,
    set: _wrap_set, frozenset: _wrap_set,
    types.ModuleType: _by_identity(V.PythonModuleValue, always=True),
}

#: (matches(obj, source), wrapper), tried in order for the types ``_BY_TYPE`` lacks:
#: the order matters where several match (a torch function is also a FunctionType).
_BY_PREDICATE = [
    (_instance_of(torch.Tensor), _wrap_tensor),
    (lambda obj, source: isinstance(obj, tuple) and hasattr(type(obj), "_fields"), _wrap_namedtuple),
    (lambda obj, source: isinstance(obj, dict) and type(obj).__module__ == "collections", _wrap_dict),
    (_instance_of(torch.nn.Module), _wrap_nn_module),
    (_instance_of(type), _by_identity(V.ClassValue)),
    (_is_torch_callable, _by_identity(V.TorchFunctionValue)),
    (_exactly(types.FunctionType), _wrap_function),
    (_exactly(functools._lru_cache_wrapper), _wrap_cached),
    (_is_grad_mode_exit, _wrap_grad_mode_exit),
    (lambda obj, source: V.rules.is_real_autocast(obj), _wrap_autocast),
    (_exactly(types.MethodType), _wrap_method),
    (_instance_of(types.BuiltinFunctionType, types.BuiltinMethodType, types.MethodWrapperType,
                  types.WrapperDescriptorType, types.MethodDescriptorType,
                  types.ClassMethodDescriptorType), _by_identity(V.BuiltinValue)),
    (_exactly(functools.partial), _wrap_partial),
    (_instance_of(torch.no_grad, torch.enable_grad), _wrap_grad_mode),
    (lambda obj, source: isinstance(obj, torch.optim.Optimizer) and source is not None, _wrap_optimizer),
    (lambda obj, source: type(obj) is weakref.ref and source is not None, _wrap_weakref),
]


def _special(obj):
    found = frame_function(obj)
    if found is None:
        found = V.rules.optimizer_special(obj)
    if found is not None:
        return found
    try:
        if obj is marks.graph_break:
            return V._BreakingFunction(obj, "K0027", "kiln.graph_break() called")
        if type(obj) is types.MethodType and isinstance(obj.__self__, (torch.no_grad, torch.enable_grad)) \
                and obj.__func__.__name__ == "clone":
            # the factory inside @torch.no_grad()-decorated functions: a fresh manager
            return V._GradModeFactory(obj, isinstance(obj.__self__, torch.enable_grad))
        if obj is marks.is_compiling:
            return V.BuiltinValue(_true)
        if isinstance(obj, types.FunctionType) and obj in BUILTINS:  # inspect.signature…
            return V.BuiltinValue(obj)
        if obj in CONST_FOLD:
            # folded at trace time (torch.compiler.is_compiling and friends are Python
            # functions outside torch's graph modules: inlining them would read False)
            return V.TorchFunctionValue(obj)
        if marks.is_marked_disabled(obj):
            return V._BreakingFunction(obj, "K0028", f"{getattr(obj, '__qualname__', obj)} is marked kiln.disable")
        if obj in marks.disallowed_in_graph:
            return V._BreakingFunction(obj, "K0029", f"{getattr(obj, '__qualname__', obj)} is disallowed in graph")
        if obj in marks.allowed_in_graph:
            return V._AllowedFunction(obj)
        found = V.rules.transform_special_value(obj)
        if found is not None:
            return found
    except TypeError:  # unhashable
        return None
    return None


def _true():
    return True


def _wrap_object(tx, obj, source):
    if source is None:
        # the same real object, read-only: writes to it need a source and will break
        return V.ObjectValue(obj, None)
    tx.output.guards.type_is(source, type(obj))
    return tx.output.object_value(obj, source)


@V.rule
def wrap_static(obj):
    """A Value for a constant result computed at trace time (no source, no guard)."""
    t = type(obj)
    if t in _CONST_TYPES or t in _TORCH_CONST_TYPES or obj is Ellipsis:
        return V.ConstantValue(obj)
    special = _special(obj) or V.rules.numpy_maybe_wrap(None, obj, None)
    if special is not None:
        return special
    if t is tuple:
        return V.TupleValue([wrap_static(x) for x in obj])
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return V.NamedTupleValue(t, [wrap_static(x) for x in obj])
    if t is list:
        return V.ListValue([wrap_static(x) for x in obj])
    if t is frozenset:
        return V.ConstantValue(obj)
    if t is set:
        return V.SetValue(set(obj))
    if t is dict and all(type(k) in _CONST_TYPES for k in obj):
        return V.DictValue({k: wrap_static(v) for k, v in obj.items()})
    if isinstance(obj, type):
        return V.ClassValue(obj)
    if t is types.ModuleType:
        return V.PythonModuleValue(obj)

    if V.rules.is_torch_callable(obj):
        return V.TorchFunctionValue(obj)
    if t is types.FunctionType:
        return V.UserFunctionValue(obj)
    if t is functools._lru_cache_wrapper:
        return V.kinds.CachedFunctionValue(obj)
    if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return V.BuiltinValue(obj)
    # anything else: the same real object, read-only (writes need a source)
    return V.ObjectValue(obj, None)


@V.rule
def lookup_class_attr(cls, name):
    """(owner class, raw attribute) from the MRO without invoking descriptors."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass, klass.__dict__[name]
    return None, None


def lookup_guarded(tx, cls, name):
    """``lookup_class_attr`` for an attribute the trace goes on to use: guarded to be
    the same object on later calls (``GuardSet.class_attr``)."""
    owner, attr = lookup_class_attr(cls, name)
    if owner is not None:
        tx.output.guards.class_attr(cls, name)
    return owner, attr


@V.rule
def wrap_class_attr(tx, self_value, cls, name, source=None):
    """Read ``name`` as found on ``cls`` (through ``self_value`` if not None), applying
    the descriptor protocol for functions, static/class methods and properties."""
    owner, attr = lookup_guarded(tx, cls, name)
    if owner is None:
        raise UserException(V.ExceptionValue(AttributeError, [V.ConstantValue(
            f"type object {cls.__qualname__!r} has no attribute {name!r}")]))
    if isinstance(attr, staticmethod):
        return wrap(tx, attr.__func__, None) if not _is_py(attr.__func__) else V.UserFunctionValue(attr.__func__)
    if isinstance(attr, classmethod):
        klass = self_value.python_type() if self_value is not None else cls
        return V.MethodValue(_fn_value(attr.__func__), V.ClassValue(klass))
    if isinstance(attr, property):
        if self_value is None:
            return V.ObjectValue(attr, None)  # the property object itself, read-only
        return _fn_value(attr.fget).call(tx, [self_value], {})
    py_get = _python_descriptor_get(attr)
    if py_get is not None:  # a descriptor written in Python (torch.distributions' lazy_property)
        if self_value is None and type(attr).__module__.startswith("torch."):
            return wrap_static(attr.__get__(None, cls))  # torch's own, read on the class: pure
        return V.UserFunctionValue(py_get).call(
            tx, [wrap_static(attr), self_value if self_value is not None else V.ConstantValue(None),
                 V.ClassValue(cls)], {})
    if isinstance(attr, types.FunctionType):
        if self_value is None:
            return V.UserFunctionValue(attr, AttrSource(source, name) if source else None)
        return V.MethodValue(V.UserFunctionValue(attr), self_value)
    if isinstance(attr, functools._lru_cache_wrapper):  # an lru_cache'd method: bound as a function is
        cached = V.kinds.CachedFunctionValue(attr)
        return V.MethodValue(cached, self_value) if self_value is not None else cached
    if isinstance(attr, types.ClassMethodDescriptorType):
        attr = getattr(cls, name)  # a C classmethod: bound to the class, as Python reads it
    if isinstance(attr, (functools.cached_property,)):
        raise Unsupported("K0009", f"cached_property {name}")
    if self_value is not None and isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return V.MethodValue(V.BuiltinValue(attr), self_value)
    src = None
    if self_value is not None and self_value.source is not None:
        src = AttrSource(self_value.source, name)
    elif source is not None:
        src = AttrSource(source, name)
    if self_value is not None and V.rules.is_torch_callable(attr):
        return V.MethodValue(V.TorchFunctionValue(attr), self_value)
    obj = getattr(self_value, "obj", None)
    if src is not None and obj is not None and not isinstance(self_value, V.NewObjectValue) \
            and hasattr(type(attr), "__get__") and not isinstance(attr, type):
        # another descriptor written in C (pybind11's ``instancemethod``): what the read
        # gives is what its __get__ makes of it, which the source reads again at run time
        return wrap(tx, getattr(obj, name), src)
    return wrap(tx, attr, src) if src is not None else wrap_static(attr)


def _python_descriptor_get(attr):
    """``type(attr).__get__`` when it is Python code of a class outside the builtins
    (functions, properties and the like are handled by their own rules)."""
    t = type(attr)
    if t.__module__ == "builtins" or isinstance(attr, (type, types.FunctionType)):
        return None
    for klass in t.__mro__:
        if "__get__" in klass.__dict__:
            get = klass.__dict__["__get__"]
            return get if isinstance(get, types.FunctionType) else None
    return None


def _is_py(fn):
    return isinstance(fn, types.FunctionType)


def _fn_value(fn):
    if isinstance(fn, types.FunctionType):
        return V.UserFunctionValue(fn)
    return V.BuiltinValue(fn)


def _unsupported(msg):
    raise Unsupported("K0009", msg)


def builtins_dict(f_globals):
    b = f_globals.get("__builtins__", builtins)
    return b.__dict__ if isinstance(b, types.ModuleType) else b


del inspect
