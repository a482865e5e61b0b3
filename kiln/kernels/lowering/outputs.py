"""A compiled graph's outputs: eager's memory layout, and memory shared exactly where
eager's is.

Layout. Eager's result of a pointwise or reduction op follows its inputs' memory order
(``x.t() + 1`` is not contiguous), and an output that is a view of an intermediate
(``(x + 1)[:, 2]``, ``y.t()``) is a view of that intermediate's memory, with its
strides and storage offset. Both are observable (``is_contiguous()``, ``.view()``,
``stride()``), so the value an output views (its *root*, ``eager_root``) is stored once
in eager's strides when it is lowered (``own_eager_layout``: free for a value computed
anyway, no copy added) and the output is the view of that buffer at eager's geometry.
Outputs marked internal (a training forward's saved activations,
``INTERNAL_OUTPUTS``) keep kiln's layout: nobody sees them but the backward.

Sharing. Lowerings express some ops eager computes into fresh memory as views:
``repeat`` of a size-1 dim is a stride-0 ``expand`` of its input, ``clone`` of an
already stored value may be that value itself. Inside a graph that is free; at its
outputs it is not: an output that is a view of a graph input would let a later write to
it change the caller's tensor, and two outputs sharing a buffer would change each other.
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
from torch.utils import _pytree as pytree

from .. import ir
from .base import Lazy, View, is_dense, returns_a_view, is_box
from .engine import SUPPORTED_DTYPES

#: ``output_node.meta[INTERNAL_OUTPUTS] = k``: the graph's flat outputs from position k
#: on are internal (saved for a backward), free to keep kiln's layout.
INTERNAL_OUTPUTS = "kiln_internal_outputs_from"


def eager_root(node):
    """The node whose memory eager's value of ``node`` lives in."""
    while isinstance(node, fx.Node) and node.op == "call_function":
        if node.target is operator.getitem:
            src = node.args[0]
            if not (isinstance(src, fx.Node) and returns_a_view(src.target)):
                return node
            node = src
        elif returns_a_view(node.target) and node.args and isinstance(node.args[0], fx.Node):
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
        if not isinstance(b, ir.Extern) or not returns_a_view(b.op):
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


# --- eager's layout ----------------------------------------------------------------------
def user_outputs(gm: fx.GraphModule) -> list:
    """The output leaves the caller sees (internal ones, ``INTERNAL_OUTPUTS``, left out)."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    leaves = pytree.tree_leaves(out.args[0])
    return leaves[:out.meta.get(INTERNAL_OUTPUTS, len(leaves))]


def output_roots(gm: fx.GraphModule) -> set:
    """Nodes whose memory a user-visible output is (or views): stored in eager's layout."""
    return {r for r in map(eager_root, user_outputs(gm))
            if isinstance(r, fx.Node) and r.op == "call_function"}


def owns_its_storage(m) -> bool:
    """Eager's tensor ``m`` is its whole storage, element for element (a fresh result):
    a view of it at any geometry eager gives reads only elements it holds."""
    if not isinstance(m, torch.Tensor) or m.storage_offset() != 0 or m.numel() == 0:
        return False
    return is_dense(m) and m.untyped_storage().nbytes() == m.numel() * m.element_size()


def _same_strides(sizes, a, b) -> bool:
    """Equal strides but on size-1 dims (which address nothing)."""
    return len(a) == len(b) and all(int(s) == 1 or int(x) == int(y)
                                    for s, x, y in zip(sizes, a, b))


def own_eager_layout(lo, node, box):
    """``box``, the value of an output root ``node``, as a buffer of its own in eager's
    strides: the buffer it already is when that fits (not a graph input, not memory
    another root holds), else stored so (a lazy value is stored anyway at an output; a
    stored one in another layout is copied). Recorded in ``lo.root_views``."""
    m = lo.meta.get(node)
    if not is_box(box) or not owns_its_storage(m) or tuple(box.sizes) != tuple(m.shape):
        return box
    strides = tuple(m.stride())
    if isinstance(box, View) and box.offset == 0 and \
            _same_strides(box.sizes, box.strides, strides) and _free_buffer(lo, box.buf):
        v = box
    else:
        lazy = box if isinstance(box, Lazy) else Lazy(box.sizes, box.dtype, box.load)
        v = lo.realize(Lazy(lazy.sizes, lazy.dtype, lazy.fn), strides=strides,
                       origin=f"{node.name} (output)")
    lo.root_views[node] = v
    lo.rooted[v.buf] = node
    return v


