"""Python operators over Values: constant folding, graph ops for tensors, and the
container semantics of ``+``, ``*``, ``in``, ``[]``."""
from __future__ import annotations

import operator

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


def _user_error(e):
    return UserException(V.ExceptionValue(type(e), [V.ConstantValue(str(e))]))


def fold(fn, *vals):
    try:
        return fn(*vals)
    except Exception as e:  # the user's own error, e.g. ZeroDivisionError
        raise _user_error(e)


def binary_op(tx, name, a, b):
    inplace = name in INPLACE
    fn = INPLACE[name] if inplace else BINARY[name]
    if isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue):
        if isinstance(a, V.TensorValue):
            return tx.output.op("call_function", fn, [a, b], {})
        return tx.output.op("call_function", _INPLACE_TO_BINARY.get(name, fn), [a, b], {})
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
            return V.TupleValue(a.items + b.items)
    if base is operator.mul:
        if isinstance(a, (V.ListValue, V.TupleValue)) and b.is_const():
            items = a.items * b.const()
            if isinstance(a, V.ListValue):
                if inplace:
                    a.items[:] = items
                    return a
                return V.ListValue(items)
            return V.TupleValue(items)
        if isinstance(b, (V.ListValue, V.TupleValue)) and a.is_const():
            return binary_op(tx, "NB_MULTIPLY", b, a)
    if base in (operator.or_, operator.and_, operator.sub, operator.xor) and isinstance(a, V.SetValue):
        bs = set(b.const()) if not isinstance(b, V.SetValue) else set(b.items)
        return V.SetValue(list(base(set(a.items), bs)))
    if base is operator.or_ and isinstance(a, V.DictValue) and isinstance(b, V.DictValue):
        if inplace:
            a.items.update(b.items)
            return a
        d = dict(a.items)
        d.update(b.items)
        return V.DictValue(d)
    if isinstance(a, V.ObjectValue):
        from kiln.capture.objects import call_dunder, has_dunder

        dunder = "__" + fn.__name__.strip("_") + "__"
        if has_dunder(a, dunder):
            return call_dunder(tx, a, dunder, [b], {})
    raise Unsupported(f"operator {name} on {a} and {b}")


def compare_op(tx, op, a, b):
    fn = COMPARE[op]
    if isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue):
        if (isinstance(a, V.ConstantValue) and a.value is None) or (isinstance(b, V.ConstantValue) and b.value is None):
            return V.ConstantValue(fn(object(), None) if op in ("==", "!=") else False)
        return tx.output.op("call_function", fn, [a, b], {})
    if a.is_const() and b.is_const():
        return V.ConstantValue(fold(fn, a.const(), b.const()))
    if isinstance(a, (V.ListValue, V.TupleValue)) and isinstance(b, (V.ListValue, V.TupleValue)):
        if type(a) is not type(b) and op in ("==", "!="):
            return V.ConstantValue(op == "!=")
        try:
            return V.ConstantValue(fn([i.const() for i in a.items], [i.const() for i in b.items]))
        except Unsupported:
            pass
    if op in ("==", "!="):
        if is_same(a, b):
            return V.ConstantValue(op == "==")
        if type(a) is not type(b) or isinstance(a, (V.ObjectValue, V.UserFunctionValue, V.ClassValue)):
            if not (isinstance(a, V.ObjectValue) and _has_eq(a)):
                return V.ConstantValue(op == "!=")
    raise Unsupported(f"comparison {op} between {a} and {b}")


def _has_eq(a):
    return type(a.python_type()).__eq__ is not type.__eq__ and a.python_type().__eq__ is not object.__eq__


