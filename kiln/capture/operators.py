"""Python operators over Values: constant folding, graph ops for tensors, and the
container semantics of ``+``, ``*``, ``in``, ``[]``."""
from __future__ import annotations

import operator
import types

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException

BINARY = {
    "NB_ADD": operator.add, "NB_AND": operator.and_, "NB_FLOOR_DIVIDE": operator.floordiv,
    "NB_LSHIFT": operator.lshift, "NB_MATRIX_MULTIPLY": operator.matmul,
    "NB_MULTIPLY": operator.mul, "NB_REMAINDER": operator.mod, "NB_OR": operator.or_,
    "NB_POWER": operator.pow, "NB_RSHIFT": operator.rshift, "NB_SUBTRACT": operator.sub,
    "NB_TRUE_DIVIDE": operator.truediv, "NB_XOR": operator.xor,
}
INPLACE = {
    "NB_INPLACE_ADD": operator.iadd, "NB_INPLACE_AND": operator.iand,
    "NB_INPLACE_FLOOR_DIVIDE": operator.ifloordiv, "NB_INPLACE_LSHIFT": operator.ilshift,
    "NB_INPLACE_MATRIX_MULTIPLY": operator.imatmul, "NB_INPLACE_MULTIPLY": operator.imul,
    "NB_INPLACE_REMAINDER": operator.imod, "NB_INPLACE_OR": operator.ior,
    "NB_INPLACE_POWER": operator.ipow, "NB_INPLACE_RSHIFT": operator.irshift,
    "NB_INPLACE_SUBTRACT": operator.isub, "NB_INPLACE_TRUE_DIVIDE": operator.itruediv,
    "NB_INPLACE_XOR": operator.ixor,
}
_INPLACE_TO_BINARY = {k: BINARY[k.replace("INPLACE_", "")] for k in INPLACE}
COMPARE = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
           ">": operator.gt, ">=": operator.ge}


def _tuple_like(items, *operands):
    """A tuple result; a ``torch.Size`` where an operand is a symbolic one, as
    ``Size + tuple``, ``Size[1:]`` and ``Size * 2`` are."""
    if any(v.python_type() is torch.Size and isinstance(v, V.TupleValue) for v in operands):
        return V.kinds.SizeValue(items)
    return V.TupleValue(items)


def _user_error(e):
    return UserException(V.ExceptionValue.of_real(e))


def fold(fn, *vals, **kwargs):
    try:
        return fn(*vals, **kwargs)
    except Exception as e:  # the user's own error, e.g. ZeroDivisionError
        raise _user_error(e)


def binary_op(tx, name, a, b):
    inplace = name in INPLACE
    fn = INPLACE[name] if inplace else BINARY[name]
    if isinstance(a, V.kinds.NdarrayValue) or isinstance(b, V.kinds.NdarrayValue):
        return V.rules.numpy_binary(tx, _INPLACE_TO_BINARY.get(name, fn), a, b, inplace)
    if isinstance(a, V.SymIntValue) or isinstance(b, V.SymIntValue):
        r = V.rules.sym_binary(tx, fn, a, b)
        if r is not None:
            return r
        if not (isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue)):
            # no symbolic rule (``[0] * n``): the traced value, fixed by a guard
            return binary_op(tx, name, V.rules.specialize(a), V.rules.specialize(b))
    if isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue):
        if isinstance(a, V.TensorValue):
            return tx.output.op("call_function", fn, [a, b], {})
        return tx.output.op("call_function", _INPLACE_TO_BINARY.get(name, fn), [a, b], {})

    if isinstance(a, V.kinds.DictViewValue) or isinstance(b, V.kinds.DictViewValue):
        return V.rules.view_binary_op(tx, _INPLACE_TO_BINARY.get(name, fn), a, b)
    if a.is_const() and b.is_const() and not isinstance(a, V.ListValue):
        from kiln.capture.builder import wrap_static

        return wrap_static(fold(fn, a.const(), b.const()))
    base = _INPLACE_TO_BINARY.get(name, fn)
    if base is operator.add:
        if isinstance(a, V.ListValue) and inplace:
            a.items.extend(b.unpack(tx))
            tx.output.mark_mutated(a) if a.source is not None else None
            return a
        if isinstance(a, V.ListValue) and isinstance(b, V.ListValue):
            return V.ListValue(a.items + b.items)
        if isinstance(a, V.TupleValue) and isinstance(b, V.TupleValue):
            return _tuple_like(a.items + b.items, a, b)
    if base is operator.mul:
        if isinstance(a, (V.ListValue, V.TupleValue)) and b.is_const():
            items = a.items * b.const()
            if isinstance(a, V.ListValue):
                if inplace:
                    a.items[:] = items
                    return a
                return V.ListValue(items)
            return _tuple_like(items, a)
        if isinstance(b, (V.ListValue, V.TupleValue)) and a.is_const():
            return binary_op(tx, "NB_MULTIPLY", b, a)
    if base in (operator.or_, operator.and_, operator.sub, operator.xor) and isinstance(a, V.SetValue):
        bs = b.items if isinstance(b, V.SetValue) else b.const()
        if not isinstance(bs, (set, frozenset)):
            raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
                f"unsupported operand type(s) for {_SYMBOL[base]}{'=' if inplace else ''}: "
                f"'set' and {type(bs).__name__!r}")]))
        if inplace:  # s |= t changes s itself
            {operator.or_: a.items.__ior__, operator.and_: a.items.__iand__,
             operator.sub: a.items.__isub__, operator.xor: a.items.__ixor__}[base](bs)
            if a.source is not None:
                tx.output.mark_mutated(a)
            return a
        return V.SetValue(base(a.items, bs))
    if base is operator.or_ and isinstance(a, V.DictValue) and isinstance(b, V.DictValue):
        if inplace:
            a.items.update(b.items)
            return a
        d = dict(a.items)
        d.update(b.items)
        return V.DictValue(d)
    if isinstance(a, V.ObjectValue) or isinstance(b, V.ObjectValue):
        return _object_binary(tx, base, inplace, a, b)
    raise Unsupported("K0014", f"operator {name} on {a} and {b}")


