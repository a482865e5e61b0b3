"""Replaying a GPU graph that reads one-element CPU tensors (``GraphReplay``'s host side).

Eager keeps an optimizer's step counters on the CPU (unless ``capturable=True``), and a
tensor ``lr`` or GradScaler's scale may be there too; kiln keeps eager's layout, so such
a graph computes ``step + 1`` on the CPU and its kernels read host values through
``HostScalars`` copies (``lowering/host_scalars.py``). A recorded CUDA graph would
replay those copies with the recording call's values, so the graph is split:

1. the host prologue, run on the CPU every call: the graph's aten ops on CPU tensors
   (their results are outputs, written back into the real tensors by the caller as
   any graph output is), then the values every ``HostScalars`` step would copy,
   gathered into one pinned staging buffer;
2. one asynchronous host-to-device copy of that buffer into a static device buffer,
   allocated once, of which each ``HostScalars`` result is a fixed view;
3. the recorded graph of everything else, reading those views; the copy precedes its
   replay on the same stream.

The split is decided at the graph's first call, which runs the graph as it is while
noting the device of every buffer made (``first_call``): host steps are the library
calls on CPU tensors alone whose results are small CPU tensors (at most
``HOST_VALUES_MAX`` elements: step counters, and a non-capturable Adam's step sizes
stacked from them). Anything else that touches a CPU value (a kernel or a device
library call reading one, a CPU value made from device values, a larger CPU tensor)
keeps the graph off replay, with the reason (``KILN_LOGS=perf_hints``).

Staging buffers take turns (two, each with an event recorded after its copy): one is
written again only once the copy that last read it is done, so a call never changes
the values a copy still in flight is reading.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch

from ...debug.logs import log_for
from .. import ir
from ..lowering.host_scalars import HOST_VALUES_MAX, HostScalars

#: bytes between the starts of two copies' values in the buffers (the kernels' fast
#: launch path wants 16-byte aligned pointers)
ALIGN = 16
#: staging buffers taking turns
STAGING = 2
_log = log_for("perf_hints")


def is_host_copy(step) -> bool:
    return isinstance(getattr(getattr(step, "b", None), "op", None), HostScalars)


def wanted(rt, args) -> bool:
    """Does the graph read host values: a CPU input, or a host copy?"""
    return any(args[pos].device.type != rt.device.type for pos, _ in rt.inputs) or \
        any(is_host_copy(s) for s in rt.steps)


@dataclass
class Copy:
    """One ``HostScalars`` step's values: ``n`` of ``dtype`` at ``offset`` bytes."""
    step: int
    name: str
    offset: int
    n: int
    dtype: torch.dtype
    scalars: bool              # all its values are 0-d (one stack); else flattened


@dataclass
class HostPlan:
    host_inputs: list          # indices into rt.inputs of the CPU inputs
    host_steps: list           # indices into rt.steps run by the prologue, in order
    copies: list               # [Copy]
    host_outputs: list         # indices into rt.out_plan of outputs the prologue makes
    nbytes: int
    host_names: set = field(default_factory=set)   # buffers the prologue computes


