"""Python builtins (and math, operator, functools, itertools) during a trace: one
handler per callable, in ``BUILTINS``. Pure functions of constants are folded; anything
with effects kiln cannot replay (``print``, I/O) is a graph break."""
from __future__ import annotations

import builtins
import functools
import types
import inspect
import itertools
import math
import operator

from kiln.capture import iterators
from kiln.capture import numpy_ufuncs
from kiln.capture import values as V
from kiln.capture.dict_views import DictViewValue
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.frame_access import needs_own_frame
from kiln.capture.numpy_values import NdarrayValue
from kiln.capture.operators import binary_op, compare_op, contains_op, fold, is_same, subscr, unary_op
from kiln.capture.rule_tables import BUILTINS, CONST_FOLD


def rule(*fns):
    def deco(h):
        for f in fns:
            BUILTINS[f] = h
        return h

    return deco


C = V.C


def apply_rule(tx, fn, rule_, args, kwargs):
    """``rule_(tx, *args, **kwargs)``; arguments the rule cannot bind (a keyword it does
    not name) make the call plain Python, where they mean what they mean to ``fn``."""
    try:
        return rule_(tx, *args, **kwargs)
    except TypeError as e:
        if e.__traceback__.tb_next is not None:  # raised inside the rule: not a binding error
            raise
        raise Unsupported("K0016", f"{getattr(fn, '__qualname__', fn)} with these arguments ({e})") from None


def _type_of(v):
    return v.python_type()


@V.rule
def call_builtin(tx, fn, args, kwargs):
    h = BUILTINS.get(fn)
    if h is not None:
        return apply_rule(tx, fn, h, args, kwargs)
    fold_rule = CONST_FOLD.get(fn)
    if fold_rule is not None:
        return fold_rule(tx, args, kwargs)
    if fn in _PURE or getattr(fn, "__self__", None) is math:
        try:
            cargs = [a.const() for a in args]
            ckw = {k: v.const() for k, v in kwargs.items()}
        except Unsupported:
            raise Unsupported("K0011", f"{getattr(fn, '__name__', fn)} on non-constant arguments")
        from kiln.capture.builder import wrap_static

        return wrap_static(fold(fn, *cargs, **ckw))
    self_ = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if self_ is not None and not isinstance(self_, type(builtins)):
        # a bound method of a constant (str.join, int.bit_length…)
        if isinstance(self_, (str, int, float, bytes, tuple, frozenset)):
            if name == "join" and len(args) == 1 and isinstance(args[0], V.IteratorValue):
                args = [V.TupleValue(args[0].unpack(tx))]  # join takes all the items first
            try:
                cargs = [a.const() for a in args]
                ckw = {k: v.const() for k, v in kwargs.items()}
            except Unsupported:
                if name == "join" and isinstance(self_, str):
                    raise
                raise Unsupported("K0011", f"{type(self_).__name__}.{name} on non-constant arguments")
            from kiln.capture.builder import wrap_static

            return wrap_static(fold(fn, *cargs, **ckw))
    if isinstance(self_, dict) and name in _DICT_READS:
        return _opaque_dict_read(tx, self_, name, args)
    objclass = getattr(fn, "__objclass__", None)
    if name == "__init__" and isinstance(objclass, type) and issubclass(objclass, BaseException) \
            and args and isinstance(args[0], V.ExceptionValue):
        return V.rules.exception_init(tx, objclass, args, kwargs)
    if objclass is dict and args and isinstance(args[0], V.ObjectValue) and isinstance(args[0].obj, dict) \
            and name in _DICT_READS:
        return _opaque_dict_read(tx, args[0].obj, name, list(args[1:]))
    if objclass is not None and args and isinstance(args[0], (V._Sequence, V.DictValue, V.SetValue)):
        # unbound C methods called with the instance first: dict.get(d, k), list.append(l, x)
        return args[0].call_method(tx, name, list(args[1:]), kwargs)
    raise Unsupported("K0016", f"call to builtin {getattr(fn, '__qualname__', fn)!r} (kiln cannot trace it)")


