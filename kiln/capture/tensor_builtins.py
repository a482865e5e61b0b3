"""Python builtins applied to tensors where eager's answer can be computed in the graph
exactly, or read (and guarded) from an input:

* ``max(a, b, ...)`` / ``min`` of one-element tensors: CPython keeps the first item
  and replaces it when ``item > best`` (``<`` for min) is true, so the result is
  ``torch.where(x > best, x, best)`` item by item — NaN and ties pick what eager picks.
  Only for tensors of one dtype, shape and ``requires_grad`` (``where`` would promote,
  broadcast or attach a gradient eager's chosen tensor lacks), none of them a graph
  input (eager returns that very object, the graph a new one). Anything else — a
  tensor against a number, whose result type depends on the data — stays a break.
  Eager's result *is* one of the operands, so the graph's stand-in must not be told
  apart: an operand that is a view of a graph input is a break, and later in-place
  writes into the result, the operands or the tensors they view, and ``is`` tests on
  them, are breaks (``check_write``, ``check_identity``).
* ``seq[i]`` with ``i`` a 0-d integer tensor read from an input: its value is read at
  trace time and guarded (a new value recompiles).
"""
from __future__ import annotations

import operator

import torch

from kiln.capture import builtins as _builtins  # noqa: F401  (its max/min rules, wrapped below)
from kiln.capture import iterators
from kiln.capture import values as V
from kiln.capture.rule_tables import BUILTINS
from kiln.capture.cond import _may_alias_input
from kiln.capture.errors import Unsupported

_generic = {max: BUILTINS[max], min: BUILTINS[min]}


def _same_kind(items) -> bool:
    first = items[0].fake
    return all(isinstance(x, V.TensorValue) and x.fake.dtype == first.dtype
               and x.fake.shape == first.shape and x.fake.device == first.device
               and x.fake.requires_grad == first.requires_grad for x in items) and first.numel() == 1


def _tensor_minmax(which):
    compare = operator.gt if which is max else operator.lt

    def rule(tx, *args, key=None, default=None):
        if key is not None or not args:
            return _generic[which](tx, *args, key=key, default=default)
        items = list(iterators.iterate(tx, args[0])) if len(args) == 1 else list(args)
        if not items or not any(isinstance(i, V.TensorValue) for i in items):
            # the iterable is consumed: the generic rule gets its items
            rest = (V.IteratorValue(items),) if len(args) == 1 else args
            return _generic[which](tx, *rest, key=key, default=default)
        if not _same_kind(items):
            raise Unsupported("K0006", f"{which.__name__}() over tensors of different kinds, or against numbers "
                              "(the result's type depends on their values)")
        if any(_may_alias_input(x.node) for x in items):
            raise Unsupported("K0006", f"{which.__name__}() over tensors returns one of the inputs "
                                       "(or a view of one) itself")
        best = items[0]
        for x in items[1:]:
            cond = tx.output.op("call_function", compare, [x, best], {})
            best = tx.output.op("call_function", torch.where, [cond, x, best], {})
        root = tx
        while root.parent is not None:
            root = root.parent
        stand_ins = tx.output.__dict__.setdefault("minmax_nodes", {})
        for x in items + [best]:
            for n in _view_chain(x.node):
                stand_ins.setdefault(n, root.inst.index)  # where the compiled frame called it
        return best

    return rule


BUILTINS[max] = _tensor_minmax(max)
BUILTINS[min] = _tensor_minmax(min)


def _view_chain(node):
    """``node`` and the nodes it views, down to the first that is not a view."""
    from kiln.capture.cond import _VIEW_NAMES

    out = [node]
    while node.args and hasattr(node.args[0], "op") and _target_name(node) in _VIEW_NAMES:
        node = node.args[0]
        out.append(node)
    return out


def _target_name(node):
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _is_write(target, kwargs) -> bool:
    name = target if isinstance(target, str) else getattr(target, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") \
        or name.startswith("__i") or "out" in kwargs


def _touched(out, v):
    """The compiled frame's instruction that made the stand-in ``v`` reaches, or None."""
    stand_ins = out.__dict__.get("minmax_nodes")
    if not stand_ins or not isinstance(v, V.TensorValue):
        return None
    found = [stand_ins[n] for n in _view_chain(v.node) if n in stand_ins]
    return min(found) if found else None


def _break_at_the_call(ip, msg):
    """Unsupported, and a trace that may break restarts with a break at the max()/min()
    call itself (a break here would hand the rest the stand-in)."""
    e = Unsupported("K0006", msg)
    e.restart_ip = ip
    return e


@V.rule
def check_write(out, target, args, kwargs):
    """Called before ``out`` records an op: an in-place write into a ``max``/``min``
    stand-in (or what it stands for) would show that it is not eager's object."""
    if not args or not _is_write(target, kwargs):
        return
    written = [args[0]] + ([kwargs["out"]] if "out" in kwargs else [])
    ips = [ip for ip in (_touched(out, w) for w in written) if ip is not None]
    if ips:
        raise _break_at_the_call(min(ips), "an in-place write into the result of max()/min() over tensors, "
                                           "or into one of its operands (eager's result is one of them)")


@V.rule
def check_identity(tx, a, b):
    """``a is b`` on a ``max``/``min`` result or operand is the data's answer."""
    ips = [ip for ip in (_touched(tx.output, a), _touched(tx.output, b)) if ip is not None]
    if ips:
        raise _break_at_the_call(min(ips), "`is` on the result of max()/min() over tensors (eager's is "
                                           "one of the operands)")


def _written_in_place(node) -> bool:
    for u in node.users:
        name = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
        if (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") \
                or name.startswith("__i"):
            return True
    return False


@V.rule
def index_value(tx, tv):
    """The Python int a 0-d integer tensor ``tv`` indexes a sequence with (its
    ``__index__``), read from the real input and guarded; Unsupported otherwise."""
    fake = tv.fake
    if fake.dim() != 0 or fake.dtype.is_floating_point or fake.dtype.is_complex:
        raise Unsupported("K0007", "indexing a Python sequence with a tensor that is not a 0-d integer")
    real = tx.output.real_input(tv)
    if real is None or tv.source is None or _written_in_place(tv.node):
        raise Unsupported("K0007", "indexing a Python sequence with a tensor computed in the graph (its value is data)")
    value = operator.index(real)
    e = tv.source.expr()
    tx.output.guards.expression(f"{e}.item() == {value!r}", f"{tv.source.pretty()} holds {value!r}")
    return V.ConstantValue(value)
