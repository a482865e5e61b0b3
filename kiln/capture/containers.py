"""Methods of list, tuple, dict and set Values, one table per type (method name ->
``(fn(tx, container, name, args, kwargs), mutates)``). A mutator returns None and
answers None; a mutation of a container that exists outside the frame (it has a source)
is recorded, so the generated code applies it."""
from __future__ import annotations

from kiln.capture import values as V
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.operators import values_equal


def _err(cls, msg):
    return UserException(V.ExceptionValue(cls, [V.ConstantValue(msg)]))


def _mutated(tx, c):
    if c.source is not None:
        tx.output.mark_mutated(c)


LIST_METHODS: dict = {}
TUPLE_METHODS: dict = {}
DICT_METHODS: dict = {}
SET_METHODS: dict = {}


def _method(tables, *names, mutates=False):
    """Register the decorated function as methods ``names`` of each table."""
    def deco(fn):
        for table in tables:
            for n in names:
                table[n] = (fn, mutates)
        return fn

    return deco


def _call(table, kind, tx, c, name, args, kwargs):
    entry = table.get(name)
    if entry is None:
        raise Unsupported("K0019", f"{kind}.{name}")
    fn, mutates = entry
    r = fn(tx, c, name, args, kwargs)
    if not mutates:
        return r
    _mutated(tx, c)
    return V.ConstantValue(None)


@V.rule
def list_method(tx, lst, name, args, kwargs):
    return _call(LIST_METHODS, "list", tx, lst, name, args, kwargs)


@V.rule
def tuple_method(tx, seq, name, args, kwargs):
    return _call(TUPLE_METHODS, "tuple", tx, seq, name, args, kwargs)


@V.rule
def dict_method(tx, d, name, args, kwargs):
    return _call(DICT_METHODS, "dict", tx, d, name, args, kwargs)


@V.rule
def set_method(tx, s, name, args, kwargs):
    """The method run on the real set of constants (same results, same order)."""
    return _call(SET_METHODS, "set", tx, s, name, args, kwargs)


# --- list -------------------------------------------------------------------------------
@_method([LIST_METHODS], "append", mutates=True)
def _list_append(tx, lst, name, args, kwargs):
    lst.items.append(args[0])


@_method([LIST_METHODS], "extend", mutates=True)
def _list_extend(tx, lst, name, args, kwargs):
    lst.items.extend(args[0].unpack(tx))


@_method([LIST_METHODS], "insert", mutates=True)
def _list_insert(tx, lst, name, args, kwargs):
    lst.items.insert(args[0].const(), args[1])


@_method([LIST_METHODS], "pop")
def _list_pop(tx, lst, name, args, kwargs):
    if not lst.items:
        raise _err(IndexError, "pop from empty list")
    r = lst.items.pop(args[0].const() if args else -1)
    _mutated(tx, lst)
    return r


@_method([LIST_METHODS], "remove", mutates=True)
def _list_remove(tx, lst, name, args, kwargs):
    items = lst.items
    for i, x in enumerate(items):
        if values_equal(tx, x, args[0]):
            del items[i]
            break
    else:
        raise _err(ValueError, "list.remove(x): x not in list")


@_method([LIST_METHODS, DICT_METHODS, SET_METHODS], "clear", mutates=True)
def _clear(tx, c, name, args, kwargs):
    c.items.clear()


@_method([LIST_METHODS], "reverse", mutates=True)
def _list_reverse(tx, lst, name, args, kwargs):
    lst.items.reverse()


@_method([LIST_METHODS], "sort", mutates=True)
def _list_sort(tx, lst, name, args, kwargs):
    key = kwargs.get("key")
    rev = kwargs.get("reverse", V.ConstantValue(False)).const()

    lst.items[:] = V.rules.sorted_values(tx, lst.items, key, rev)


@_method([LIST_METHODS], "__delitem__", mutates=True)
def _list_delitem(tx, lst, name, args, kwargs):
    del lst.items[args[0].const()]


@_method([LIST_METHODS], "copy")
def _list_copy(tx, lst, name, args, kwargs):
    return V.ListValue(list(lst.items))


# --- tuple (and the reads lists share) ----------------------------------------------------
@_method([TUPLE_METHODS, LIST_METHODS], "index")
def _seq_index(tx, seq, name, args, kwargs):
    for i, x in enumerate(seq.items):
        if values_equal(tx, x, args[0]):
            return V.ConstantValue(i)
    raise _err(ValueError, "x not in sequence")


@_method([TUPLE_METHODS, LIST_METHODS], "count")
def _seq_count(tx, seq, name, args, kwargs):
    return V.ConstantValue(sum(1 for x in seq.items if values_equal(tx, x, args[0])))


@_method([TUPLE_METHODS, LIST_METHODS, DICT_METHODS, SET_METHODS], "__len__")
def _len(tx, c, name, args, kwargs):
    return V.ConstantValue(len(c.items))


@_method([TUPLE_METHODS, LIST_METHODS, DICT_METHODS], "__getitem__")
def _getitem(tx, c, name, args, kwargs):
    from kiln.capture.operators import subscr

    return subscr(tx, c, args[0])


