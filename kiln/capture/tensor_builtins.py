"""Python builtins applied to tensors where eager's answer can be computed in the graph
exactly, or read (and guarded) from an input:

* ``max(a, b, ...)`` / ``min`` of one-element tensors: CPython keeps the first item
  and replaces it when ``item > best`` (``<`` for min) is true, so the result is
  ``torch.where(x > best, x, best)`` item by item — NaN and ties pick what eager picks.
  Only for tensors of one dtype, shape and ``requires_grad`` (``where`` would promote,
  broadcast or attach a gradient eager's chosen tensor lacks), none of them a graph
  input (eager returns that very object, the graph a new one). Anything else — a
  tensor against a number, whose result type depends on the data — stays a break.
* ``seq[i]`` with ``i`` a 0-d integer tensor read from an input: its value is read at
  trace time and guarded (a new value recompiles).
"""
from __future__ import annotations

import operator

import torch

from kiln.capture import iterators
from kiln.capture import values as V
from kiln.capture.builtins import BUILTINS
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
        if any(x.node.op == "placeholder" for x in items):
            raise Unsupported("K0006", f"{which.__name__}() over tensors returns one of the inputs themselves")
        best = items[0]
        for x in items[1:]:
            cond = tx.output.op("call_function", compare, [x, best], {})
            best = tx.output.op("call_function", torch.where, [cond, x, best], {})
        return best

    return rule


BUILTINS[max] = _tensor_minmax(max)
BUILTINS[min] = _tensor_minmax(min)


def _written_in_place(node) -> bool:
    for u in node.users:
        name = u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")
        if (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") \
                or name.startswith("__i"):
            return True
    return False


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
