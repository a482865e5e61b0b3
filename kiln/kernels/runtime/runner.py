"""The callable a compiled graph becomes: allocate, launch, call libraries, return.

Everything that can be decided at compile time is: the list of steps, which buffer
lives in which memory slot, which tensors each launch takes, when each slot is first
written and last read, how each library call's arguments are built. Per call a slot is
allocated (``torch.empty_strided``) just before the first step that writes it and
dropped after the last step that reads it, as are library results, so the peak memory
is that of the live buffers, not of all of them.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils import _pytree as pytree

from .. import ir
from . import in_place
from .graph_replay import GraphReplay
from ..lowering import View


def _step_names(step, buffers) -> set:
    """Buffer names a step reads or writes."""
    if isinstance(step, ExternStep):
        b = step.b
        return set(b.reads()) | {b.name} | set(b.outputs)
    return set(getattr(step, "params", ()))


class Runtime:
    def __init__(self, lowering, sched, launch_segment, device, mutations=None):
        self.lo, self.sched, self.device = lowering, sched, device
        self.buffers = {b.name: b for b in lowering.buffers}
        self.inputs = [(b.position, b.name) for b in lowering.buffers if isinstance(b, ir.Input)]
        self.slot_specs = [(sizes, strides, dtype) for _, dtype, sizes, strides in sched.slot_specs]
        self.slot_of = list(sched.slots.items())
        self.steps = list(launch_segment)
        out_flat, self.out_spec = pytree.tree_flatten(lowering.outputs,
                                                      is_leaf=lambda x: isinstance(x, View))
        self.out_flat = out_flat
        # Layouts of inputs and kernel buffers are fixed for this specialisation, so
        # whether an output is the buffer itself or a view of it is known now.
        self.out_plan = []
        for v in out_flat:
            if not isinstance(v, View):
                self.out_plan.append(("const", v))
                continue
            b = self.buffers[v.buf]
            static = isinstance(b, ir.Input) or (v.buf in sched.slots and v.buf in sched.outputs)
            same = (v.offset == 0 and tuple(v.sizes) == tuple(b.sizes)
                    and tuple(v.strides) == tuple(b.strides))
            if static and same:
                self.out_plan.append(("buf", v.buf))
            elif isinstance(b, ir.Input):
                self.out_plan.append(("view", v))
            else:
                self.out_plan.append(("alias", v))
        self.plain_tuple = self.out_spec == pytree.tree_flatten(tuple(out_flat))[1]
        if self.device.type == "cpu":
            self._read_layouts()
        #: slot -> the input it is (a mutated input's new value written into it)
        self.bound = {}
        self.in_place_inputs = set()
        for k, name in in_place.outputs(self, mutations).items():
            self.bound[sched.slots[self.out_plan[k][1]]] = name
            self.in_place_inputs.add(name)
            self.out_plan[k] = ("buf", name)
        self._plan_lifetimes()
        for s in self.steps:
            if isinstance(s, ExternStep):
                s.prepare(self)
        self.graphs = GraphReplay.maybe(self)

    def _read_layouts(self):
        """Allocate a slot in the layout its library calls and outputs read it in, when
        they all agree and it covers the same memory (a [16] kernel buffer that an addmm
        reads as [1, 16]): the read is then the tensor itself, not an ``as_strided`` view
        built per call (~3 us each, which on a graph of small layers is most of its
        overhead). Kernels see only the data pointer. CPU only: there per-call host time
        is the whole cost; a CUDA graph is replayed instead."""
        wants = {}
        slots = self.sched.slots

        def want(buf, layout):
            if buf in slots:
                wants.setdefault(slots[buf], set()).add(layout)

        for kind, v in self.out_plan:
            if kind == "buf":
                want(v, (tuple(self.buffers[v].sizes), tuple(self.buffers[v].strides), 0))
            elif kind in ("view", "alias"):
                want(v.buf, (tuple(v.sizes), tuple(v.strides), v.offset))
        for step in self.steps:
            if isinstance(step, ExternStep):
                for a in _extern_args((step.b.args, list(step.b.kwargs.values()))):
                    want(a.buf, (tuple(a.sizes), tuple(a.strides), a.offset))
                for name in (step.b.name, *step.b.outputs):
                    want(name, None)      # written by a library call: leave it be
        for s, layouts in wants.items():
            if len(layouts) != 1:
                continue
            (layout,) = layouts
            sz, st, dt = self.slot_specs[s]
            if layout is None or layout[2] != 0 or (layout[0], layout[1]) == (sz, st):
                continue
            if ir.span(layout[0], layout[1]) == ir.span(sz, st) and \
                    ir.numel_of(layout[0]) == ir.numel_of(sz):
                self.slot_specs[s] = (layout[0], layout[1], dt)

    def _plan_lifetimes(self):
        """Per step: the slots to allocate before it, the names to drop after it."""
        n = len(self.steps)
        names_of = [_step_names(s, self.buffers) for s in self.steps]
        keep = {v if k == "buf" else v.buf for k, v in self.out_plan if k != "const"}
        slot_members = {}
        for name, s in self.slot_of:
            slot_members.setdefault(s, []).append(name)
        first, last = {}, {}
        for i, names in enumerate(names_of):
            for name in names:
                first.setdefault(name, i)
                last[name] = i
        self.alloc_at = [[] for _ in range(n + 1)]
        self.drop_at = [[] for _ in range(n)]
        for s, members in slot_members.items():
            used = [first[m] for m in members if m in first]
            start = min(used) if used else n
            self.alloc_at[start].append((s, members))
            if not any(m in keep for m in members) and used:
                end = max(last[m] for m in members if m in last)
                self.drop_at[end].extend(members)
        in_slots = {name for name, _ in self.slot_of}
        # inputs too: a boxed call (``call_boxed``) holds the only reference to them
        for name, i in last.items():
            if name not in in_slots and name not in keep and name in self.buffers:
                self.drop_at[i].append(name)

    def tensor_of(self, tensors, buf, sizes, strides, offset):
        t = tensors[buf]
        if offset == 0 and tuple(t.shape) == tuple(sizes) and tuple(t.stride()) == tuple(strides):
            return t
        return torch.as_strided(t, sizes, strides, t.storage_offset() + offset)

    def _alloc(self, tensors, todo):
        device = self.device
        bound = self.bound
        for s, members in todo:
            sz, st, dt = self.slot_specs[s]
            t = tensors[bound[s]] if s in bound else \
                torch.empty_strided(sz, st, dtype=dt, device=device)
            for name in members:
                tensors[name] = t

    def __call__(self, *args):
        if self.graphs is not None:
            return self.graphs(self, args)
        return self.run(args)

    def call_boxed(self, args: list):
        """Call with the inputs in a list this call takes over (and empties): each input
        is then freed after the last step that reads it, not when the call returns. The
        backward graph is called so: the forward's saved activations are most of a
        training step's memory, and each goes as soon as its last reader is done."""
        if self.graphs is not None:
            try:
                return self.graphs(self, args)
            finally:
                args.clear()
        tensors = self.take_inputs(args)
        args.clear()
        return self._run(tensors)

    def run(self, args):
        return self._run(self.take_inputs(args))

    def take_inputs(self, args) -> dict:
        return {name: args[pos] for pos, name in self.inputs}

    def _run(self, tensors):
        return self.package(self.run_flat(tensors))

    def package(self, out: list):
        """The graph's outputs, in its output structure, from their flat list."""
        if self.plain_tuple:
            return tuple(out)
        return pytree.tree_unflatten(out, self.out_spec)

    def run_flat(self, tensors) -> list:
        """Run the steps on ``tensors`` ({input name: tensor}, consumed); the outputs as
        a flat list in ``out_plan``'s order."""
        alloc_at, drop_at = self.alloc_at, self.drop_at
        for i, step in enumerate(self.steps):
            if alloc_at[i]:
                self._alloc(tensors, alloc_at[i])
            step(self, tensors)
            for name in drop_at[i]:
                tensors.pop(name, None)
        if alloc_at[-1]:
            self._alloc(tensors, alloc_at[-1])
        out = []
        for kind, v in self.out_plan:
            if kind == "buf":
                out.append(tensors[v])
            elif kind == "view":
                out.append(self.tensor_of(tensors, v.buf, v.sizes, v.strides, v.offset))
            elif kind == "alias":
                out.append(_alias(tensors[v.buf], v))
            else:
                out.append(v)
        return out