_SYMBOL = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
           operator.floordiv: "//", operator.mod: "%", operator.pow: "** or pow()",
           operator.matmul: "@", operator.and_: "&", operator.or_: "|", operator.xor: "^",
           operator.lshift: "<<", operator.rshift: ">>"}


def _object_binary(tx, base, inplace, a, b):
    """``a <op> b`` with a user object on either side: ``__iop__`` for an augmented
    assignment, then ``__op__`` / ``__rop__`` in Python's order (the right operand's
    reflected method first when its type is a subclass that overrides it)."""
    name = base.__name__.strip("_")
    if inplace:
        r = _call_slot(tx, a, f"__i{name}__", b)
        if r is not NotImplemented:
            return r
    ta, tb = a.python_type(), b.python_type()
    forward = (a, f"__{name}__", b)
    reflected = (b, f"__r{name}__", a)
    order = [forward] if ta is tb else (
        [reflected, forward] if issubclass(tb, ta) and _overrides(tb, ta, reflected[1]) else [forward, reflected])
    for x, dunder, y in order:
        r = _call_slot(tx, x, dunder, y)
        if r is not NotImplemented:
            return r
    sym = _SYMBOL.get(base, base.__name__)
    if inplace and base is not operator.pow:
        sym = sym + "="
    raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
        f"unsupported operand type(s) for {sym}: {ta.__name__!r} and {tb.__name__!r}")]))


def _overrides(sub, base, dunder):
    return getattr(sub, dunder, None) is not getattr(base, dunder, None)


def _call_slot(tx, x, dunder, y):
    """``type(x).dunder(x, y)``: a Value, or NotImplemented when the method is missing
    or says so. Builtin types do not know user classes (NotImplemented); anything
    kiln cannot tell is Unsupported."""
    if isinstance(x, V.ObjectValue):
        from kiln.capture.builder import lookup_class_attr
        from kiln.capture.objects import call_dunder

        owner, attr = lookup_class_attr(x.python_type(), dunder)
        if owner is None or owner is object:
            return _object_default(tx, x, dunder, y)
        if attr is None:
            return NotImplemented
        if not isinstance(attr, types.FunctionType):
            return _immutable_dunder(tx, x, attr, y)
        r = call_dunder(tx, x, dunder, [y], {})
        return NotImplemented if isinstance(r, V.ConstantValue) and r.value is NotImplemented else r
    if isinstance(x, (V.ConstantValue, V._Sequence, V.DictValue, V.SetValue, V.ClassValue, V.FunctionValue)) \
            and not issubclass(y.python_type(), x.python_type()):
        return NotImplemented
    raise Unsupported("K0014", f"{dunder} of {x} with {y}")


_IMMUTABLE = (str, int, float, complex, bytes, tuple, frozenset)


