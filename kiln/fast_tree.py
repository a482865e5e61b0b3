"""pytree's ``tree_map`` and ``tree_leaves`` for the plain tuples, lists and dicts that op
arguments are made of, without pytree's per-leaf type dispatch.

The autograd trace maps every op's arguments several times (to meta tensors, to graph
nodes, for devices) and the lowering maps every node's: in a 148-parameter AdamW graph
pytree's per-leaf ``tree_is_leaf``/namedtuple checks were a third of the trace. Exact
``tuple``/``list``/``dict`` are walked here, and FX's ``immutable_list``/``immutable_dict``
(a node's ``args``/``kwargs``, rebuilt as pytree rebuilds them); any other container
pytree knows (a namedtuple or return structseq, ``torch.Size``, an ``OrderedDict``, a
class registered with pytree such as a model output) goes to pytree itself, so the
results are pytree's.
"""
from __future__ import annotations

import torch.utils._pytree as pytree
from torch.fx.immutable_collections import immutable_dict, immutable_list


def _is_node(x) -> bool:
    """A container pytree would open (beyond exact tuple/list/dict, handled here)."""
    return isinstance(x, (tuple, list, dict)) or type(x) in pytree.SUPPORTED_NODES


def tree_map(fn, x):
    """``pytree.tree_map(fn, x)``."""
    t = type(x)
    if t is tuple:
        return tuple([tree_map(fn, a) for a in x])
    if t is list:
        return [tree_map(fn, a) for a in x]
    if t is dict:
        return {k: tree_map(fn, v) for k, v in x.items()}
    if t is immutable_list:
        return immutable_list([tree_map(fn, a) for a in x])
    if t is immutable_dict:
        return immutable_dict({k: tree_map(fn, v) for k, v in x.items()})
    if _is_node(x):
        return pytree.tree_map(fn, x)
    return fn(x)


def leaves(x) -> list:
    """``pytree.tree_leaves(x)``."""
    out: list = []
    _collect(x, out)
    return out


def _collect(x, out: list) -> None:
    t = type(x)
    if t is tuple or t is list or t is immutable_list:
        for a in x:
            _collect(a, out)
    elif t is dict or t is immutable_dict:
        for a in x.values():
            _collect(a, out)
    elif _is_node(x):
        out.extend(pytree.tree_leaves(x))
    else:
        out.append(x)
