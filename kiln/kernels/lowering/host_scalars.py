"""One-element CPU tensors read by a GPU graph's kernels.

Eager lets a 0-d CPU tensor join a CUDA op and passes its value as a launch argument:
an optimizer's step counters stay on the CPU (eager's layout, which kiln keeps), so
Adam's bias corrections and a tensor ``lr`` are such values, and every parameter's
update reads them. kiln's kernels take only device pointers, so an op's host values are
gathered per dtype into one pinned buffer and copied to the device (``HostScalars``: one
asynchronous copy, in stream order, no wait for the GPU) and read from there, instead of
the whole op falling back to aten. A graph replayed from a recorded CUDA graph makes
these copies outside it, every call (``runtime/host_prologue.py``).

One CPU tensor of more elements joins a device op: the ``scalars`` of
``_foreach_addcdiv/addcmul.Tensor`` (a non-capturable Adam's step sizes, stacked from
its 0-d bias corrections), a value per tensor, which eager reads on the host. It is
copied whole (``scalar_elements``), and element ``i`` reads the copy's value ``i``.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from .. import ir
from .base import Unsupported, View, is_box

aten = torch.ops.aten

#: the most elements of one CPU tensor a device graph reads through a host copy (a
#: value per parameter: a model's parameter count is far below it)
HOST_VALUES_MAX = 65536
#: device ops whose last argument, ``scalars``, is a CPU tensor of a value per element
TENSOR_SCALARS = {getattr(aten, n).Tensor for n in ("_foreach_addcdiv", "_foreach_addcmul")
                  if hasattr(aten, n) and "Tensor" in getattr(aten, n).overloads()}


class HostScalars:
    """The library call: CPU tensors -> one device tensor of their values, flattened."""

    #: replayed only through ``runtime/host_prologue``, which makes the copy outside the
    #: recorded graph every call (a copy recorded in it would copy the recording
    #: call's values again)
    replayable = True
    #: reads only its arguments (host values) and writes nothing: the scheduler moves it
    #: up to them (``scheduler.hoist_scalars``), before the kernels that do not read it
    hoistable = True

    def __init__(self, device):
        self.device = str(device)

    def __call__(self, *values):
        flat = torch.cat([v.reshape(-1) for v in values])
        if self.device.startswith("cuda"):
            flat = flat.pin_memory()
        return flat.to(self.device, non_blocking=True)

    def __repr__(self):
        return f"host_scalars[{self.device}]"


def takes_host_values(lo, gm) -> bool:
    """Whether a graph on an accelerator does host work every call: takes CPU tensors
    (an optimizer's step counters, a tensor lr) or returns some (the counters a first
    step makes from constants and bumps). Only such a graph reads host values through
    copies, which a replayed graph makes in its host prologue, every call. Elsewhere a
    CPU value is a constant, which a recorded graph may keep, and its ops stay with
    aten."""
    if lo.device.type == "cpu":
        return False
    ends = [n for n in gm.graph.nodes if n.op == "placeholder"] + \
        [a for n in gm.graph.nodes if n.op == "output"
         for a in pytree.tree_leaves(n.args) if isinstance(a, fx.Node)]
    return any(d is not None and d.type == "cpu"
               for n in ends for d in pytree.tree_leaves(lo.meta.get((n, "device"))))


def is_host_scalar(lo, device, value, node=None, arg=None) -> bool:
    """A value a kernel of ``lo``'s graph may read although it lives on the CPU: one
    element, or ``node``'s ``scalars`` argument ``arg`` (``TENSOR_SCALARS``)."""
    if not (lo.host_values and isinstance(device, torch.device) and device.type == "cpu"
            and isinstance(value, torch.Tensor)):
        return False
    return value.numel() == 1 or (
        node is not None and node.target in TENSOR_SCALARS and arg is node.args[-1]
        and value.numel() <= HOST_VALUES_MAX)


class Stacked:
    """What a ``stacked_elements`` node lowers to: its elements' boxes, never stored."""

    def __init__(self, elements):
        self.elements = tuple(elements)


def lower_stacked(lo, node):
    """``node``'s value if it is a stack ``device_side`` computes on the device (a
    ``Stacked``), else None (the node is lowered as usual)."""
    if node not in lo.device_side:
        return None
    elements = stacked_elements(lo, node)
    return None if elements is None else Stacked(lo.env[a] for a in elements)


def scalar_elements(lo, node, box, n) -> list:
    """The ``n`` values of ``node``'s ``scalars`` (a 1-D tensor, ``box``) as 0-d views,
    one per element of its lists: of its buffer, or, for a CPU tensor in a graph on a
    device, of its copy there (one ``HostScalars`` of the whole tensor)."""
    arg = node.args[-1]
    m = lo.meta.get(arg)
    if not isinstance(m, torch.Tensor) or m.dim() != 1 or m.numel() != n:
        raise Unsupported("K0205", "foreach scalars not a 1-D tensor of a value per element")
    if isinstance(box, Stacked):             # values on the device: the stack's elements
        return list(box.elements)
    if not m.dtype.is_floating_point:
        raise Unsupported("K0205", "foreach scalars of an integer dtype")
    v = lo.realize(box, origin=node.name)
    devices = [d for d in pytree.tree_leaves(lo.meta.get((arg, "device"))) if d is not None]
    host = lo.device.type != "cpu" and arg not in lo.host_copies and \
        any(d.type == "cpu" for d in devices)
    if host:
        if not is_host_scalar(lo, devices[0], m, node, arg):
            raise Unsupported("K0205", "foreach scalars on the CPU, read by a device op")
        name = lo.new_name()
        lo.add(ir.Extern(name, (n,), (1,), m.dtype, op=HostScalars(lo.device),
                         args=(ir.ExternArg(v.buf, v.sizes, v.strides, v.offset),),
                         origin=node.name))
        lo.host_copies[arg] = View(name, (n,), (1,), 0, m.dtype)   # (its other readers')
        return [View(name, (), (), i, m.dtype) for i in range(n)]
    stride = v.strides[0] if v.sizes else 0
    return [View(v.buf, (), (), v.offset + i * stride, m.dtype) for i in range(n)]


