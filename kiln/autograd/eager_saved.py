"""Which tensors eager's autograd saves for the backward: the ones whose later in-place
writes make eager's backward fail.

Eager's backward checks the version of every tensor it saved: write one in place after
the forward (``x.add_(1)`` after ``y = x.sin()``, which saves ``x``; not after ``y =
x.exp()``, which saves ``y``) and the backward through it raises "modified by an
inplace operation". A
compiled graph saves what its partitioner chose, which may be an input eager never
saved (the partitioner recomputes ``x * 2`` from ``x`` rather than keep it): a later
write to ``x``, fine in eager, would fail the compiled backward. So the trace asks,
before differentiating, which storages eager's own autograd graph saves a tensor of
(``saved_storages``); a value the compiled backward would keep of a storage the user
can write after the call (an input's, an output's) that eager does not save is saved
as a copy (``partition``'s ``copied``), and the partitioner avoids keeping those.
"""
from __future__ import annotations

import torch

_names: dict[type, tuple] = {}


def _saved_names(node_type: type) -> tuple:
    """The attributes a node of this type exposes its saved tensors under."""
    names = _names.get(node_type)
    if names is None:
        names = _names[node_type] = tuple(
            a for a in dir(node_type)
            if a.startswith("_saved_") or a == "saved_tensors")
    return names


def storage_of(t: torch.Tensor) -> int:
    """The identity of ``t``'s storage (shared by its views), as ``saved_storages``
    gives them."""
    return t.untyped_storage()._cdata


def saved_storages(roots) -> set[int]:
    """The storages of the tensors eager's autograd saved for the backward of
    ``roots`` (tensors), walking their autograd graph."""
    found: set[int] = set()
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for name in _saved_names(type(node)):
            try:
                value = getattr(node, name)
            except RuntimeError:      # modified in place already: the backward says so
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, torch.Tensor):
                    found.add(storage_of(v))
        for nxt, _ in node.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return found
