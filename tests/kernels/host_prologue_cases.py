"""A GPU graph reading CPU step counters, built on a CPU machine: lowered for a stand-in
accelerator (the meta device) as the Triton target, so its kernels read the counters
through host copies as on a GPU. Used by ``test_host_prologue.py``: in process for the
split (kernels that do nothing), and as a script run under ``TRITON_INTERPRET=1``
(``python host_prologue_cases.py`` prints "ok") for the values, with Triton's
interpreter running the kernels on CPU tensors standing in for the device's."""
from __future__ import annotations

import operator
import sys

import torch
import torch.fx as fx

aten = torch.ops.aten


def adam_graph(n=2) -> fx.GraphModule:
    """Adam's shape over ``n`` parameters: CPU step counters bumped, bias corrections
    from them, a tensor lr. Inputs: params, grads, moments (device), counters, lr (CPU);
    outputs: new params, new moments, new counters."""
    g = fx.Graph()
    cf = g.call_function
    ps, gs, ms, ss = ([g.placeholder(f"{k}{i}") for i in range(n)] for k in "pgms")
    lr = g.placeholder("lr")

    def items(node):
        return [cf(operator.getitem, (node, i)) for i in range(n)]
    st = items(cf(aten._foreach_add.Scalar, (ss, 1)))
    m = items(cf(aten._foreach_add.List, (items(cf(aten._foreach_mul.Scalar, (ms, 0.9))), gs),
                 {"alpha": 0.1}))
    bc = items(cf(aten._foreach_sub.Scalar, (items(cf(aten._foreach_pow.ScalarAndTensor,
                                                      (0.9, st))), 1)))
    r = items(cf(aten._foreach_div.List, (m, bc)))
    q = items(cf(aten._foreach_mul.Tensor, (r, lr)))
    new = items(cf(aten._foreach_add.List, (ps, q)))
    g.output(tuple(new + m + st))
    return fx.GraphModule(torch.nn.Module(), g)


def shapes(n=2):
    return [[(4, 5), (7,)][i % 2] for i in range(n)] * 3


def stand_in_inputs(n=2):
    return [torch.empty(*s, device="meta") for s in shapes(n)] + \
        [torch.tensor(2.0 + i) for i in range(n)] + [torch.tensor(0.1)]


def real_inputs(seed, steps=(2.0, 3.0), lr=0.1, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(device) for s in shapes(len(steps))] + \
        [torch.tensor(float(s)) for s in steps] + [torch.tensor(lr)]


def runtime(n=2, kernels=None, gm=None, inputs=None):
    """(graph module, Runtime on the stand-in device) of ``adam_graph(n)`` or ``gm``
    on ``inputs``: ``kernels`` None gives kernels that do nothing (what the split
    needs), else the loaded Triton kernels."""
    from kiln.kernels import compile as kc
    from kiln.kernels.runtime.runner import Runtime
    if gm is None:
        gm, inputs = adam_graph(n), stand_in_inputs(n)
    p = kc.plan(gm, inputs, "triton")
    if kernels is None:
        kernels = [_nothing(params) for _, params in p.entries]
    else:                          # run by the interpreter on CPU stand-ins: the size
        from kiln.kernels.codegen.triton import launcher       # arguments there too
        kernels = launcher.load(p.source, p.entries, p.kinfo, p.size_args, torch.device("cpu"))
    return gm, Runtime(p.lowered, p.sched, kc._steps(p, kernels, "triton"), p.lowered.device)


def _nothing(params):
    def kernel(rt, tensors):
        pass
    kernel.params = params
    return kernel