def _on_cpu_scalars(lo, n) -> bool:
    devs = [d for d in pytree.tree_leaves(lo.meta.get((n, "device"))) if d is not None]
    vals = [t for t in pytree.tree_leaves(lo.meta.get(n)) if isinstance(t, torch.Tensor)]
    return bool(devs) and all(d.type == "cpu" for d in devs) and all(t.numel() == 1 for t in vals)


def stacked_elements(lo, n):
    """The 0-d nodes a CPU tensor ``n`` stacks (``cat`` of their ``unsqueeze(x, 0)``, or
    ``stack``: a non-capturable Adam's step sizes), where it is read only as the
    ``scalars`` of device ops (``TENSOR_SCALARS``); else None. Element ``i`` of those
    ops then reads node ``i`` itself, computed on the device like any scalar only
    kernels read (``device_side``): the stack is never made."""
    if n.op != "call_function" or n.target not in (aten.cat.default, aten.stack.default):
        return None
    dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
    if dim not in (0, -1) or not isinstance(n.args[0], (list, tuple)):
        return None
    m = lo.meta.get(n)
    if not isinstance(m, torch.Tensor) or m.dim() != 1 or m.numel() > HOST_VALUES_MAX or \
            any(d is None or d.type != "cpu"
                for d in pytree.tree_leaves(lo.meta.get((n, "device")))):
        return None
    if not all(u.op == "call_function" and u.target in TENSOR_SCALARS and u.args[-1] is n
               and n not in u.args[:-1] for u in n.users):
        return None
    out = []
    for a in n.args[0]:
        if n.target is aten.cat.default:
            if not (isinstance(a, fx.Node) and a.target is aten.unsqueeze.default
                    and a.args[1] in (0, -1) and len(a.users) == 1):
                return None
            a = a.args[0]
        v = lo.meta.get(a) if isinstance(a, fx.Node) else None
        if not isinstance(v, torch.Tensor) or v.dim() != 0 or not _on_cpu_scalars(lo, a):
            return None
        out.append(a)
    return out


def device_side(lo, gm) -> set:
    """CPU scalar nodes whose values feed only the device's kernels (Adam's bias
    corrections and step sizes, computed from the step counters; the stack of those
    read as ``scalars``, ``stacked_elements``): lowered as device values, inlined
    into the kernels reading them, instead of computed by aten on the CPU (a per-tensor
    op per parameter) and copied over. Not the graph's outputs (the new step counters
    stay on the CPU, computed there) nor anything a CPU computation reads."""
    if not lo.host_values:
        return set()
    outputs = {a for n in gm.graph.nodes if n.op == "output"
               for a in pytree.tree_leaves(n.args) if isinstance(a, fx.Node)}
    on_device_ = set()
    for n in reversed(list(gm.graph.nodes)):
        if n.op != "call_function" or n in outputs or not n.users:
            continue
        if stacked_elements(lo, n) is not None:
            on_device_.add(n)
            continue
        if not _on_cpu_scalars(lo, n):
            continue
        if all(u.op == "call_function" and (u in on_device_ or all(
                d is None or d.type != "cpu" for d in pytree.tree_leaves(lo.meta.get((u, "device")))))
               for u in n.users):
            on_device_.add(n)
    # an element of a list computed on the CPU is that CPU value (copied over), not
    # the device's own
    return {n for n in on_device_ if not (n.target is operator.getitem
                                          and n.args[0] not in on_device_)}


def on_device(lo, node, args, kwargs):
    """``args``/``kwargs`` of ``node`` with every host scalar's box replaced by a view of
    its copy on the graph's device; the copies of one node's values are one transfer."""
    found = {}

    def visit(a):
        if isinstance(a, fx.Node) and a not in lo.host_copies and a not in lo.device_side \
                and is_host_scalar(
                lo, lo.meta.get((a, "device")), lo.meta.get(a)) and is_box(lo.env[a]):
            found.setdefault(lo.env[a].dtype, {})[a] = lo.env[a]
    if not lo.host_values:
        return args, kwargs
    pytree.tree_map(visit, (node.args, node.kwargs))
    for dtype, boxes in found.items():
        name = lo.new_name()
        args_ = []
        for a, box in boxes.items():
            v = lo.realize(box, origin=node.name)
            args_.append(ir.ExternArg(v.buf, v.sizes, v.strides, v.offset))
        lo.add(ir.Extern(name, (len(args_),), (1,), dtype, op=HostScalars(lo.device),
                         args=tuple(args_), origin=node.name))
        for k, (a, box) in enumerate(boxes.items()):
            lo.host_copies[a] = View(name, tuple(box.sizes), (0,) * len(box.sizes), k, dtype)
    if not any(isinstance(a, fx.Node) and a in lo.host_copies
               for a in pytree.tree_leaves((node.args, node.kwargs))):
        return args, kwargs

    def swap(a):
        return lo.host_copies.get(a, lo.env[a]) if isinstance(a, fx.Node) else a
    return pytree.tree_map(swap, (node.args, node.kwargs))
