"""Python lists in tensor indexing (``x[[0, 2]]``, ``x[[0, 1], 1] = v``), made traceable.

Eager turns a list index into an index tensor inside its C++ indexing code, below the
dispatcher's Python key: on the trace's meta tensors that tensor is a meta tensor the
tracer never saw (and whose values are lost). So before the indexing runs, the list is
turned into the tensor eager would make (``index_tensor``), through the trace mode: a
graph constant, on the indexed tensor's device.

Eager's rules (``python_variable_indexing.cpp``): a list of fewer than 32 items of which
one is a tensor, a sequence, a slice, ``...`` or None is read as a tuple (NumPy's old
heuristic); any other list, and each list inside a tuple, becomes a tensor of bool
(all items bool: a mask) or int64 (anything else, floats truncated).
"""
from __future__ import annotations

import operator

import torch

#: callables whose second argument is an index
INDEXING = frozenset({operator.getitem, operator.setitem, torch.Tensor.__getitem__,
                      torch.Tensor.__setitem__})


def _read_as_tuple(seq: list) -> bool:
    if len(seq) >= 32:
        return False
    return any(isinstance(e, (torch.Tensor, list, tuple, slice)) or e is Ellipsis
               or e is None for e in seq)


def _scalars(seq) -> list | None:
    """The flat items of a (nested) list of Python scalars, or None."""
    out = []
    for e in seq:
        if isinstance(e, (list, tuple)):
            inner = _scalars(e)
            if inner is None:
                return None
            out += inner
        elif isinstance(e, (bool, int, float)):
            out.append(e)
        else:
            return None
    return out


def _is_mask(seq: list) -> bool:
    items = _scalars(seq)
    return bool(items) and all(isinstance(e, bool) for e in items)


def _tensor(seq: list, device):
    if _scalars(seq) is None or _is_mask(seq):
        return seq                   # tensors inside (eager reads their values), a mask
    t = torch.tensor(seq, dtype=torch.int64)
    if device is None or device.type == "cpu":
        return t
    return torch.ops.aten._to_copy.default(t, device=device)    # no CUDA set-up here


def index_tensors(index, device):
    """``index`` with every list eager turns into a tensor turned into one (made under
    the trace mode, which records it); ``device``: the indexed tensor's real device.
    A list of bools (a mask, which selects data-dependently) stays a list, which the
    trace cannot express (the graph then runs eagerly)."""
    if isinstance(index, list):
        if not _read_as_tuple(index):
            return _tensor(index, device)
        index = tuple(index)
    if isinstance(index, tuple) and any(isinstance(e, list) for e in index):
        return tuple(_tensor(e, device) if isinstance(e, list) else e for e in index)
    return index
