"""A compiled graph's outputs share memory exactly where eager's do, and keep eager's
strides where those are free.

Lowerings express some ops eager computes into fresh memory as views: ``repeat`` of a
size-1 dim is a stride-0 ``expand`` of its input, ``clone`` of an already stored value
may be that value itself. Inside a graph that is free; at its outputs it is not: an
output that is a view of a graph input would let a later write to it change the
caller's tensor, and two outputs sharing a buffer would change each other.

Eager's sharing is read off the aten graph: a node whose op returns a view of its first
argument (``Tensor(a)`` in its schema) shares that argument's memory, any other op's
result is new. kiln's sharing is the buffer an output's ``View`` reads, followed through
library calls that return views. An output kiln shares where eager does not is copied
into a buffer of its own, in eager's strides where they are dense.

Strides of size-1 dims address nothing; an output's are set to eager's (``(4,) @ (1,
4, 5)`` is ``(5, 1)`` in eager, not the ``(0, 1)`` a squeeze gives). An output eager
returns broadcast (stride 0) is stored once and returned broadcast too, so that writing
into it fails as in eager.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from . import ir
from .lowering import Lazy, View, _dense, _returns_a_view


def eager_root(node):
    """The node whose memory eager's value of ``node`` lives in."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is operator.getitem:
            src = node.args[0]
            if not (isinstance(src, fx.Node) and _returns_a_view(src.target)):
                return node
            node = src
        elif _returns_a_view(node.target) and node.args and isinstance(node.args[0], fx.Node):
            node = node.args[0]
        else:
            return node
    return node


def kiln_root(by_name: dict, buf: str) -> str:
    """The buffer whose memory kiln's buffer ``buf`` lives in (a library call returning
    a view of its argument lives in the argument's)."""
    seen = set()
    while buf not in seen:
        seen.add(buf)
        b = by_name.get(buf)
        if isinstance(b, ir.MultiOutput):
            b = by_name.get(b.source)
        if not isinstance(b, ir.Extern) or not _returns_a_view(b.op):
            return buf
        arg = next((a for a in _extern_args(b.args) if isinstance(a, ir.ExternArg)), None)
        if arg is None:
            return buf
        buf = arg.buf
    return buf


def _extern_args(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _extern_args(a)
        else:
            yield a


def _free_strides(sizes, strides, want) -> tuple:
    """``strides`` with those of size-1 dims set to ``want``'s."""
    return tuple(w if int(s) == 1 else st for s, st, w in zip(sizes, strides, want))


def store_output(lo, lazy, m):
    """An output computed by kiln stored in eager's strides ``m.stride()``: as they are
    when dense; where eager's result is broadcast (stride 0, ``zeros(1).expand(3)``),
    stored once along those dims and returned as the same stride-0 view; else
    contiguous."""
    if m is None or m.numel() <= 1 or len(m.shape) != len(lazy.sizes):
        return lo.realize(lazy, origin="output")
    if _dense(m):
        return lo.realize(lazy, strides=tuple(m.stride()), origin="output")
    spread = [int(s) > 1 and st == 0 for s, st in zip(m.shape, m.stride())]
    if not any(spread):
        return lo.realize(lazy, origin="output")
    sizes = tuple(1 if b else s for s, b in zip(lazy.sizes, spread))
    stored = lo.realize(Lazy(sizes, lazy.dtype, lazy.load), origin="output")
    strides = tuple(0 if b else st for st, b in zip(stored.strides, spread))
    return View(stored.buf, tuple(lazy.sizes), strides, stored.offset, stored.dtype)


def settle_outputs(lo, out_nodes, boxes) -> list:
    """``boxes`` (the graph's flat outputs, each the value of ``out_nodes[k]``) with any
    output kiln shares memory with that eager does not share copied to a buffer of its
    own; size-1 dims' strides as eager's."""
    result = list(boxes)
    claimed: dict[str, object] = {}          # kiln root -> eager root of its first user
    for k, (node, box) in enumerate(zip(out_nodes, boxes)):
        if not isinstance(box, View) or not isinstance(node, fx.Node):
            continue
        m = lo.meta.get(node)
        e_root = eager_root(node)
        k_root = kiln_root(lo.by_name, box.buf)
        is_input = isinstance(lo.by_name.get(k_root), ir.Input)
        eager_input = isinstance(e_root, fx.Node) and e_root.op == "placeholder"
        owner = claimed.setdefault(k_root, e_root)
        if (is_input and not eager_input) or owner is not e_root:
            box = store_output(lo, Lazy(box.sizes, box.dtype, box.load),
                               m if isinstance(m, torch.Tensor) else None)
        elif isinstance(m, torch.Tensor) and len(m.stride()) == len(box.strides):
            box = View(box.buf, box.sizes,
                           _free_strides(box.sizes, box.strides, m.stride()),
                           box.offset, box.dtype)
        result[k] = box
    return result