@rule(object.__init__)
def _object_init(tx, self_, *args, **kwargs):
    """``super().__init__()`` reaching object's: nothing to do (arguments: plain Python)."""
    if args or kwargs:
        raise Unsupported("K0016", "object.__init__ with arguments")
    return C(None)


@rule(pow)
def _pow(tx, a, b, *mod):
    if not mod and (isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue)):
        return binary_op(tx, "NB_POWER", a, b)
    return C(fold(pow, a.const(), b.const(), *[m.const() for m in mod]))


_DICT_READS = ("get", "__getitem__", "__contains__")


def _real_key(v):
    for attr in ("obj", "cls", "fn", "mod"):
        if hasattr(v, attr) and getattr(v, attr) is not None:
            return getattr(v, attr)
    return v.const()


@V.rule(name="opaque_dict_read")
def _opaque_dict_read(tx, d, name, args):
    """A lookup in a real dict whose keys are objects (a registry keyed by module or
    class): read at trace time, the answer assumed stable while the dict's size is."""
    from kiln.capture.builder import wrap

    key = _real_key(args[0])
    tx.output.guards.expression(f"len({tx.output.guards.const(d, 'd')}) == {len(d)}",
                                f"a registry dict still has {len(d)} entries")
    if name == "__contains__":
        return C(key in d)
    if name == "get":
        if key not in d:
            return args[1] if len(args) > 1 else C(None)
    elif key not in d:
        raise UserException(V.ExceptionValue(KeyError, [args[0]]))
    return wrap(tx, d[key], None)


_PURE = {abs, round, divmod, chr, ord, hex, oct, bin, repr, ascii, format, hash,
         operator.index, math.sqrt, math.exp, math.log, math.floor, math.ceil}


def _kiln_true(tx):
    return C(True)


from kiln.capture import builder as _builder  # noqa: E402

BUILTINS[_builder._true] = _kiln_true


def real_callable(v):
    """The real Python callable a Value stands for (signatures are read from it)."""
    import types

    if isinstance(v, (V.UserFunctionValue, V._CallableRef)):
        return v.fn
    if isinstance(v, V.MethodValue):
        self_v = v.self_value
        real_self = getattr(self_v, "mod", None) if isinstance(self_v, V.ModuleValue) else getattr(self_v, "obj", None)
        if real_self is None or isinstance(self_v, V.NewObjectValue):
            raise Unsupported("K0016", "the signature of a method of an object made inside the trace")
        return types.MethodType(real_callable(v.func), real_self)
    if isinstance(v, V.ClassValue):
        return v.cls
    raise Unsupported("K0016", f"the signature of {v}")


import warnings  # noqa: E402

from kiln.capture.logging_calls import warn_rule  # noqa: E402

BUILTINS[warnings.warn] = warn_rule


@rule(inspect.signature)
def _signature(tx, fn, **kwargs):
    # signatures depend only on code objects and defaults, which guards already pin
    ckw = {k: a.const() for k, a in kwargs.items()}
    return C(fold(inspect.signature, real_callable(fn), **ckw))


@rule(print)
def _print(tx, *a, **k):
    raise Unsupported("K0018", "print() has a side effect outside the graph")


@rule(len)
def _len(tx, x):
    if hasattr(x, "len_value"):  # ndarrays
        return x.len_value(tx)
    if isinstance(x, V.TensorValue):
        if x.fake.dim() == 0:
            raise UserException(V.ExceptionValue(TypeError, [C("len() of a 0-d tensor")]))
        sym = V.rules.symbolic_meta(tx, x, "__len__", [], {})
        return sym if sym is not None else C(x.fake.shape[0])
    if isinstance(x, (V.ListValue, V.TupleValue)):
        return C(len(x.items))
    if isinstance(x, (V.DictValue, V.SetValue)):
        return C(len(x.items))
    if isinstance(x, DictViewValue):
        return C(len(x))
    if hasattr(x, "length"):  # a container Value of its own (deque)
        return C(x.length())
    if isinstance(x, V.ConstantValue):
        return C(fold(len, x.value))
    if isinstance(x, V.ModuleValue):
        from kiln.capture.modules import module_items

        return C(len(module_items(tx, x)))
    if isinstance(x, V.ObjectValue):
        from kiln.capture.objects import call_dunder

        if x.source is None and not x.attrs and x.obj is not None and type(x.obj) in _READ_ONLY_SIZED:
            return C(len(x.obj))
        return call_dunder(tx, x, "__len__", [], {})
    raise Unsupported("K0016", f"len of {x}")