def interpreted():
    """The split graph run for real, call after call: the prologue on the CPU, the
    rest (Triton under the interpreter, CPU tensors standing in for the device's)
    reading the counters from the static buffer; each call against eager."""
    from kiln.kernels.runtime import host_prologue
    _, plan = host_prologue.first_call(runtime()[1], stand_in_inputs())   # the same steps
    gm, rt = runtime(kernels=True)
    assert isinstance(plan, host_prologue.HostPlan), plan
    rt.device = torch.device("cpu")
    host = host_prologue.HostPrologue(rt, plan, device="cpu")
    addresses = {n: v.data_ptr() for n, v in host.views.items()}
    for call, steps in enumerate([(2.0, 3.0), (3.0, 4.0), (10.0, 1.0)]):
        args = real_inputs(call, steps, lr=0.1 * (call + 1))
        versions = [a._version for a in args]
        got = host.run(rt, args)
        flat = host.strip(host.device_rt.run_flat(host.device_tensors(rt, args, got)))
        for i, t in got.outputs.items():
            flat[i] = t
        want = gm(*args)
        assert len(flat) == len(want)
        for a, b in zip(flat, want):
            assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        assert [a._version for a in args] == versions       # the graph is functional
        assert {n: v.data_ptr() for n, v in host.views.items()} == addresses
        assert host.views[plan.copies[0].name].tolist() == [steps[0] + 1, steps[1] + 1]


def _tensor_scalars(x0, x1, x2, a0, a1, a2, b0, b1, b2, s):
    xs, as_, bs = [x0, x1, x2], [a0, a1, a2], [b0, b1, b2]
    d = aten._foreach_addcdiv.Tensor(xs, as_, bs, s)
    m = aten._foreach_addcmul.Tensor(xs, as_, bs, s)
    return d[0], d[1], d[2], m[0], m[1], m[2]


def _tensor_scalars_inputs(seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4), (7,), ()]
    ts = [torch.randn(s, generator=g) for s in shapes * 2]
    ts += [torch.rand(s, generator=g) + 0.5 for s in shapes]
    return [t.to(device) for t in ts] + [torch.randn(3, generator=g) * (seed + 1)]


def step_sizes_graph(returned):
    """A non-capturable Adam's tail: step sizes from CPU counters, stacked, read as
    ``_foreach_addcdiv.Tensor``'s scalars (and also returned, if ``returned``)."""
    g = fx.Graph()
    xs, as_, bs, steps = ([g.placeholder(f"{k}{i}") for i in range(3)] for k in "xabs")
    cf = g.call_function
    sizes = [cf(aten.mul.Tensor, (cf(aten.reciprocal.default, (cf(aten.sub.Tensor, (
        cf(aten.pow.Scalar, (0.9, s)), 1)),)), -0.01)) for s in steps]
    stacked = cf(aten.cat.default, ([cf(aten.unsqueeze.default, (v, 0)) for v in sizes],))
    new = cf(aten._foreach_addcdiv.Tensor, (xs, as_, bs, stacked))
    g.output(tuple(cf(operator.getitem, (new, i)) for i in range(3))
             + ((stacked,) if returned else ()))
    return fx.GraphModule(torch.nn.Module(), g)


def step_sizes_inputs(seed, device="cpu"):
    ts = _tensor_scalars_inputs(seed, device)[:-1]
    return ts + [torch.tensor(float(seed + k + 1)) for k in range(3)]


def interpreted_tensor_scalars():
    """``_foreach_addcdiv/addcmul.Tensor`` with CPU ``scalars`` (a value per tensor) in a
    graph on the stand-in device: the prologue stages the three values, the kernels
    (interpreted) read value i for tensor i from the static buffer; each call against
    eager. The interpreter computes CUDA's formula ``x + s * (a / b)`` unfused, eager's
    CPU kernel ``x + (s * a) / b``: they may differ by an ulp of the product. Then the
    stacked step sizes of a non-capturable Adam, made on the host and copied whole
    (also an output) or computed by the kernels (read only as scalars)."""
    import torch.fx as fx
    gm = fx.symbolic_trace(_tensor_scalars)
    plan = _interpret(gm, _tensor_scalars_inputs)
    assert [(c.n, c.scalars) for c in plan.copies] == [(3, False)], plan.copies
    for returned in (True, False):
        plan = _interpret(step_sizes_graph(returned), step_sizes_inputs)
        assert [c.n for c in plan.copies if not c.scalars] == ([3] if returned else [])