@_method([TUPLE_METHODS, LIST_METHODS], "__contains__")
def _seq_contains(tx, seq, name, args, kwargs):
    from kiln.capture.operators import contains_op

    return V.ConstantValue(contains_op(tx, args[0], seq))


@_method([TUPLE_METHODS], "_replace")
def _namedtuple_replace(tx, seq, name, args, kwargs):
    if not isinstance(seq, V.NamedTupleValue):
        raise Unsupported("K0019", f"tuple.{name}")
    fields = seq.cls._fields
    new = list(seq.items)
    for k, v in kwargs.items():
        new[fields.index(k)] = v
    return V.NamedTupleValue(seq.cls, new)


@_method([TUPLE_METHODS], "_asdict")
def _namedtuple_asdict(tx, seq, name, args, kwargs):
    if not isinstance(seq, V.NamedTupleValue):
        raise Unsupported("K0019", f"tuple.{name}")
    return V.DictValue(dict(zip(seq.cls._fields, seq.items)))


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


# --- dict -------------------------------------------------------------------------------
@_method([DICT_METHODS], "get")
def _dict_get(tx, d, name, args, kwargs):
    return d.items.get(args[0].const(), args[1] if len(args) > 1 else V.ConstantValue(None))


@_method([DICT_METHODS], "keys", "values", "items")
def _dict_view(tx, d, name, args, kwargs):
    from kiln.capture.dict_views import DictViewValue

    return DictViewValue(d, name)


@_method([DICT_METHODS, SET_METHODS], "__contains__")
def _key_contains(tx, c, name, args, kwargs):
    return V.ConstantValue(args[0].const() in c.items)


@_method([DICT_METHODS], "copy")
def _dict_copy(tx, d, name, args, kwargs):
    return V.DictValue(dict(d.items), cls=d.cls)


@_method([DICT_METHODS], "update", mutates=True)
def _dict_update(tx, d, name, args, kwargs):
    if args:
        for k, v in dict_items_of(tx, args[0]):
            d.items[k] = v
    for k, v in kwargs.items():
        d.items[k] = v


@_method([DICT_METHODS], "setdefault")
def _dict_setdefault(tx, d, name, args, kwargs):
    items = d.items
    k = args[0].const()
    if k not in items:
        items[k] = args[1] if len(args) > 1 else V.ConstantValue(None)
        _mutated(tx, d)
    return items[k]


@_method([DICT_METHODS], "pop")
def _dict_pop(tx, d, name, args, kwargs):
    items = d.items
    k = args[0].const()
    if k in items:
        r = items.pop(k)
        _mutated(tx, d)
        return r
    if len(args) > 1:
        return args[1]
    raise UserException(V.ExceptionValue(KeyError, [args[0]]))


@_method([DICT_METHODS], "popitem")
def _dict_popitem(tx, d, name, args, kwargs):
    if not d.items:
        raise _err(KeyError, "popitem(): dictionary is empty")
    k, v = d.items.popitem()
    _mutated(tx, d)
    return V.TupleValue([V.ConstantValue(k), v])


@_method([DICT_METHODS], "__setitem__", mutates=True)
def _dict_setitem(tx, d, name, args, kwargs):
    d.items[args[0].const()] = args[1]


@_method([DICT_METHODS], "__delitem__", mutates=True)
def _dict_delitem(tx, d, name, args, kwargs):
    k = args[0].const()
    if k not in d.items:
        raise UserException(V.ExceptionValue(KeyError, [args[0]]))
    del d.items[k]


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


# --- set: run on the real set of constants -----------------------------------------------
_SET_READS = ("union", "intersection", "difference", "symmetric_difference", "issubset",
              "issuperset", "isdisjoint")
_SET_UPDATES = ("update", "intersection_update", "difference_update", "symmetric_difference_update")


@_method([SET_METHODS], "add", "discard", mutates=True)
def _set_add_discard(tx, s, name, args, kwargs):
    getattr(s.items, name)(args[0].const())


@_method([SET_METHODS], "remove", mutates=True)
def _set_remove(tx, s, name, args, kwargs):
    if args[0].const() not in s.items:
        raise UserException(V.ExceptionValue(KeyError, [args[0]]))
    s.items.remove(args[0].const())


@_method([SET_METHODS], *_SET_UPDATES, mutates=True)
def _set_update(tx, s, name, args, kwargs):
    getattr(s.items, name)(*[set_operand(tx, a) for a in args])


@_method([SET_METHODS], "pop")
def _set_pop(tx, s, name, args, kwargs):
    if not s.items:
        raise _err(KeyError, "pop from an empty set")
    r = s.items.pop()
    _mutated(tx, s)
    return V.ConstantValue(r)


@_method([SET_METHODS], *_SET_READS)
def _set_read(tx, s, name, args, kwargs):
    r = getattr(s.items, name)(*[set_operand(tx, a) for a in args])
    return V.SetValue(r) if isinstance(r, set) else V.ConstantValue(r)


@_method([SET_METHODS], "copy")
def _set_copy(tx, s, name, args, kwargs):
    return V.SetValue(s.items.copy())