_READ_ONLY_SIZED = (type(type.__dict__),)  # mappingproxy (Signature.parameters)


def _isinstance_check(tx, v, cls) -> bool:
    import torch

    if isinstance(cls, tuple):
        return any(_isinstance_check(tx, v, c) for c in cls)
    if isinstance(v, V.TensorValue):
        t = getattr(v, "cls", torch.Tensor)
        return issubclass(t, cls)
    t = v.python_type()
    if isinstance(v, V.DictValue) and getattr(v, "cls", dict) is not dict:
        t = v.cls
    try:
        return issubclass(t, cls)
    except TypeError:
        return isinstance(v.const(), cls)


@rule(isinstance)
def _isinstance(tx, v, cls):
    return C(_isinstance_check(tx, v, cls.const()))


@rule(issubclass)
def _issubclass(tx, a, b):
    return C(fold(issubclass, a.const(), b.const()))


@rule(type)
def _type(tx, *args):
    if len(args) != 1:
        raise Unsupported("K0016", "type() with 3 arguments")
    v = args[0]
    if isinstance(v, V.TensorValue):
        import torch

        return V.ClassValue(getattr(v, "cls", torch.Tensor))
    if isinstance(v, V.DictValue):
        return V.ClassValue(v.cls)
    return V.ClassValue(v.python_type())


@rule(callable)
def _callable(tx, v):
    if isinstance(v, (V.FunctionValue, V.MethodValue, V.BuiltinValue, V.TorchFunctionValue, V.ClassValue, V.ModuleValue)):
        return C(True)
    if isinstance(v, (V.ConstantValue, V.TensorValue, V._Sequence, V.DictValue)):
        return C(False)
    return C(callable(v.python_type()) and hasattr(v.python_type(), "__call__"))


@rule(getattr)
def _getattr(tx, obj, name, *default):
    try:
        return obj.getattr(tx, name.const())
    except UserException as e:
        if default and issubclass(e.value.python_type(), AttributeError):
            return default[0]
        raise


@rule(hasattr)
def _hasattr(tx, obj, name):
    try:
        obj.getattr(tx, name.const())
        return C(True)
    except UserException as e:
        if issubclass(e.value.python_type(), AttributeError):
            return C(False)
        raise


@rule(setattr)
def _setattr(tx, obj, name, value):
    obj.setattr(tx, name.const(), value)
    return C(None)


@rule(hash)
def _hash(tx, v):
    if v.is_const():
        return C(fold(hash, v.const()))
    if isinstance(v, V.ObjectValue) and not isinstance(v, V.ModuleValue):
        from kiln.capture.builder import lookup_class_attr
        from kiln.capture.objects import call_dunder

        cls = v.python_type()
        owner, attr = lookup_class_attr(cls, "__hash__")
        if owner is not None and attr is None:  # __eq__ without __hash__
            raise UserException(V.ExceptionValue(TypeError, [C(f"unhashable type: {cls.__name__!r}")]))
        if isinstance(attr, types.FunctionType):
            r = call_dunder(tx, v, "__hash__", [], {})
            if not isinstance(r, V.ConstantValue) or not isinstance(r.value, int):
                raise Unsupported("K0016", "__hash__ returning a non-int")
            return C(hash(r.value))  # ints too large for a hash are hashed again
    raise Unsupported("K0017", f"hash() of {v} (its identity)")


@rule(id)
def _id(tx, v):
    raise Unsupported("K0017", "id() of a traced value")


@rule(iter)
def _iter(tx, v, *sentinel):
    if sentinel:
        raise Unsupported("K0016", "iter(callable, sentinel)")
    return iterators.get_iter(tx, v)