def _interpret(gm, make):
    from kiln.kernels.runtime import host_prologue
    stand_in = make(0, "meta")
    _, plan = host_prologue.first_call(runtime(gm=gm, inputs=stand_in)[1], stand_in)
    assert isinstance(plan, host_prologue.HostPlan), plan
    _, rt = runtime(gm=gm, inputs=stand_in, kernels=True)
    assert not [b for b in rt.buffers.values() if "_foreach_" in str(getattr(b, "op", ""))]
    rt.device = torch.device("cpu")
    host = host_prologue.HostPrologue(rt, plan, device="cpu")
    for call in range(3):
        args = make(call + 1)
        got = host.run(rt, args)
        flat = host.strip(host.device_rt.run_flat(host.device_tensors(rt, args, got)))
        for i, t in got.outputs.items():
            flat[i] = t
        for a, b in zip(flat, gm(*args), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=2e-7, atol=1e-7)
    return plan


class FakeGraph:
    """A CUDA graph on the CPU: capture keeps the steps' runtime and tensors dict (the
    same tensor objects: addresses) and the memory its allocations got; a replay runs
    the same steps on those tensors again, its allocations given the same memory.
    Like a real replay it reads what those addresses hold now, and nothing the Python
    code around it computes (a stale host value would show)."""
    capturing = None
    replaying = None

    def __init__(self):
        self.tape, self.allocs = None, []

    def replay(self):
        rt, tensors = self.tape
        FakeGraph.replaying = iter(self.allocs)
        try:
            rt.run_flat(dict(tensors))
        finally:
            FakeGraph.replaying = None


def _emulate_cuda_graphs():
    """Patch the CUDA calls GraphReplay makes with ``FakeGraph`` (a child process's
    patches: nothing is undone)."""
    import contextlib
    from kiln.kernels.runtime import graph_replay, host_prologue
    from kiln.kernels.runtime.runner import Runtime

    @contextlib.contextmanager
    def graph(g, pool=None):
        FakeGraph.capturing = g
        try:
            yield
        finally:
            FakeGraph.capturing = None
    torch.cuda.CUDAGraph, torch.cuda.graph = FakeGraph, graph
    torch.cuda.synchronize = lambda *a: None
    torch.cuda.MemPool, torch.cuda.graph_pool_handle = None, lambda: 0
    torch.cuda.current_device = lambda: 0
    run_flat, alloc = Runtime.run_flat, Runtime._alloc

    def run_flat_(self, tensors):
        if FakeGraph.capturing is not None:
            FakeGraph.capturing.tape = (self, dict(tensors))
        return run_flat(self, tensors)

    def alloc_(self, tensors, todo):
        if FakeGraph.replaying is not None:
            for _, members in todo:
                t = next(FakeGraph.replaying)
                for name in members:
                    tensors[name] = t
            return
        alloc(self, tensors, todo)
        if FakeGraph.capturing is not None:
            FakeGraph.capturing.allocs += [tensors[members[0]] for _, members in todo]
    Runtime.run_flat, Runtime._alloc = run_flat_, alloc_
    # the stand-in device is the CPU: its tensors of more than one element are the
    # "GPU" ones when the split is decided (the graph's CPU values are 0-d)
    host_prologue._describe = lambda t: None if not isinstance(t, torch.Tensor) else \
        ("cpu" if t.dim() == 0 else "cuda", t.numel(), t.dtype)
    plan_of = host_prologue.plan_of

    def plan_of_(rt, seen):
        dev, rt.device = rt.device, torch.device("cuda")
        try:
            return plan_of(rt, seen)
        finally:
            rt.device = dev
    host_prologue.plan_of = plan_of_
    graph_replay._POOLS.clear()
    return graph_replay