class _Seen(dict):
    """The tensors dict of a first call that notes, per buffer name made, (device type,
    numel, dtype), or None for a result that is not a tensor."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.seen = {k: _describe(v) for k, v in tensors.items()}

    def __setitem__(self, name, value):
        self.seen[name] = _describe(value)
        super().__setitem__(name, value)


def _describe(t):
    if not isinstance(t, torch.Tensor):
        return None
    return (t.device.type, t.numel(), t.dtype)


def first_call(rt, args):
    """Run the graph as it is, and decide its split: (outputs, HostPlan or the reason
    it cannot be replayed)."""
    tensors = _Seen(rt.take_inputs(args))
    flat = rt.run_flat(tensors)
    return rt.package(flat), plan_of(rt, tensors.seen)


def _reads(step) -> set:
    b = getattr(step, "b", None)
    if b is not None:
        return set(b.reads())
    return set(getattr(step, "params", ()))


def _made(step) -> list:
    b = getattr(step, "b", None)
    if b is None:
        return []
    return list(b.outputs) or [b.name]


def plan_of(rt, seen: dict):
    """The split of ``rt``'s steps given the buffers ``seen`` at a first call (name ->
    (device type, numel, dtype) or None): a HostPlan, or the reason (a str) why the
    graph stays off replay."""
    host, host_inputs = set(), []
    for i, (pos, name) in enumerate(rt.inputs):
        d = seen.get(name)
        if d is None or d[0] == rt.device.type:
            continue
        if d[0] != "cpu" or d[1] > HOST_VALUES_MAX:
            return (f"a graph input is not on the GPU ({d[0]}, {d[1]} elements): only "
                    f"CPU tensors of at most {HOST_VALUES_MAX} elements are read through "
                    "the host prologue")
        host.add(name)
        host_inputs.append(i)
    host_steps, copies, offset = [], [], 0
    computed = set()
    for k, step in enumerate(rt.steps):
        reads, made = _reads(step), _made(step)
        if is_host_copy(step):
            b = step.b
            if not reads <= host:
                return f"a host copy reads a value made on the GPU ({b.origin})"
            dtypes = {seen[a.buf][2] for a in b.args if seen.get(a.buf)}
            if dtypes != {b.dtype}:
                return f"a host copy of {sorted(map(str, dtypes))} values into {b.dtype} ({b.origin})"
            n = sum(ir.numel_of(a.sizes) for a in b.args)
            copies.append(Copy(k, b.name, offset, n, b.dtype,
                               all(len(a.sizes) == 0 for a in b.args)))
            offset += -(-n * b.dtype.itemsize // ALIGN) * ALIGN
            continue
        on_cpu = [m for m in made if seen.get(m) is not None and seen[m][0] == "cpu"]
        if getattr(step, "b", None) is not None and reads <= host and made and \
                len(on_cpu) == len(made) and all(seen[m][1] <= HOST_VALUES_MAX for m in made):
            host_steps.append(k)
            host.update(made)
            computed.update(made)
            continue
        what = getattr(getattr(step, "b", None), "op", None) or "a kernel"
        if reads & host:
            return f"a GPU step reads a CPU tensor directly ({what})"
        if on_cpu:
            return f"a CPU value is made from GPU values or alongside them ({what})"
    out_bufs = [None if kind == "const" else v if kind == "buf" else v.buf
                for kind, v in rt.out_plan]
    if set(out_bufs) & {c.name for c in copies}:
        # its memory is the static buffer, which the next call overwrites
        return "a graph output is a host value's copy on the device"
    host_outputs = [i for i, b in enumerate(out_bufs) if b in computed]
    return HostPlan(host_inputs, host_steps, copies, host_outputs, offset, computed)


class _Done:
    """Stands in, in the recorded graph's steps, for a step the prologue ran."""
    params = ()

    def __call__(self, rt, tensors):
        pass