@rule(next)
def _next(tx, it, *default):
    if not iterators.is_iterator(it):
        if hasattr(it.python_type(), "__next__"):
            raise Unsupported("K0016", f"next() on {it}")
        raise UserException(V.ExceptionValue(TypeError, [C(f"{it.python_type().__name__!r} object is not an iterator")]))
    if isinstance(it, V.ObjectValue):  # the user's own __next__: its StopIteration as it is
        from kiln.capture.objects import call_dunder

        if not default:
            return call_dunder(tx, it, "__next__", [], {})
    r = iterators.next_of(tx, it)
    if r is None:
        if default:
            return default[0]
        raise UserException(iterators.stop_iteration(it))
    return r


@rule(range)
def _range(tx, *args):
    return C(range(*[a.const() for a in args]))


@rule(enumerate)
def _enumerate(tx, it, start=None):
    s = start.const() if start is not None else 0
    return iterators.EnumerateIterator(iterators.get_iter(tx, it), s)


@rule(zip)
def _zip(tx, *its, strict=None):
    return iterators.ZipIterator([iterators.get_iter(tx, i) for i in its],
                                 bool(strict.const()) if strict is not None else False)


@rule(map)
def _map(tx, fn, *its):
    if not its:
        raise UserException(V.ExceptionValue(TypeError, [C("map() must have at least two arguments.")]))
    return iterators.MapIterator(fn, [iterators.get_iter(tx, i) for i in its])


@rule(filter)
def _filter(tx, fn, it):
    return iterators.FilterIterator(fn, iterators.get_iter(tx, it))


@rule(reversed)
def _reversed(tx, seq):
    if type(seq) is V.ListValue:
        return iterators.ListIterator(seq, reverse=True)
    if isinstance(seq, V.IteratorValue) or iterators.is_iterator(seq):
        raise UserException(V.ExceptionValue(TypeError, [C(f"{seq.python_type().__name__!r} object is not reversible")]))
    return V.IteratorValue(list(reversed(seq.unpack(tx))))


@V.rule
def sorted_values(tx, items, key, reverse):
    def k(v):
        kv = key.call(tx, [v], {}) if key is not None and not (isinstance(key, V.ConstantValue) and key.value is None) else v
        return kv.const()

    keyed = [(k(v), i, v) for i, v in enumerate(items)]
    keyed.sort(key=lambda t: t[0], reverse=reverse)
    return [v for _, _, v in keyed]


@rule(sorted)
def _sorted(tx, it, key=None, reverse=None):
    return V.ListValue(sorted_values(tx, it.unpack(tx), key, reverse.const() if reverse else False))


def _minmax(tx, which, args, key, default):
    items = list(iterators.iterate(tx, args[0])) if len(args) == 1 else list(args)
    if not items:
        if default is not None:
            return default
        raise UserException(V.ExceptionValue(ValueError, [C(f"{which.__name__}() arg is an empty sequence")]))
    if key is None and any(isinstance(i, V.TensorValue) for i in items):
        raise Unsupported("K0006", f"{which.__name__}() over tensors compares their values")
    best = items[0]
    for x in items[1:]:
        if key is None and (isinstance(x, V.SymIntValue) or isinstance(best, V.SymIntValue)):
            # sizes stay symbolic: the comparison is guarded, not both values fixed
            if compare_op(tx, ">" if which is max else "<", x, best).truth(tx):
                best = x
            continue
        a = key.call(tx, [x], {}).const() if key else x.const()
        b = key.call(tx, [best], {}).const() if key else best.const()
        if (a > b) if which is max else (a < b):
            best = x
    return best


@rule(max)
def _max(tx, *args, key=None, default=None):
    return _minmax(tx, max, args, key, default)


@rule(min)
def _min(tx, *args, key=None, default=None):
    return _minmax(tx, min, args, key, default)


@rule(sum)
def _sum(tx, it, start=None):
    acc = start if start is not None else C(0)
    for x in iterators.iterate(tx, it):
        acc = binary_op(tx, "NB_ADD", acc, x)
    return acc


@rule(any)
def _any(tx, it):
    for x in iterators.iterate(tx, it):
        if x.truth(tx):
            return C(True)
    return C(False)


@rule(all)
def _all(tx, it):
    for x in iterators.iterate(tx, it):
        if not x.truth(tx):
            return C(False)
    return C(True)


