"""The callable a compiled graph becomes: allocate, launch, call libraries, return.

Everything that can be decided at compile time is: the list of steps, which buffer
lives in which memory slot, which tensors each launch takes, when each slot is first
written and last read, how each library call's arguments are built. Per call a slot is
allocated (``torch.empty_strided``) just before the first step that writes it and
dropped after the last step that reads it, as are library results, so the peak memory
is that of the live buffers, not of all of them.
"""
from __future__ import annotations

import time
import weakref

import torch
from torch.utils import _pytree as pytree

from .. import config
from . import ir
from .lowering import View


def _step_names(step, buffers) -> set:
    """Buffer names a step reads or writes."""
    if isinstance(step, ExternStep):
        b = step.b
        return set(b.reads()) | {b.name} | set(b.outputs)
    return set(getattr(step, "params", ()))


class Runtime:
    def __init__(self, lowering, sched, launch_segment, device):
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
            else:
                self.out_plan.append(("view", v))
        self.plain_tuple = self.out_spec == pytree.tree_flatten(tuple(out_flat))[1]
        if self.device.type == "cpu":
            self._read_layouts()
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
            elif kind == "view":
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
            if _span(layout[0], layout[1]) == _span(sz, st) and \
                    _numel(layout[0]) == _numel(sz):
                self.slot_specs[s] = (layout[0], layout[1], dt)

    def _plan_lifetimes(self):
        """Per step: the slots to allocate before it, the names to drop after it."""
        n = len(self.steps)
        names_of = [_step_names(s, self.buffers) for s in self.steps]
        keep = {v if k == "buf" else v.buf for k, v in self.out_plan if k != "const"}
        keep |= {name for _, name in self.inputs}
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
        for name, i in last.items():
            if name not in in_slots and name not in keep and name in self.buffers \
                    and not isinstance(self.buffers[name], ir.Input):
                self.drop_at[i].append(name)

    def tensor_of(self, tensors, buf, sizes, strides, offset):
        t = tensors[buf]
        if offset == 0 and tuple(t.shape) == tuple(sizes) and tuple(t.stride()) == tuple(strides):
            return t
        return torch.as_strided(t, sizes, strides, t.storage_offset() + offset)

    def _alloc(self, tensors, todo):
        device = self.device
        for s, members in todo:
            sz, st, dt = self.slot_specs[s]
            t = torch.empty_strided(sz, st, dtype=dt, device=device)
            for name in members:
                tensors[name] = t

    def __call__(self, *args):
        if self.graphs is not None:
            return self.graphs(self, args)
        return self.run(args)

    def run(self, args):
        tensors = {name: args[pos] for pos, name in self.inputs}
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
            else:
                out.append(v)
        if self.plain_tuple:
            return tuple(out)
        return pytree.tree_unflatten(out, self.out_spec)


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
            tensors[b.name] = _fix_layout(r, b)
            return
        leaves = pytree.tree_leaves(r)
        for o in self.outputs:
            t = leaves[o.path[0]]
            # an undefined optional result (attention weights not asked for) is None,
            # where the meta kernel that planned the graph gave an empty tensor
            tensors[o.name] = None if t is None else _fix_layout(t, o)


def _extern_args(x):
    if isinstance(x, ir.ExternArg):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _extern_args(y)


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= int(s)
    return n


def _span(sizes, strides) -> int:
    if any(int(s) == 0 for s in sizes):
        return 0
    return 1 + sum((int(s) - 1) * int(st) for s, st in zip(sizes, strides))


def _has_arg(x) -> bool:
    if isinstance(x, ir.ExternArg):
        return True
    if isinstance(x, (list, tuple)):
        return any(_has_arg(y) for y in x)
    return False


def _fix_layout(t, b):
    """Kernels were generated for the strides seen at compile time; insist on them."""
    if tuple(t.stride()) != tuple(b.strides) and t.numel() > 1:
        c = torch.empty_strided(b.sizes, b.strides, dtype=t.dtype, device=t.device)
        c.copy_(t)
        return c
    return t


#: CUDA graphs for launch-bound graphs: "auto" (small outputs, many steps, on CUDA),
#: "0" never, "1" whenever possible. Replaying a recorded graph costs one launch instead
#: of one per kernel and library call (resnet18 at batch 16 spends ~90% of a call on the
#: host otherwise).
GRAPH_MIN_STEPS = 8
#: outputs up to this size are replayed from a CUDA graph unmeasured (copying them out
#: of the graph's memory costs next to nothing)
GRAPH_MAX_OUTPUT_BYTES = 8 << 20
#: larger outputs (a training forward's saved activations), up to GRAPH_AUTO_MAX_BYTES
#: (the graph's memory is held between calls, beside the copies), only where a timed
#: plain call shows the GPU waiting on the launches: its span on the GPU is at most
#: GRAPH_LAUNCH_BOUND times the host's time to launch it
GRAPH_AUTO_MAX_BYTES = 256 << 20
GRAPH_LAUNCH_BOUND = 1.2
_RANDOM = ("rand", "bernoulli", "dropout", "normal", "uniform", "multinomial", "poisson",
           "exponential", "geometric", "cauchy", "log_normal")