class _AlwaysDone:
    """The event of a staging buffer copied synchronously (no CUDA)."""

    def record(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


class _Staging:
    __slots__ = ("buf", "views", "event", "pending")

    def __init__(self, nbytes, fills, pin, event):
        self.buf = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pin)
        self.views = [_view(self.buf, f.first) if f.tmp is None else
                      self.buf.view(f.first.dtype).as_strided(
                          (len(f.names),), (ALIGN // f.first.dtype.itemsize,),
                          f.first.offset // f.first.dtype.itemsize)
                      for f in fills]
        self.event = event
        self.pending = False


def _view(buf, c: Copy):
    return buf[c.offset:c.offset + c.n * c.dtype.itemsize].view(c.dtype)


@dataclass
class _Fill:
    """How one staging step writes its values: copy ``first`` (its step ``step``) from
    its 0-d values ``names`` (a stack), or from its arguments as built (``names``
    None); or a run of one-value copies of one dtype at consecutive aligned offsets
    (each counter of an optimizer copied for its own readers), stacked at once into
    ``tmp`` and copied to their strided places (one stack per parameter costs ~10x)."""
    first: Copy
    step: object
    names: list | None
    tmp: torch.Tensor | None = None


def _fills(copies, steps, reads) -> list:
    fills = []
    for c, step, names in zip(copies, steps, reads):
        one = names is not None and c.n == 1
        last = fills[-1] if fills else None
        if one and last is not None and last.names is not None and \
                (last.tmp is not None or last.first.n == 1) and \
                last.first.dtype == c.dtype and \
                c.offset == last.first.offset + len(last.names) * ALIGN and \
                ALIGN % c.dtype.itemsize == 0 and last.first.offset % c.dtype.itemsize == 0:
            last.names = last.names + names
            last.tmp = torch.empty(len(last.names), dtype=c.dtype)
            continue
        fills.append(_Fill(c, step, list(names) if names is not None else None))
    return fills


class HostCall:
    """One call's prologue results: ``tensors`` (the host buffers' values, and each
    host copy's static device view) and ``outputs`` ({out_plan index: tensor})."""
    __slots__ = ("tensors", "outputs")

    def __init__(self, tensors, outputs):
        self.tensors, self.outputs = tensors, outputs


class HostPrologue:
    """The host side of a replayed graph (see the module doc). ``event``: a factory of
    the staging buffers' events (``torch.cuda.Event`` on CUDA; tests pass fakes)."""

    def __init__(self, rt, plan: HostPlan, device=None, event=None, staging=STAGING):
        device = torch.device(device if device is not None else rt.device)
        self.plan = plan
        cuda = device.type == "cuda"
        if event is None:
            event = torch.cuda.Event if cuda else _AlwaysDone
        self.static = torch.empty(max(plan.nbytes, 1), dtype=torch.uint8, device=device)
        self.views = {c.name: _view(self.static, c) for c in plan.copies}
        self.turn = 0
        self.waits = 0             # times a staging buffer's last copy was waited for
        #: the stream the static buffer's copy is issued on (the device's current one,
        #: whichever device is current): its event is recorded there
        self.stream = (lambda: torch.cuda.current_stream(device)) if cuda else (lambda: None)
        self.inputs = [rt.inputs[i] for i in plan.host_inputs]
        self.steps = [rt.steps[k] for k in plan.host_steps]
        self.copy_steps = [rt.steps[c.step] for c in plan.copies]
        #: per copy, the names of its 0-d values read whole (a tensor each, as
        #: planned), else None: its arguments built as the step builds them
        self.reads = [[a.buf for a in rt.steps[c.step].b.args]
                      if c.scalars and all(_whole_scalar(rt, a) for a in rt.steps[c.step].b.args)
                      else None for c in plan.copies]
        self.fills = _fills(plan.copies, self.copy_steps, self.reads)
        self.staging = [_Staging(plan.nbytes, self.fills, cuda, event())
                        for _ in range(staging)]
        #: outputs that are a 0-d host buffer itself; the others built per call
        self.direct, self.out_plan = [], []
        for i in plan.host_outputs:
            kind, v = rt.out_plan[i]
            if kind == "alias" and _whole_scalar(rt, v):
                self.direct.append((i, v.buf))
            else:
                self.out_plan.append((i, (kind, v)))
        #: the runtime whose steps the graph records: the prologue's steps done already
        skip = set(plan.host_steps) | {c.step for c in plan.copies}
        self.device_rt = copy.copy(rt)
        self.device_rt.steps = [_Done() if k in skip else s for k, s in enumerate(rt.steps)]
        self.device_rt.graphs = None          # (no cycle back to the GraphReplay)
        _log.info("CUDA graph replay with a %s", describe(plan, rt))

    def run(self, rt, args) -> HostCall:
        """This call's host steps, its values staged and copied to the static buffer."""
        tensors = {name: args[pos] for pos, name in self.inputs}
        for step in self.steps:
            step(rt, tensors)
        if self.copy_steps:
            self._stage(tensors)
        outputs = {i: tensors[name] for i, name in self.direct}
        for i, (kind, v) in self.out_plan:
            outputs[i] = _output(tensors, kind, v)
        tensors.update(self.views)
        return HostCall(tensors, outputs)

    def _stage(self, tensors):
        """The host copies' values into the next staging buffer (once the copy that
        last read it is done), then one copy into the static buffer, in stream order."""
        stage = self.staging[self.turn]
        self.turn = (self.turn + 1) % len(self.staging)
        if stage.pending and not stage.event.query():
            self.waits += 1
            stage.event.synchronize()
        with torch.no_grad():          # values only (a tensor lr may require grad)
            for f, view in zip(self.fills, stage.views):
                if f.tmp is not None:
                    view.copy_(torch.stack([tensors[n] for n in f.names], out=f.tmp))
                elif f.names is not None:
                    torch.stack([tensors[n] for n in f.names], out=view)
                else:
                    torch.cat([v.reshape(-1) for v in f.step.build(tensors)[0]], out=view)
            self.static.copy_(stage.buf, non_blocking=True)
        stage.event.record(self.stream())
        stage.pending = True

    def device_tensors(self, rt, args, call: HostCall) -> dict:
        """The recorded graph's tensors dict: the device inputs and the prologue's."""
        tensors = rt.take_inputs(args)
        tensors.update(call.tensors)
        return tensors

    def strip(self, flat: list) -> list:
        """A recording's outputs without the prologue's (not the graph's memory)."""
        flat = list(flat)
        for i in self.plan.host_outputs:
            flat[i] = None
        static = self.static.untyped_storage().data_ptr()
        if any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == static
               for t in flat):
            # (a view of a host copy handed out: the next call's copy would change it)
            raise RuntimeError("an output is a view of the host values' static buffer")
        return flat

    def pointers(self, rt, args) -> list:
        """Input addresses GraphReplay tracks: the CPU inputs' are the prologue's."""
        ptrs = [args[pos].data_ptr() for pos, _ in rt.inputs]
        for i in self.plan.host_inputs:
            ptrs[i] = 0
        return ptrs


def _whole_scalar(rt, a) -> bool:
    """Is the argument or output ``a`` (ExternArg or View) all of a 0-d buffer? The
    buffer's tensor is then ``a`` itself (inputs match the graph's signature; library
    results are checked against their planned shape, ``runner._fix_layout``)."""
    b = rt.buffers.get(a.buf)
    return b is not None and a.offset == 0 and tuple(a.sizes) == () and tuple(b.sizes) == ()


def _output(tensors, kind, v):
    """Output ``v`` of a host buffer, made as ``Runtime.run_flat`` makes it: the
    buffer where it has the output's geometry, else a tensor of its own on the
    buffer's storage."""
    if kind == "buf":
        return tensors[v]
    t = tensors[v.buf]
    if v.offset == 0 and tuple(t.shape) == tuple(v.sizes) and tuple(t.stride()) == tuple(v.strides):
        return t
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() + v.offset, v.sizes, v.strides)


def describe(plan: HostPlan, rt) -> str:
    """The split in words, for logs and tests."""
    steps = [str(rt.steps[k].b.op) for k in plan.host_steps]
    copies = [f"{c.name}: {c.n} x {str(c.dtype).replace('torch.', '')} at {c.offset}"
              for c in plan.copies]
    return (f"host prologue: inputs {[rt.inputs[i][1] for i in plan.host_inputs]}, "
            f"steps {steps}, static buffer of {plan.nbytes} bytes [{'; '.join(copies)}], "
            f"outputs {plan.host_outputs}")