def replayed():
    """GraphReplay over the emulated CUDA graph, call after call against eager: the
    parameters and moments stay where they are (their values change in place, as an
    optimizer's do), the counters and lr change every call (new tensors, too)."""
    graph_replay = _emulate_cuda_graphs()
    from kiln.kernels.runtime.runner import Runtime
    from kiln.kernels.runtime.host_prologue import is_host_copy
    gm, rt = runtime(6, kernels=True)
    rt.device = torch.device("cpu")
    for step in rt.steps:
        if is_host_copy(step):           # the plain first call's copies, to the stand-in
            step.b.op.device = "cpu"
    g = graph_replay.GraphReplay(rt)
    device = real_inputs(0, [0.0] * 6)[:18]
    counters = [torch.tensor(float(i)) for i in range(6)]
    for call in range(7):
        for t in device:
            t.copy_(torch.randn(t.shape))
        if call == 4:
            counters = [c.clone() for c in counters]          # new CPU tensors
        for i, c in enumerate(counters):
            c.fill_(float(call * 3 + i))
        args = device + counters + [torch.tensor(0.1 + call)]
        got, want = g(rt, args), gm(*args)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        del got, a, b
    assert Runtime.run_flat.__name__ == "run_flat_"          # the emulation ran
    assert g.reason is None and g.host is not None, g.reason
    assert g.records == 1 and g.replays == 5, (g.records, g.replays)


def optimizer_graph(name="adamw", as_on_gpu=True, which=-1):
    """The aten graph kiln captures for a foreach optimizer step (``OPTIMIZERS[name]``)
    over a small net's parameters (after the first step, which made the state), with
    the example inputs as a GPU graph would take them: the step counters (0-d) on the
    CPU, the rest on the stand-in device. (Captured on the CPU, run by PyTorch: no
    kernel is built.) ``as_on_gpu``: the trace sees the param groups as a trace of CUDA
    parameters does on the first step (no state yet: ``capturable=False``, eager's
    default, so Adam stacks its step sizes on the CPU); else as on the CPU, where the
    capturable path keeps eager's state layout and is taken. ``which``: which step's graph
    (0: the first, which makes the state: its counters are CPU constants, its only 0-d
    input the loss, on the device; -1: a later one, the counters its CPU inputs)."""
    import kiln
    import kiln.capture.optimizers as capture_optimizers
    import kiln.kernels.backend as kernel_backend
    from kiln.kernels.runtime.perf_fallback import EagerVariant
    try:
        from .foreach_train_case import OPTIMIZERS, Net, _options, train_step
    except ImportError:                # (run as a script)
        from foreach_train_case import OPTIMIZERS, Net, _options, train_step
    graphs = []

    def keep(gm, example_inputs, *a, **kw):
        graphs.append((gm, list(example_inputs)))
        return EagerVariant(gm)
    cls, kw = OPTIMIZERS[name]
    torch.manual_seed(0)
    m = Net()
    opt = cls(m.parameters(), **_options(kw, "cpu"))
    inner, kernel_backend.compile_aten_graph = kernel_backend.compile_aten_graph, keep
    see = capture_optimizers._see_capturable
    if as_on_gpu:
        capture_optimizers._see_capturable = lambda tx, opt: []
    try:
        step = kiln.compile(train_step, backend="kiln")
        for _ in range(2):
            step(m, opt, torch.randn(6, 4), torch.randn(6, 3))
    finally:
        kernel_backend.compile_aten_graph = inner
        capture_optimizers._see_capturable = see
    gm, example = [(gm, ex) for gm, ex in graphs
                   if any("_foreach_" in str(n.target) for n in gm.graph.nodes)][which]
    used = [bool(n.users) for n in gm.graph.nodes if n.op == "placeholder"]
    stand_in = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
                if t.dim() or not u else torch.zeros((), dtype=t.dtype)
                for t, u in zip(example, used)]
    return gm, stand_in


def adamw_graph():
    """AdamW's graph as the capturable path traces it (see ``optimizer_graph``)."""
    return optimizer_graph("adamw", as_on_gpu=False)


def gpu_labels(gm, stand_in) -> dict:
    """The devices a GPU run's first call notes for ``gm``'s buffers: the graph run on
    the stand-in (kernels that do nothing, host ops on real CPU tensors), buffer name
    -> (device type, numel, dtype), "cuda" for the stand-in's."""
    _, rt = runtime(gm=gm, inputs=stand_in)
    tensors = _Labels(rt.take_inputs(stand_in))
    rt.run_flat(tensors)
    return tensors.seen


def _label(t):
    if not isinstance(t, torch.Tensor):
        return None
    return ("cuda" if t.device.type == "meta" else t.device.type, t.numel(), t.dtype)


