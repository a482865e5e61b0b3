"""``aot_eager``'s graph compiler: call each aten op the way eager PyTorch does.

An FX graph of ``torch.ops.aten.<op>.<overload>`` calls runs every op through the
``OpOverload`` path, which converts the Python arguments to a boxed stack by the
schema: for a small convolution it costs about three times eager's ``torch.conv2d``
binding (70 us against 24 on one CPU core), and on a GPU, where per-op CPU cost is
what bounds a ResNet's inference, that doubles the time of a whole graph.

``eager_calls(gm, example_inputs)`` returns a copy of the graph in which each op node
calls the op's public binding instead (``torch.<op>``, ``torch._C._nn.<op>`` or the
tensor method ``x.<op>(...)``), the C++ argument parser eager code goes through. A
binding is used only when, called on the node's meta example values, it reaches the
very same overload and nothing else (checked under a dispatch mode); otherwise the
node keeps its ``OpOverload``. The aten graph itself is left untouched.

A rewritten call spells out, by name, every argument the node leaves to its default,
with the schema's default, and the binding must hand the op the same arguments as the
node: a binding's own defaults can differ from the schema's
(``torch._C._nn.mse_loss(x, y)`` reduces with "none", ``aten.mse_loss(x, y)`` with
"mean").
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.fx.node import _get_qualified_name
from torch.utils._pytree import tree_map
from ..dispatch_mode import KilnDispatchMode

_VARIABLE_FUNCTIONS = torch._C._VariableFunctions
_NN = torch._C._nn


class _Seen(KilnDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append((func, _comparable((args, kwargs or {}))))
        return func(*args, **(kwargs or {}))


def _comparable(tree):
    """Arguments as a value equal for equal calls (tensors by identity)."""
    return tree_map(lambda a: ("tensor", id(a)) if isinstance(a, torch.Tensor) else a, tree)


def _dispatched(call, args, kwargs):
    seen = _Seen()
    with seen:
        call(*args, **kwargs)
    return seen.ops


def _reaches(call, op, args, kwargs) -> bool:
    """Does ``call(*args, **kwargs)`` on meta values dispatch exactly ``op``, once, with
    the arguments ``op(*args, **kwargs)`` gets?"""
    try:
        seen = _dispatched(call, args, kwargs)
        return [f for f, _ in seen] == [op] and seen == _dispatched(op, args, kwargs)
    except Exception:
        return False


def _meta(node_or_value):
    def val(a):
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            if v is None:
                raise LookupError(a.name)
            return v
        return a
    return tree_map(val, node_or_value)


def _nameable(fn) -> bool:
    """Can FX's generated code name ``fn``? Not the dunders of ``_VariableFunctions``
    (``__lshift__``: no module) nor ``unique_dim``; the tensor method is used then."""
    try:
        _get_qualified_name(fn)
    except RuntimeError:
        return False
    return True


def _candidates(op):
    name = op._schema.name.split("::")[-1]
    for ns in (_VARIABLE_FUNCTIONS, _NN):
        fn = getattr(ns, name, None)
        if fn is not None and _nameable(fn):
            yield "call_function", fn
    if hasattr(torch.Tensor, name):
        yield "call_method", name


def _with_defaults(op, args, kwargs):
    """``args`` and ``kwargs`` with every argument the call leaves out set to the
    schema's default (None where the schema gives none: the argument is then required,
    and the call is left as it is)."""
    args, kwargs = list(args), dict(kwargs)
    for i, a in enumerate(op._schema.arguments):
        if i < len(args) or a.name in kwargs:
            continue
        if not a.has_default_value():
            return None
        kwargs[a.name] = a.default_value     # by name: bindings order some differently
    return tuple(args), kwargs


def _rewrite(node: fx.Node) -> None:
    op = node.target
    if op.namespace != "aten" or "device" in node.kwargs:
        return
    full = _with_defaults(op, node.args, node.kwargs)
    if full is None:
        return
    try:
        args, kwargs = _meta(full)
    except LookupError:
        return
    for kind, target in _candidates(op):
        if kind == "call_function":
            ok = _reaches(target, op, args, kwargs)
        else:
            if not args or not isinstance(args[0], torch.Tensor):
                continue
            ok = _reaches(lambda s, *a, **k: getattr(s, target)(*a, **k), op, args, kwargs)
        if ok:
            node.op, node.target = kind, target
            node.args, node.kwargs = full
            return


def eager_calls(gm: fx.GraphModule, example_inputs=None) -> fx.GraphModule:
    """A copy of ``gm`` calling ops through eager's bindings where that is the same op."""
    graph = fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    for n in graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            _rewrite(n)
    return fx.GraphModule(gm, graph, class_name=type(gm).__name__)
