"""``kiln.wrap_numpy``: NumPy code called with tensors (the decorator PyTorch's FAQ
describes, written here).

Run eagerly, the wrapper converts tensor arguments with ``Tensor.numpy()`` and ndarray
results with ``torch.as_tensor`` (CPU tensors without grad only, as NumPy needs). Traced
by kiln, the conversions change only the values' kind (``to_numpy`` / ``to_tensor``
below): the tensors flow through the NumPy code as ndarrays, so that code runs on the
arguments' device and autograd sees its ops. A NumPy scalar result stays one, as
eager gives it, except where eager could not have run (a result on another device or
requiring grad: a 0-d tensor, so that ``backward`` works as the FAQ shows).
"""
from __future__ import annotations

import functools

import torch
from torch.utils import _pytree as pytree

from kiln.capture import values as V
from kiln.capture.errors import Unsupported


def to_numpy(tree):
    return pytree.tree_map_only(torch.Tensor, lambda t: t.numpy(), tree)


def to_tensor(tree):
    import numpy as np

    return pytree.tree_map_only(np.ndarray, torch.as_tensor, tree)


def wrap_numpy(fn):
    """Decorate a function written with NumPy so that it takes and returns tensors."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args, kwargs = to_numpy((args, kwargs))
        return to_tensor(fn(*args, **kwargs))
    return wrapper


def _map(v, leaf):
    if isinstance(v, V.NamedTupleValue):
        return V.NamedTupleValue(v.cls, [_map(i, leaf) for i in v.items])
    if isinstance(v, V.TupleValue):
        return V.TupleValue([_map(i, leaf) for i in v.items])
    if isinstance(v, V.ListValue):
        return V.ListValue([_map(i, leaf) for i in v.items])
    if isinstance(v, V.DictValue):
        if v.cls is not dict:
            raise Unsupported("K0301", "wrap_numpy over a dict subclass")
        return V.DictValue({k: _map(i, leaf) for k, i in v.items.items()})
    return leaf(v)


def _tensor_to_array(v):
    from kiln.capture.numpy_values import from_tensor

    return from_tensor(v) if isinstance(v, V.TensorValue) else v


def _array_to_tensor(v):
    from kiln.capture.numpy_values import NdarrayValue

    if isinstance(v, NdarrayValue):
        f = v.tensor.fake
        if not v.scalar or f.requires_grad or f.device.type != "cpu":
            return v.tensor
    return v


class _Convert(V.Value):
    def __init__(self, fn, leaf):
        self.fn = fn
        self.leaf = leaf

    def call(self, tx, args, kwargs):
        if len(args) != 1 or kwargs:
            raise Unsupported("K0301", "wrap_numpy's conversion with other arguments")
        return _map(args[0], self.leaf)


@V.rule(name="wrap_numpy_special_value")
def special_value(obj):
    """The trace's Value for the wrapper's conversions, or None."""
    if obj is to_numpy:
        return _Convert(obj, _tensor_to_array)
    if obj is to_tensor:
        return _Convert(obj, _array_to_tensor)
    return None