def _immutable_dunder(tx, x, method, y):
    """A C-level method of an existing object of an immutable builtin type (a ``str``
    or ``int`` enum member): its answer depends on which objects these are only, so
    it is computed now, with both pinned by identity guards."""
    if x.obj is None or x.attrs or not isinstance(x.obj, _IMMUTABLE):
        raise Unsupported("K0015", f"{type(x.obj).__qualname__}.{method.__name__} is implemented in C")
    if isinstance(y, V.ConstantValue):
        other = y.value
    elif isinstance(y, V.ObjectValue) and y.obj is not None and not y.attrs and isinstance(y.obj, _IMMUTABLE):
        other = y.obj
        _pin(tx, y, other)
    else:
        raise Unsupported("K0014", f"{method.__name__} of {x} with {y}")
    _pin(tx, x, x.obj)
    r = method(x.obj, other)
    if r is NotImplemented:
        return NotImplemented
    from kiln.capture.builder import wrap_static

    return wrap_static(r)


def _object_default(tx, x, dunder, y):
    """object's own comparison methods: ``__eq__`` is identity, ``__ne__`` inverts the
    type's ``__eq__``; the rest are not implemented."""
    if dunder == "__eq__":
        return V.ConstantValue(True) if is_same(tx, x, y) else NotImplemented
    if dunder == "__ne__":
        r = _call_slot(tx, x, "__eq__", y)
        return r if r is NotImplemented else V.ConstantValue(not r.truth(tx))
    return NotImplemented


_REFLECTED = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_COMPARE_DUNDER = {"==": "__eq__", "!=": "__ne__", "<": "__lt__", "<=": "__le__",
                   ">": "__gt__", ">=": "__ge__"}


def _object_compare(tx, op, a, b):
    """Rich comparison with a user object on either side, in Python's order; ``==``
    and ``!=`` fall back to identity."""
    ta, tb = a.python_type(), b.python_type()
    forward = (a, _COMPARE_DUNDER[op], b)
    reflected = (b, _COMPARE_DUNDER[_REFLECTED[op]], a)
    order = [forward, reflected]
    if ta is not tb and issubclass(tb, ta) and _overrides(tb, ta, reflected[1]):
        order.reverse()
    for x, dunder, y in order:
        r = _call_slot(tx, x, dunder, y)
        if r is not NotImplemented:
            return r
    if op in ("==", "!="):
        return V.ConstantValue((op == "==") == is_same(tx, a, b))
    raise UserException(V.ExceptionValue(TypeError, [V.ConstantValue(
        f"{op!r} not supported between instances of {ta.__name__!r} and {tb.__name__!r}")]))


def _compare_sequences(tx, op, a, b):
    """Lists with lists, tuples with tuples: item by item (identity first, as CPython
    does), then by length."""
    ia, ib = a.items, b.items
    if op in ("==", "!=") and len(ia) != len(ib):
        return V.ConstantValue(op == "!=")
    for x, y in zip(ia, ib):
        if not values_equal(tx, x, y):
            if op in ("==", "!="):
                return V.ConstantValue(op == "!=")
            return compare_op(tx, op, x, y)
    return V.ConstantValue(COMPARE[op](len(ia), len(ib)))


def values_equal(tx, a, b) -> bool:
    """CPython's ``PyObject_RichCompareBool(a, b, Py_EQ)``: identity first, then ``==``
    (``in``, ``list.index``, ``list.count``, ``list.remove``)."""
    if isinstance(a, V.SymIntValue) or isinstance(b, V.SymIntValue):
        return compare_op(tx, "==", a, b).truth(tx)   # ints: == is reflexive, identity adds nothing
    if is_same(tx, a, b):
        return True
    return compare_op(tx, "==", a, b).truth(tx)