class _StableView:
    """A view of a graph input (a transposed Linear weight, say) that is built once and
    reused while the same tensor object comes back at the same address: parameters do,
    call after call. A view is kept only once the same tensor has been seen twice (so an
    activation passed once is not held alive by it), and never under grad mode (a view
    made there carries autograd history)."""

    __slots__ = ("rt", "a", "ref", "ptr", "view")

    def __init__(self, rt, a):
        self.rt, self.a = rt, a
        self.ref, self.ptr, self.view = None, 0, None

    def __call__(self, tensors):
        a = self.a
        t = tensors[a.buf]
        same = self.ref is not None and self.ref() is t and t.data_ptr() == self.ptr
        if same and self.view is not None:
            return self.view
        v = self.rt.tensor_of(tensors, a.buf, a.sizes, a.strides, a.offset)
        if torch.is_grad_enabled():
            self.ref, self.view = None, None
            return v
        self.view = v if same else None
        self.ref, self.ptr = weakref.ref(t), t.data_ptr()
        return v


class ExternStep:
    """Call the aten op with tensors built from its ``ExternArg``s."""

    def __init__(self, b: ir.Extern, buffers):
        self.b = b
        self.outputs = [buffers[o] for o in b.outputs]
        self.build = None
        #: the result is its own flat list of tensors (no pytree walk per call: a
        #: ``_foreach_*`` op on an optimizer's CPU step counters runs every step)
        self.flat = _returns_flat_tensors(b.op)

    def prepare(self, rt: Runtime):
        """Argument builders decided once: a plain read of the buffer's tensor where its
        layout is the argument's (known at compile time), ``as_strided`` otherwise."""
        def getter(a: ir.ExternArg):
            b = rt.buffers.get(a.buf)
            layout = None
            if isinstance(b, (ir.Extern, ir.MultiOutput, ir.Input)):
                layout = (tuple(b.sizes), tuple(b.strides))
            elif a.buf in rt.sched.slots:
                sz, st, _ = rt.slot_specs[rt.sched.slots[a.buf]]
                layout = (tuple(sz), tuple(st))
            if layout is not None and a.offset == 0 and layout == (tuple(a.sizes), tuple(a.strides)):
                return lambda tensors, n=a.buf: tensors[n]
            if isinstance(b, ir.Input):
                return _StableView(rt, a)
            return lambda tensors, a=a: rt.tensor_of(tensors, a.buf, a.sizes, a.strides, a.offset)

        def builder(x):
            if isinstance(x, ir.ExternArg):
                return getter(x)
            if isinstance(x, (list, tuple)) and any(_has_arg(y) for y in x):
                parts = [builder(y) for y in x]
                typ = type(x)
                return lambda tensors: typ(p(tensors) for p in parts)
            return lambda tensors, x=x: x
        args = [builder(a) for a in self.b.args]
        kwargs = [(k, builder(v)) for k, v in self.b.kwargs.items()]

        def build(tensors):
            return ([f(tensors) for f in args], {k: f(tensors) for k, f in kwargs})
        self.build = build

    def __call__(self, rt, tensors):
        b = self.b
        if self.build is None:
            self.prepare(rt)
        args, kwargs = self.build(tensors)
        r = b.op(*args, **kwargs)
        if not self.outputs:
            # an op returning nothing (``_linalg_check_errors``: it raises or not) or
            # one tensor
            tensors[b.name] = _fix_layout(r, b) if isinstance(r, torch.Tensor) else r
            return
        leaves = r if self.flat else pytree.tree_leaves(r)
        for o in self.outputs:
            t = leaves[o.path[0]]
            # an undefined optional result (attention weights not asked for) is None,
            # where the meta kernel that planned the graph gave an empty tensor
            tensors[o.name] = None if t is None else _fix_layout(t, o)