class _Labels(dict):
    """``host_prologue._Seen`` with the stand-in's labels (not its ``_describe``,
    which the emulation patches)."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.seen = {k: _label(v) for k, v in tensors.items()}

    def __setitem__(self, name, value):
        self.seen[name] = _label(value)
        super().__setitem__(name, value)


def replayed_optimizer(name):
    """An optimizer's own graph, as a GPU trace captures it, through GraphReplay over
    the emulated CUDA graph (after ``replayed``, whose patches stay), its split decided
    with the device labels of a GPU run (``gpu_labels``: the CPU stand-in cannot tell
    its "device" tensors from CPU ones): one recording, five replays, each equal to
    eager (parameters, moments, step counters)."""
    from kiln.kernels.runtime import graph_replay, host_prologue
    from kiln.kernels.runtime.host_prologue import is_host_copy
    gm, stand_in = optimizer_graph(name)
    labels = gpu_labels(gm, stand_in)
    _, rt = runtime(gm=gm, inputs=stand_in, kernels=True)
    rt.device = torch.device("cpu")
    for step in rt.steps:
        if is_host_copy(step):
            step.b.op.device = "cpu"
    decide = host_prologue.plan_of
    host_prologue.plan_of = lambda rt, seen: decide(rt, labels)
    try:
        g = graph_replay.GraphReplay(rt)
        gen = torch.Generator().manual_seed(0)
        # the same tensors every call, as an optimizer's state (counters bumped in place)
        args = [torch.randn(t.shape, generator=gen).abs() if t.dim() else torch.tensor(0.0)
                for t in stand_in]
        for call in range(7):
            for k, a in enumerate(args):
                if a.dim() == 0:
                    a.fill_(float(call + k + 1))
            got, want = g(rt, args), gm(*args)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            del got, a, b                # (one still held is copied out: a new recording)
    finally:
        host_prologue.plan_of = decide
    assert g.reason is None, g.reason
    # host values: Adam's step counters, a CPU tensor lr
    assert (g.host is not None) == (name.startswith("adam") or name == "sgd_tensor_lr"), name
    if g.host is not None:     # on the host: the counters' add; the rest in the kernels
        assert host_steps(rt, g.host.plan) == (
            ["aten._foreach_add.Scalar"] if name.startswith("adam") else []), g.host.plan
    assert g.records == 1 and g.replays == 5, (g.records, g.replays)


def host_steps(rt, plan) -> list:
    return [str(rt.steps[k].b.op) for k in plan.host_steps]


def replayed_adamw():
    """AdamW's graph as the capturable path traces it, decided by the dimension
    labels ``replayed`` patches in (its counters are its only CPU values)."""
    from kiln.kernels.runtime import graph_replay
    from kiln.kernels.runtime.host_prologue import is_host_copy
    gm, stand_in = adamw_graph()
    _, rt = runtime(gm=gm, inputs=stand_in, kernels=True)
    rt.device = torch.device("cpu")
    for step in rt.steps:
        if is_host_copy(step):
            step.b.op.device = "cpu"
    g = graph_replay.GraphReplay(rt)
    gen = torch.Generator().manual_seed(0)
    state = [torch.randn(t.shape, generator=gen).abs() if t.dim() else None for t in stand_in]
    for call in range(7):
        args = [s if s is not None else torch.tensor(float(call + k))
                for k, s in enumerate(state)]
        got, want = g(rt, args), gm(*args)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        del got, a, b                    # (one still held is copied out: a new recording)
    assert g.reason is None and g.host is not None, g.reason
    assert g.records == 1 and g.replays == 5, (g.records, g.replays)


#: the optimizers whose GPU-traced graphs ``replayed_optimizer`` checks
REPLAYED = ("adamw", "adam", "adam_amsgrad_wd", "adamw_amsgrad_maximize", "sgd_momentum",
            "sgd_tensor_lr")


if __name__ == "__main__":
    interpreted()
    interpreted_tensor_scalars()
    replayed()
    replayed_adamw()
    for name in sys.argv[1:] or REPLAYED:
        replayed_optimizer(name)
    print("ok")
    sys.exit(0)