@rule(abs)
def _abs(tx, x):
    if isinstance(x, NdarrayValue):
        return numpy_ufuncs.unary(tx, operator.abs, x)
    if isinstance(x, V.TensorValue):
        return tx.output.op("call_function", operator.abs, [x], {})
    return C(fold(abs, x.const()))


@rule(bool)
def _bool(tx, x=None):
    return C(False) if x is None else C(x.truth(tx))


def _numeric(cls):
    def h(tx, x=None, *rest):
        if x is None:
            return C(cls())
        if isinstance(x, V.TensorValue):
            raise Unsupported("K0007", f"{cls.__name__}() of a tensor needs its data")
        return C(fold(cls, x.const(), *[r.const() for r in rest]))

    return h


BUILTINS[int] = _numeric(int)
BUILTINS[float] = _numeric(float)
BUILTINS[complex] = _numeric(complex)


@rule(str)
def _str(tx, x=None):
    if x is None:
        return C("")
    if isinstance(x, V.TensorValue):
        raise Unsupported("K0007", "str() of a tensor needs its data")
    if isinstance(x, V.ClassValue):
        return C(str(x.cls))
    return C(str(x.const()))


@rule(tuple)
def _tuple(tx, it=None):
    return V.TupleValue([] if it is None else it.unpack(tx))


@rule(list)
def _list(tx, it=None):
    return V.ListValue([] if it is None else it.unpack(tx))


@rule(dict)
def _dict(tx, it=None, **kwargs):
    from kiln.capture.containers import dict_items_of

    d = dict(dict_items_of(tx, it)) if it is not None else {}
    d.update(kwargs)
    return V.DictValue(d)


@rule(set)
def _set(tx, it=None):
    from kiln.capture.containers import set_operand

    return V.SetValue(set() if it is None else set(set_operand(tx, it)))


@rule(frozenset)
def _frozenset(tx, it=None):
    return C(frozenset() if it is None else frozenset(x.const() for x in it.unpack(tx)))


@rule(slice)
def _slice(tx, *args):
    return C(slice(*[a.const() for a in args]))


@rule(object)
def _object(tx):
    raise Unsupported("K0016", "object() sentinel created inside a compiled region")


@rule(super)
def _super(tx, *args):
    if len(args) == 2:
        return V.SuperValue(args[0].const(), args[1])
    # zero-argument super(): __class__ cell and the first argument of the frame
    cls = tx.load_cell("__class__")
    first = tx.code.co_varnames[0]
    return V.SuperValue(cls.const(), tx.local(first))


# --- operator module -------------------------------------------------------------
for _name, _nb in (("add", "NB_ADD"), ("sub", "NB_SUBTRACT"), ("mul", "NB_MULTIPLY"),
                   ("truediv", "NB_TRUE_DIVIDE"), ("floordiv", "NB_FLOOR_DIVIDE"),
                   ("mod", "NB_REMAINDER"), ("pow", "NB_POWER"), ("matmul", "NB_MATRIX_MULTIPLY"),
                   ("and_", "NB_AND"), ("or_", "NB_OR"), ("xor", "NB_XOR"),
                   ("lshift", "NB_LSHIFT"), ("rshift", "NB_RSHIFT"),
                   ("iadd", "NB_INPLACE_ADD"), ("isub", "NB_INPLACE_SUBTRACT"),
                   ("imul", "NB_INPLACE_MULTIPLY"), ("itruediv", "NB_INPLACE_TRUE_DIVIDE")):
    BUILTINS[getattr(operator, _name)] = (lambda nb: lambda tx, a, b: binary_op(tx, nb, a, b))(_nb)
for _name, _sym in (("lt", "<"), ("le", "<="), ("eq", "=="), ("ne", "!="), ("gt", ">"), ("ge", ">=")):
    BUILTINS[getattr(operator, _name)] = (lambda s: lambda tx, a, b: compare_op(tx, s, a, b))(_sym)
