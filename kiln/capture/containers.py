"""Methods of list, tuple, dict and set Values. A mutation of a container that exists
outside the frame (it has a source) is recorded, so the generated code applies it."""
from __future__ import annotations

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.operators import values_equal


def _err(cls, msg):
    return UserException(V.ExceptionValue(cls, [V.ConstantValue(msg)]))


def _mutated(tx, c):
    if c.source is not None:
        tx.output.mark_mutated(c)


@V.rule
def list_method(tx, lst, name, args, kwargs):
    items = lst.items
    if name == "append":
        items.append(args[0])
    elif name == "extend":
        items.extend(args[0].unpack(tx))
    elif name == "insert":
        items.insert(args[0].const(), args[1])
    elif name == "pop":
        if not items:
            raise _err(IndexError, "pop from empty list")
        r = items.pop(args[0].const() if args else -1)
        _mutated(tx, lst)
        return r
    elif name == "remove":
        for i, x in enumerate(items):
            if values_equal(tx, x, args[0]):
                del items[i]
                break
        else:
            raise _err(ValueError, "list.remove(x): x not in list")
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "sort":
        key = kwargs.get("key")
        rev = kwargs.get("reverse", V.ConstantValue(False)).const()
        from kiln.capture.builtins import sorted_values

        items[:] = sorted_values(tx, items, key, rev)
    elif name == "__delitem__":
        del items[args[0].const()]
    elif name == "copy":
        return V.ListValue(list(items))
    elif name in ("index", "count", "__len__", "__getitem__", "__contains__"):
        return tuple_method(tx, lst, name, args, kwargs)
    else:
        raise Unsupported("K0019", f"list.{name}")
    _mutated(tx, lst)
    return V.ConstantValue(None)


@V.rule
def tuple_method(tx, seq, name, args, kwargs):
    items = seq.items
    if name == "index":
        for i, x in enumerate(items):
            if values_equal(tx, x, args[0]):
                return V.ConstantValue(i)
        raise _err(ValueError, "x not in sequence")
    if name == "count":
        return V.ConstantValue(sum(1 for x in items if values_equal(tx, x, args[0])))
    if name == "__len__":
        return V.ConstantValue(len(items))
    if name == "__getitem__":
        from kiln.capture.operators import subscr

        return subscr(tx, seq, args[0])
    if name == "__contains__":
        from kiln.capture.operators import contains_op

        return V.ConstantValue(contains_op(tx, args[0], seq))
    if isinstance(seq, V.NamedTupleValue) and name == "_replace":
        fields = seq.cls._fields
        new = list(items)
        for k, v in kwargs.items():
            new[fields.index(k)] = v
        return V.NamedTupleValue(seq.cls, new)
    if isinstance(seq, V.NamedTupleValue) and name == "_asdict":
        return V.DictValue(dict(zip(seq.cls._fields, items)))
    raise Unsupported("K0019", f"tuple.{name}")


def dict_items_of(tx, v):
    """(key, Value) pairs of a mapping Value, or of an iterable of pairs, for
    ``dict(x)``, ``**kwargs`` and ``dict.update``."""
    if isinstance(v, V.DictValue):
        return list(v.items.items())
    from kiln.capture import iterators

    if isinstance(v, V.ObjectValue) and not iterators.is_iterator(v):
        from kiln.capture.objects import object_mapping_items

        return object_mapping_items(tx, v)
    out = []
    for i, pair in enumerate(iterators.iterate(tx, v)):
        kv = pair.unpack(tx)
        if len(kv) != 2:
            raise _err(ValueError, f"dictionary update sequence element #{i} has length {len(kv)}; 2 is required")
        out.append((kv[0].const(), kv[1]))
    return out


@V.rule
def dict_method(tx, d, name, args, kwargs):
    items = d.items
    if name == "get":
        k = args[0].const()
        return items.get(k, args[1] if len(args) > 1 else V.ConstantValue(None))
    if name in ("keys", "values", "items"):
        from kiln.capture.dict_views import DictViewValue

        return DictViewValue(d, name)
    if name == "__getitem__":
        from kiln.capture.operators import subscr

        return subscr(tx, d, args[0])
    if name == "__contains__":
        return V.ConstantValue(args[0].const() in items)
    if name == "__len__":
        return V.ConstantValue(len(items))
    if name == "copy":
        return V.DictValue(dict(items), cls=d.cls)
    if name == "update":
        if args:
            for k, v in dict_items_of(tx, args[0]):
                items[k] = v
        for k, v in kwargs.items():
            items[k] = v
    elif name == "setdefault":
        k = args[0].const()
        if k not in items:
            items[k] = args[1] if len(args) > 1 else V.ConstantValue(None)
            _mutated(tx, d)
        return items[k]
    elif name == "pop":
        k = args[0].const()
        if k in items:
            r = items.pop(k)
            _mutated(tx, d)
            return r
        if len(args) > 1:
            return args[1]
        raise UserException(V.ExceptionValue(KeyError, [args[0]]))
    elif name == "popitem":
        if not items:
            raise _err(KeyError, "popitem(): dictionary is empty")
        k, v = items.popitem()
        _mutated(tx, d)
        return V.TupleValue([V.ConstantValue(k), v])
    elif name == "clear":
        items.clear()
    elif name == "__setitem__":
        items[args[0].const()] = args[1]
    elif name == "__delitem__":
        k = args[0].const()
        if k not in items:
            raise UserException(V.ExceptionValue(KeyError, [args[0]]))
        del items[k]
    else:
        raise Unsupported("K0019", f"dict.{name}")
    _mutated(tx, d)
    return V.ConstantValue(None)


def set_operand(tx, v):
    """What a set method receives for ``v``, as real as kiln can make it: the mirrored
    set, the constant itself, a dict of the same keys (CPython sizes its table from
    these), or the items one by one."""
    if isinstance(v, V.SetValue):
        return v.items
    if isinstance(v, V.ConstantValue):
        return v.value
    if type(v) is V.DictValue:
        return dict.fromkeys(v.items)
    from kiln.capture.iterators import iterate

    return [x.const() for x in iterate(tx, v)]


_SET_READS = ("union", "intersection", "difference", "symmetric_difference", "issubset",
              "issuperset", "isdisjoint")
_SET_UPDATES = ("update", "intersection_update", "difference_update", "symmetric_difference_update")


@V.rule
def set_method(tx, s, name, args, kwargs):
    """The method run on the real set of constants (same results, same order)."""
    items = s.items
    if name in ("add", "discard"):
        getattr(items, name)(args[0].const())
    elif name == "remove":
        if args[0].const() not in items:
            raise UserException(V.ExceptionValue(KeyError, [args[0]]))
        items.remove(args[0].const())
    elif name in _SET_UPDATES:
        getattr(items, name)(*[set_operand(tx, a) for a in args])
    elif name == "clear":
        items.clear()
    elif name == "pop":
        if not items:
            raise _err(KeyError, "pop from an empty set")
        r = items.pop()
        _mutated(tx, s)
        return V.ConstantValue(r)
    elif name in _SET_READS:
        r = getattr(items, name)(*[set_operand(tx, a) for a in args])
        return V.SetValue(r) if isinstance(r, set) else V.ConstantValue(r)
    elif name == "copy":
        return V.SetValue(items.copy())
    elif name == "__contains__":
        return V.ConstantValue(args[0].const() in items)
    elif name == "__len__":
        return V.ConstantValue(len(items))
    else:
        raise Unsupported("K0019", f"set.{name}")
    _mutated(tx, s)
    return V.ConstantValue(None)