def compare_op(tx, op, a, b):
    fn = COMPARE[op]
    if isinstance(a, V.kinds.NdarrayValue) or isinstance(b, V.kinds.NdarrayValue):
        return V.rules.numpy_compare(tx, fn, a, b)
    if isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue):
        if (isinstance(a, V.ConstantValue) and a.value is None) or (isinstance(b, V.ConstantValue) and b.value is None):
            return V.ConstantValue(fn(object(), None) if op in ("==", "!=") else False)
        return tx.output.op("call_function", fn, [a, b], {})
    if isinstance(a, V.SymIntValue) or isinstance(b, V.SymIntValue):
        r = V.rules.sym_compare(tx, fn, a, b)
        if r is not None:
            return r
        return compare_op(tx, op, V.rules.specialize(a), V.rules.specialize(b))
    if a.is_const() and b.is_const():
        return V.ConstantValue(fold(fn, a.const(), b.const()))

    if isinstance(a, V.kinds.DictViewValue) or isinstance(b, V.kinds.DictViewValue):
        return V.rules.view_compare(tx, fn, a, b)
    if isinstance(a, V.ObjectValue) or isinstance(b, V.ObjectValue):
        return _object_compare(tx, op, a, b)
    if isinstance(a, V._Sequence) and isinstance(b, V._Sequence):
        same_kind = all(issubclass(v.python_type(), tuple) for v in (a, b)) or \
            all(issubclass(v.python_type(), list) for v in (a, b))
        if same_kind:
            return _compare_sequences(tx, op, a, b)
        if op in ("==", "!="):
            return V.ConstantValue(op == "!=")
    if op in ("==", "!="):
        if is_same(tx, a, b):
            return V.ConstantValue(op == "==")
        if type(a) is not type(b) or isinstance(a, (V.UserFunctionValue, V.ClassValue)):
            return V.ConstantValue(op == "!=")
    raise Unsupported("K0014", f"comparison {op} between {a} and {b}")


def _real_object(v):
    """The existing object a Value stands for (None for one made by the program)."""
    if isinstance(v, V.NewObjectValue):
        return None
    if isinstance(v, V.ObjectValue):
        return v.obj
    if isinstance(v, V.ClassValue):
        return v.cls
    if isinstance(v, (V.UserFunctionValue, V._CallableRef)):
        return v.fn
    if isinstance(v, V.PythonModuleValue):
        return v.mod
    return None


def _one_value_per_object(v) -> bool:
    """Values that are the only Value of their object: two different ones are two
    different objects (tensors, mutable containers, objects, iterators, and whatever
    the program made: functions, exceptions, views, bound methods). Not tuples: CPython
    shares some (``()``, constants, ``tuple(t)`` is ``t``)."""

    return isinstance(v, (V.TensorValue, V.ListValue, V.DictValue, V.SetValue, V.ObjectValue,
                          V.IteratorValue, V.ExceptionValue, V.NestedFunctionValue, V.MethodValue,
                          V.CellValue, V.GradModeValue, V.kinds.DictViewValue))


def _pin(tx, v, real):
    """The trace assumes which object ``v`` is: guard that (objects are otherwise
    guarded on their type only)."""
    if isinstance(v, V.ObjectValue) and v.source is not None:
        tx.output.guards.identity(v.source, real)


def is_same(tx, a, b) -> bool:
    """``a is b``."""
    if a is b:
        return True
    if isinstance(a, V.TensorValue) and isinstance(b, V.TensorValue):
        V.rules.check_identity(tx, a, b)
    if isinstance(a, V.ConstantValue) and isinstance(b, V.ConstantValue):
        return a.value is b.value or (type(a.value) is type(b.value) and a.value == b.value and type(a.value) in (bool, type(None)))
    ra, rb = _real_object(a), _real_object(b)
    if ra is not None and rb is not None:
        _pin(tx, a, ra)
        _pin(tx, b, rb)
        return ra is rb
    if _one_value_per_object(a) or _one_value_per_object(b):
        return False
    if isinstance(a, V.ConstantValue) and a.value is None:
        return False
    if isinstance(b, V.ConstantValue) and b.value is None:
        return False
    if getattr(a, "shared_identity", False) or getattr(b, "shared_identity", False):
        raise Unsupported("K0017", f"identity of {a} and {b}")  # CPython may share the object
    if type(a) is not type(b):
        return False
    if isinstance(a, V.TupleValue) and ((a.source is not None and a.source == b.source)
                                        or (not a.items and not b.items)):
        return True  # one tuple read twice; the empty tuple (a singleton)
    raise Unsupported("K0017", f"identity of {a} and {b}")


