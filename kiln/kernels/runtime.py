"""The callable a compiled graph becomes: allocate, launch, call libraries, return.

Everything that can be decided at compile time is: the list of steps, which buffer
lives in which memory slot, which tensors each launch takes. Per call we allocate the
slots (``torch.empty_strided``), take data pointers and run the steps in order.
"""
from __future__ import annotations

import torch
from torch.utils import _pytree as pytree

from . import ir
from .lowering import View


class Runtime:
    def __init__(self, lowering, sched, launch_segment, device):
        self.lo, self.sched, self.device = lowering, sched, device
        self.buffers = {b.name: b for b in lowering.buffers}
        self.inputs = [(b.position, b.name) for b in lowering.buffers if isinstance(b, ir.Input)]
        self.slot_specs = [(sizes, strides, dtype) for _, dtype, sizes, strides in sched.slot_specs]
        self.slot_of = list(sched.slots.items())
        self.steps = []
        for seg in launch_segment:
            self.steps.append(seg)
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
            else:
                self.out_plan.append(("view", v))
        self.plain_tuple = self.out_spec == pytree.tree_flatten(tuple(out_flat))[1]

    def tensor_of(self, tensors, buf, sizes, strides, offset):
        t = tensors[buf]
        if offset == 0 and tuple(t.shape) == tuple(sizes) and tuple(t.stride()) == tuple(strides):
            return t
        return torch.as_strided(t, sizes, strides, t.storage_offset() + offset)

    def __call__(self, *args):
        tensors = {name: args[pos] for pos, name in self.inputs}
        if self.slot_specs:
            device = self.device
            slots = [torch.empty_strided(sz, st, dtype=dt, device=device)
                     for sz, st, dt in self.slot_specs]
            for name, s in self.slot_of:
                tensors[name] = slots[s]
        for step in self.steps:
            step(self, tensors)
        out = []
        for kind, v in self.out_plan:
            if kind == "buf":
                out.append(tensors[v])
            elif kind == "view":
                out.append(self.tensor_of(tensors, v.buf, v.sizes, v.strides, v.offset))
            else:
                out.append(v)
        if self.plain_tuple:
            return tuple(out)
        return pytree.tree_unflatten(out, self.out_spec)


class ExternStep:
    """Call the aten op with tensors built from its ``ExternArg``s."""

    def __init__(self, b: ir.Extern, buffers):
        self.b = b
        self.outputs = [buffers[o] for o in b.outputs]

    def __call__(self, rt, tensors):
        b = self.b

        def mat(a):
            if isinstance(a, ir.ExternArg):
                return rt.tensor_of(tensors, a.buf, a.sizes, a.strides, a.offset)
            return a
        args, kwargs = pytree.tree_map(mat, (b.args, b.kwargs),
                                       is_leaf=lambda x: isinstance(x, ir.ExternArg))
        r = b.op(*args, **kwargs)
        if not self.outputs:
            tensors[b.name] = _fix_layout(r, b)
            return
        leaves = pytree.tree_leaves(r)
        for o in self.outputs:
            tensors[o.name] = _fix_layout(leaves[o.path[0]], o)


def _fix_layout(t, b):
    """Kernels were generated for the strides seen at compile time; insist on them."""
    if tuple(t.stride()) != tuple(b.strides) and t.numel() > 1:
        c = torch.empty_strided(b.sizes, b.strides, dtype=t.dtype, device=t.device)
        c.copy_(t)
        return c
    return t