class GraphReplay:
    """Records a Runtime's steps in a CUDA graph on its second call and replays it after.

    Inputs at the same address on the first two calls (parameters) are read in place and
    must stay there (checked per call); others are copied into static buffers first.
    Outputs are copied out of the graph's memory; where they are large (a training
    forward's saved activations), the second call is a timed plain one, and the graph
    is recorded (on the third) only if that call was launch-bound. Anything unexpected
    (an input moving, capture failing: host syncs, unsupported ops) falls back to plain
    calls for good."""

    def __init__(self, rt, measure: bool = False):
        self.calls = 0
        self.ptrs = None
        self.graph = None
        self.disabled = False
        self.failures = 0
        self.reason = None
        self.moving = set()
        self.measure = measure          # time the second call before recording
        self.timing = None              # (host ms, GPU ms) of that call

    @staticmethod
    def maybe(rt):
        mode = config.cudagraphs
        if mode == "0" or rt.device.type != "cuda" or not torch.cuda.is_available():
            return None
        if any(k == "const" for k, _ in rt.out_plan):
            return None
        for kind, v in rt.out_plan:       # outputs aliasing inputs: no
            name = v if kind == "buf" else v.buf
            if isinstance(rt.buffers[name], ir.Input):
                return None
        for s in rt.steps:
            if isinstance(s, ExternStep):
                name = str(getattr(s.b.op, "__name__", s.b.op))
                if any(r in name for r in _RANDOM):
                    return None
        measure = False
        if mode != "1":
            nbytes = 0
            for kind, v in rt.out_plan:
                b = rt.buffers[v if kind == "buf" else v.buf]
                nbytes += b.numel * torch.empty((), dtype=b.dtype).element_size()
            if len(rt.steps) < GRAPH_MIN_STEPS or nbytes > GRAPH_AUTO_MAX_BYTES:
                return None
            measure = nbytes > GRAPH_MAX_OUTPUT_BYTES
        return GraphReplay(rt, measure)

    def __call__(self, rt, args):
        if self.disabled:
            return rt.run(args)
        ptrs = [args[pos].data_ptr() for pos, _ in rt.inputs]
        self.calls += 1
        if self.calls == 1:                      # warm-up: compiles, library plans
            self.ptrs = ptrs
            return rt.run(args)
        if self.measure:
            self.measure = False
            return self._timed_call(rt, args)
        if self.graph is None:
            return self._record(rt, args, ptrs)
        for i in self.stable:
            if ptrs[i] != self.ptrs[i]:
                # an input taken for a parameter moved: record again with it copied in
                self.failures += 1
                if self.failures > 2:
                    self._disable("inputs taken for parameters keep moving")
                    return rt.run(args)
                self.moving.add(i)
                self.graph = None
                return self._record(rt, args, ptrs)
        for i, st in self.copies:
            st.copy_(args[rt.inputs[i][0]])
        self.graph.replay()
        return self._outputs(rt)

    def _timed_call(self, rt, args):
        """A plain call, timed on the host and on the GPU from an idle queue: where the
        GPU's span is near the host's, the GPU waited on the launches, and a replay
        (with its output copies) is worth it; where the GPU is the bottleneck, the
        copies would only add to it, and plain calls stay."""
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        out = rt.run(args)
        end.record()
        host_ms = (time.perf_counter() - t0) * 1e3
        end.synchronize()
        gpu_ms = start.elapsed_time(end)
        self.timing = (host_ms, gpu_ms)
        if gpu_ms > GRAPH_LAUNCH_BOUND * host_ms:
            self._disable(f"GPU-bound with large outputs (GPU {gpu_ms:.2f} ms, "
                          f"launches {host_ms:.2f} ms)")
        return out

    def _disable(self, why):
        self.disabled = True
        self.reason = why
        self.graph = None
        self.outs = None

    def _outputs(self, rt):
        out = [t.clone() for t in self.outs]
        if rt.plain_tuple:
            return tuple(out)
        return pytree.tree_unflatten(out, rt.out_spec)

    def _record(self, rt, args, ptrs):
        self.moving |= {i for i, (p, q) in enumerate(zip(ptrs, self.ptrs)) if p != q}
        self.stable = [i for i in range(len(ptrs)) if i not in self.moving]
        self.ptrs = ptrs
        moving = sorted(self.moving)
        self.copies = []
        static = list(args)
        for i in moving:
            pos = rt.inputs[i][0]
            a = args[pos]
            st = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            st.copy_(a)
            static[pos] = st
            self.copies.append((i, st))
        try:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = rt.run(static)
            flat = pytree.tree_leaves(outs) if not rt.plain_tuple else list(outs)
            self.outs = [t for t in flat]
            self.graph = graph
        except Exception as e:        # noqa: BLE001  (capture is best effort)
            try:
                torch.cuda.synchronize()
            except Exception:          # noqa: BLE001
                pass
            self._disable(f"capture failed: {type(e).__name__}: {e}")
            return rt.run(args)
        self.graph.replay()
        return self._outputs(rt)