def unary_op(tx, opname, v):
    fn = {"UNARY_NEGATIVE": operator.neg, "UNARY_NOT": operator.not_,
          "UNARY_INVERT": operator.invert, "UNARY_POSITIVE": operator.pos}[opname]
    if isinstance(v, V.kinds.NdarrayValue):
        return V.rules.numpy_unary(tx, fn, v)
    if isinstance(v, V.SymIntValue):
        r = V.rules.sym_unary(tx, fn, v)
        return r if r is not None else unary_op(tx, opname, V.rules.specialize(v))
    if isinstance(v, V.TensorValue):
        if fn is operator.not_:
            raise Unsupported("K0006", "`not` on a tensor (data-dependent)")
        return tx.output.op("call_function", fn, [v], {})
    if fn is operator.not_:
        return V.ConstantValue(not v.truth(tx))
    if isinstance(v, V.ObjectValue):
        from kiln.capture.objects import call_dunder, has_dunder

        dunder = {"UNARY_NEGATIVE": "__neg__", "UNARY_INVERT": "__invert__", "UNARY_POSITIVE": "__pos__"}[opname]
        if has_dunder(v, dunder):
            return call_dunder(tx, v, dunder, [], {})
    if v.is_const():
        return V.ConstantValue(fold(fn, v.const()))
    raise Unsupported("K0014", f"{opname} on {v}")


def contains_op(tx, item, container) -> bool:
    if hasattr(container, "contains"):  # a container with its own key protocol
        return container.contains(tx, item)
    if isinstance(container, V.TensorValue) or isinstance(item, V.TensorValue) and not isinstance(container, (V.ListValue, V.TupleValue)):
        raise Unsupported("K0006", "`in` on a tensor (data-dependent)")
    if isinstance(container, V.DictValue):
        return item.const() in container.items
    if isinstance(container, V.SetValue):
        return item.const() in container.items
    if isinstance(container, V.ConstantValue) and (item.is_const() or isinstance(container.value, (str, bytes))):
        return fold(operator.contains, container.value, item.const())
    if isinstance(container, V.ModuleValue) and hasattr(container.mod, "__contains__"):
        return item.const() in container.mod
    if isinstance(container, V.ObjectValue):
        from kiln.capture.objects import call_dunder, has_dunder

        if has_dunder(container, "__contains__"):
            return call_dunder(tx, container, "__contains__", [item], {}).truth(tx)

    # item by item, as CPython's search does: an iterator stops at the first match
    return any(values_equal(tx, i, item) for i in V.rules.iterate(tx, container))


def subscr(tx, o, k):
    if isinstance(o, V.TensorValue):
        return tx.output.op("call_function", operator.getitem, [o, k], {})
    if isinstance(o, (V.ListValue, V.TupleValue)):
        if isinstance(k, V.TensorValue):
            k = V.rules.index_value(tx, k)
        key = k.const()
        try:
            r = o.items[key]
        except (IndexError, TypeError):  # the error (and message) of the real type
            fold(operator.getitem, (list if isinstance(o, V.ListValue) else tuple)(o.items), key)
            raise
        if isinstance(key, slice):
            return V.ListValue(r) if isinstance(o, V.ListValue) else _tuple_like(r, o)
        return r
    if isinstance(o, V.DictValue) or hasattr(o, "getitem"):
        return o.getitem(tx, k)
    if isinstance(o, V.ConstantValue):
        return V.ConstantValue(fold(operator.getitem, o.value, k.const()))
    if isinstance(o, V.ModuleValue):
        return V.rules.module_getitem(tx, o, k)
    if isinstance(o, V.ClassValue):
        return V.ClassValue(o.cls[k.const()])  # typing generics: List[int]
    if isinstance(o, V.ObjectValue):
        from kiln.capture.objects import call_dunder

        return call_dunder(tx, o, "__getitem__", [k], {})
    raise Unsupported("K0014", f"subscript of {o}")


def store_subscr(tx, o, k, v):
    if isinstance(o, V.TensorValue):
        tx.output.op("call_function", operator.setitem, [o, k, v], {})
        return
    if isinstance(o, V.ListValue):
        key = k.const()
        if isinstance(key, slice):
            o.items[key] = v.unpack(tx)
        else:
            try:
                o.items[key] = v
            except IndexError as e:
                raise _user_error(e)
        if o.source is not None:
            tx.output.mark_mutated(o)
        return
    if isinstance(o, V.DictValue) or hasattr(o, "setitem"):
        o.setitem(tx, k, v)
        return
    if isinstance(o, V.ObjectValue):
        from kiln.capture.objects import call_dunder

        call_dunder(tx, o, "__setitem__", [k, v], {})
        return
    raise Unsupported("K0014", f"item assignment on {o}")


def format_value(tx, v, conv, spec):
    if isinstance(v, V.TensorValue):
        raise Unsupported("K0007", "formatting a tensor into a string needs its data")
    val = v.const()
    if conv == 1:
        val = str(val)
    elif conv == 2:
        val = repr(val)
    elif conv == 3:
        val = ascii(val)
    return V.ConstantValue(format(val, spec))