def is_same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, V.ConstantValue) and isinstance(b, V.ConstantValue):
        return a.value is b.value or (type(a.value) is type(b.value) and a.value == b.value and type(a.value) in (bool, type(None)))
    for attr in ("obj", "fn", "cls", "mod"):
        x, y = getattr(a, attr, None), getattr(b, attr, None)
        if x is not None and y is not None:
            return x is y
    if isinstance(a, V.ConstantValue) and a.value is None:
        return False
    if isinstance(b, V.ConstantValue) and b.value is None:
        return False
    if isinstance(a, V.TensorValue) or isinstance(b, V.TensorValue):
        return False
    if type(a) is not type(b):
        return False
    raise Unsupported(f"identity of {a} and {b}")


def unary_op(tx, opname, v):
    fn = {"UNARY_NEGATIVE": operator.neg, "UNARY_NOT": operator.not_,
          "UNARY_INVERT": operator.invert, "UNARY_POSITIVE": operator.pos}[opname]
    if isinstance(v, V.TensorValue):
        if fn is operator.not_:
            raise Unsupported("`not` on a tensor (data-dependent)")
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
    raise Unsupported(f"{opname} on {v}")


def contains_op(tx, item, container) -> bool:
    if isinstance(container, V.TensorValue) or isinstance(item, V.TensorValue) and not isinstance(container, (V.ListValue, V.TupleValue)):
        raise Unsupported("`in` on a tensor (data-dependent)")
    if isinstance(container, V.DictValue):
        return item.const() in container.items
    if isinstance(container, V.SetValue):
        return item.const() in container.items
    if isinstance(container, V.ConstantValue):
        return fold(operator.contains, container.value, item.const())
    if isinstance(container, V.ModuleValue) and hasattr(container.mod, "__contains__"):
        return item.const() in container.mod
    if isinstance(container, V.ObjectValue):
        from kiln.capture.objects import call_dunder, has_dunder

        if has_dunder(container, "__contains__"):
            return call_dunder(tx, container, "__contains__", [item], {}).truth(tx)
    items = container.unpack(tx)
    for i in items:
        if is_same(i, item):
            return True
        if i.is_const() and item.is_const() and i.const() == item.const():
            return True
        if isinstance(i, V.TensorValue) or isinstance(item, V.TensorValue):
            continue
    return False


def subscr(tx, o, k):
    if isinstance(o, V.TensorValue):
        return tx.output.op("call_function", operator.getitem, [o, k], {})
    if isinstance(o, (V.ListValue, V.TupleValue)):
        key = k.const()
        try:
            r = o.items[key]
        except (IndexError, TypeError) as e:
            raise _user_error(e)
        if isinstance(key, slice):
            return V.ListValue(r) if isinstance(o, V.ListValue) else V.TupleValue(r)
        return r
    if isinstance(o, V.DictValue):
        return o.getitem(tx, k)
    if isinstance(o, V.ConstantValue):
        return V.ConstantValue(fold(operator.getitem, o.value, k.const()))
    if isinstance(o, V.ModuleValue):
        from kiln.capture.modules import module_getitem

        return module_getitem(tx, o, k)
    if isinstance(o, V.ClassValue):
        return V.ClassValue(o.cls[k.const()])  # typing generics: List[int]
    if isinstance(o, V.ObjectValue):
        from kiln.capture.objects import call_dunder

        return call_dunder(tx, o, "__getitem__", [k], {})
    raise Unsupported(f"subscript of {o}")


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
    if isinstance(o, V.DictValue):
        o.setitem(tx, k, v)
        return
    if isinstance(o, V.ObjectValue):
        from kiln.capture.objects import call_dunder

        call_dunder(tx, o, "__setitem__", [k, v], {})
        return
    raise Unsupported(f"item assignment on {o}")


def format_value(tx, v, conv, spec):
    if isinstance(v, V.TensorValue):
        raise Unsupported("formatting a tensor into a string needs its data")
    val = v.const()
    if conv == 1:
        val = str(val)
    elif conv == 2:
        val = repr(val)
    elif conv == 3:
        val = ascii(val)
    return V.ConstantValue(format(val, spec))