BUILTINS[operator.neg] = lambda tx, a: unary_op(tx, "UNARY_NEGATIVE", a)
BUILTINS[operator.pos] = lambda tx, a: unary_op(tx, "UNARY_POSITIVE", a)
BUILTINS[operator.invert] = lambda tx, a: unary_op(tx, "UNARY_INVERT", a)
BUILTINS[operator.not_] = lambda tx, a: unary_op(tx, "UNARY_NOT", a)
BUILTINS[operator.truth] = lambda tx, a: C(a.truth(tx))
BUILTINS[operator.getitem] = lambda tx, a, b: subscr(tx, a, b)
BUILTINS[operator.contains] = lambda tx, a, b: C(contains_op(tx, b, a))
BUILTINS[operator.is_] = lambda tx, a, b: C(is_same(tx, a, b))
BUILTINS[operator.is_not] = lambda tx, a, b: C(not is_same(tx, a, b))


class _Getter(V.Value):
    """operator.itemgetter / attrgetter made during a trace."""

    def __init__(self, kind, keys):
        self.kind = kind
        self.keys = keys

    def call(self, tx, args, kwargs):
        obj = args[0]
        out = []
        for k in self.keys:
            if self.kind == "item":
                out.append(subscr(tx, obj, k))
            else:
                v = obj
                for part in k.const().split("."):
                    v = v.getattr(tx, part)
                out.append(v)
        return out[0] if len(out) == 1 else V.TupleValue(out)


@rule(operator.itemgetter)
def _itemgetter(tx, *keys):
    return _Getter("item", keys)


@rule(operator.attrgetter)
def _attrgetter(tx, *keys):
    return _Getter("attr", keys)


@rule(itertools.chain.from_iterable)
def _chain_from_iterable(tx, it):
    return iterators.ChainIterator(iterators.get_iter(tx, it))


@rule(dir)
def _dir(tx, *args):
    if not args:
        needs_own_frame(tx, "dir()")
    raise Unsupported("K0016", "dir() of a traced value")


@rule(vars)
def _vars(tx, *args):
    if not args:
        needs_own_frame(tx, "vars()")
    obj, = args
    if isinstance(obj, V.NewObjectValue):
        return V.DictValue(dict(obj.attrs))
    raise Unsupported("K0016", "vars() of an existing object")


# --- functools / itertools ----------------------------------------------------------
@rule(functools.reduce)
def _reduce(tx, fn, it, *init):
    items = iterators.iterate(tx, it)
    if init:
        acc = init[0]
    else:
        acc = next(items, None)
        if acc is None:
            raise UserException(V.ExceptionValue(TypeError, [C("reduce() of empty iterable with no initial value")]))
    for x in items:
        acc = fn.call(tx, [acc, x], {})
    return acc


@rule(functools.partial)
def _partial(tx, fn, *args, **kwargs):
    return V.PartialValue(fn, args, kwargs)


@rule(itertools.chain)
def _chain(tx, *its):
    return iterators.ChainIterator(V.IteratorValue(its))


@rule(itertools.product)
def _product(tx, *its, repeat=None):
    lists = [i.unpack(tx) for i in its] * (repeat.const() if repeat else 1)
    return V.IteratorValue([V.TupleValue(list(t)) for t in itertools.product(*lists)])


@rule(itertools.accumulate)
def _accumulate(tx, it, func=None, initial=None):
    return iterators.AccumulateIterator(iterators.get_iter(tx, it), func,
                                        None if initial is None or iterators.is_none(initial) else initial)


@rule(itertools.islice)
def _islice(tx, it, *args):
    bounds = slice(*[a.const() for a in args])
    start, stop, step = bounds.start or 0, bounds.stop, bounds.step or 1
    if start < 0 or (stop is not None and stop < 0) or step < 1:
        raise UserException(V.ExceptionValue(ValueError, [C(
            "Indices for islice() must be None or an integer: 0 <= x <= sys.maxsize.")]))
    return iterators.IsliceIterator(iterators.get_iter(tx, it), start, stop, step)


@rule(itertools.zip_longest)
def _zip_longest(tx, *its, fillvalue=None):
    return iterators.ZipLongestIterator([iterators.get_iter(tx, i) for i in its],
                                        fillvalue if fillvalue is not None else C(None))


@rule(math.isclose)
def _isclose(tx, a, b, **kw):
    return C(math.isclose(a.const(), b.const(), **{k: v.const() for k, v in kw.items()}))