def _free_buffer(lo, buf) -> bool:
    b = lo.by_name.get(buf)
    return (b is not None and not isinstance(b, ir.Input) and buf not in lo.rooted
            and kiln_root(lo.by_name, buf) == buf and buf not in lo.relaid)


def view_of_root(lo, node):
    """Output ``node`` as eager has it: a view at its own strides and storage offset of
    its root's buffer (stored by ``own_eager_layout``), or None."""
    root = eager_root(node)
    rv = lo.root_views.get(root)
    m, rm = lo.meta.get(node), lo.meta.get(root)
    if rv is None or root is node or not isinstance(m, torch.Tensor) or m.dtype != rm.dtype:
        return None
    if m.untyped_storage()._cdata != rm.untyped_storage()._cdata:
        return None
    return View(rv.buf, tuple(m.shape), tuple(m.stride()), m.storage_offset(), m.dtype)


# --- the output node ---------------------------------------------------------------------
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
    if is_dense(m):
        return lo.realize(lazy, strides=tuple(m.stride()), origin="output")
    spread = [int(s) > 1 and st == 0 for s, st in zip(m.shape, m.stride())]
    if not any(spread):
        return lo.realize(lazy, origin="output")
    sizes = tuple(1 if b else s for s, b in zip(lazy.sizes, spread))
    stored = lo.realize(Lazy(sizes, lazy.dtype, lazy.load), origin="output")
    strides = tuple(0 if b else st for st, b in zip(stored.strides, spread))
    return View(stored.buf, tuple(lazy.sizes), strides, stored.offset, stored.dtype)


def _in_eager_layout(lo, node, box):
    """One output's box before the sharing check: a view of its root's buffer where eager
    has one; a lazy value stored; a value kiln laid out its own way (channels-last)
    stored again in eager's dense strides."""
    m = lo.meta.get(node) if isinstance(node, fx.Node) else None
    m = m if isinstance(m, torch.Tensor) else None
    if node in lo.visible_outputs:
        v = view_of_root(lo, node)
        if v is not None:
            return v
    if isinstance(box, Lazy):
        return store_output(lo, box, m)
    if isinstance(box, View) and box.buf in lo.relaid and m is not None and is_dense(m) \
            and tuple(m.stride()) != tuple(box.strides):
        if box.dtype not in SUPPORTED_DTYPES[lo.target]:
            return _library_copy(lo, box, m)
        return lo.realize(Lazy(box.sizes, box.dtype, box.load), strides=tuple(m.stride()),
                          origin="output")
    return box


def _library_copy(lo, box, m):
    """``box`` copied into eager's dense strides ``m.stride()`` by PyTorch's ``clone``,
    for a dtype the target's kernels cannot store (bf16 on the C++ path): the view read
    in eager's memory order, cloned contiguous, seen back in the original dim order."""
    order = sorted(range(len(m.shape)), key=lambda d: (-m.stride()[d], d))
    sizes = tuple(box.sizes[d] for d in order)
    arg = ir.ExternArg(box.buf, sizes, tuple(box.strides[d] for d in order), box.offset)
    dense = ir.contiguous_strides(sizes)
    name = lo.new_name()
    lo.add(ir.Extern(name, sizes, dense, box.dtype, op=torch.ops.aten.clone.default, args=(arg,),
                     kwargs={"memory_format": torch.contiguous_format}, origin="output"))
    inverse = [order.index(d) for d in range(len(order))]
    return View(name, tuple(box.sizes), tuple(dense[i] for i in inverse), 0, box.dtype)


def lower_outputs(lo, out_node):
    """The output node's pytree of boxes, each as eager returns it."""
    nodes = []                  # per flat box: the node it is the whole value of, or None
    for a in pytree.tree_leaves(out_node.args[0]):
        v = lo.env[a] if isinstance(a, fx.Node) else a
        n = len(pytree.tree_leaves(v, is_leaf=is_box))
        nodes.extend([a] if n == 1 and is_box(v) else [None] * n)
    flat, spec = pytree.tree_flatten(
        pytree.tree_map(lambda a: lo.env[a] if isinstance(a, fx.Node) else a, out_node.args[0]),
        is_leaf=is_box)
    flat = [_in_eager_layout(lo, n, b) if is_box(b) else b for n, b in zip(nodes, flat)]
    return pytree.tree_unflatten(settle_outputs(lo, nodes, flat), spec)


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