def _returns_flat_tensors(op) -> bool:
    """Does ``op`` return a Tensor[] or a tuple of Tensors (never None)?"""
    returns = [str(r.type) for r in getattr(getattr(op, "_schema", None), "returns", ())]
    return returns == ["List[Tensor]"] or (len(returns) > 1 and set(returns) == {"Tensor"})


def _alias(t, v):
    """Output ``v`` of the graph's memory ``t``: ``t`` itself where it has the output's
    geometry, else a tensor of its own on ``t``'s storage (not a view of ``t``, as
    eager's output is not: in the kiln flow a view of an intermediate is made from its
    base after the graph, ``autograd.trace``; a view made here would be one autograd
    refuses in-place writes into)."""
    if v.offset == 0 and tuple(t.shape) == tuple(v.sizes) and tuple(t.stride()) == tuple(v.strides):
        return t
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() + v.offset, v.sizes, v.strides)


def _extern_args(x):
    if isinstance(x, ir.ExternArg):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _extern_args(y)


def _has_arg(x) -> bool:
    if isinstance(x, ir.ExternArg):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_arg(y) for y in x)
    return False


def _fix_layout(t, b):
    """Kernels were generated for the strides and dtype seen at compile time; insist on
    them. (A meta kernel can plan another dtype than the device's kernel returns: half
    precision LayerNorm statistics are float32 in the meta kernel and on CUDA, half on
    the CPU.)"""
    if tuple(t.shape) != tuple(b.sizes):
        raise RuntimeError(f"kiln: {b.origin}: the library call returned a tensor of "
                           f"shape {tuple(t.shape)}, planned {tuple(b.sizes)}")
    if t.dtype != b.dtype or (tuple(t.stride()) != tuple(b.strides) and t.numel() > 1):
        c = torch.empty_strided(b.sizes, b.strides, dtype=b.dtype, device=t.device)
        c.copy_(t)
        return c
    return t
