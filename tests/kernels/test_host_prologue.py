"""The host prologue of a replayed GPU graph that reads CPU step counters
(kiln/kernels/runtime/host_prologue.py), checked on the CPU: which steps go to the
prologue, what the static buffer holds and in which order, the prologue's effects on
real CPU tensors, the staging buffers' turns, and which graphs it declines. The whole
step on a GPU, replayed, is test_host_prologue_gpu.py."""
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from kiln import config
from kiln.kernels.runtime import graph_replay, host_prologue
from kiln.kernels.lowering.host_scalars import HOST_VALUES_MAX
from kiln.kernels.runtime.host_prologue import HostPlan, HostPrologue

from .host_prologue_cases import real_inputs, runtime, stand_in_inputs

aten = torch.ops.aten
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def _plan(rt, inputs=None):
    _, plan = host_prologue.first_call(rt, inputs or stand_in_inputs())
    return plan


def _op_names(rt, indices):
    return [str(rt.steps[k].b.op) for k in indices]


def test_the_split_of_an_adam_like_graph():
    _, rt = runtime()
    assert host_prologue.wanted(rt, stand_in_inputs())
    plan = _plan(rt)
    assert isinstance(plan, HostPlan), plan
    # the step counters and the tensor lr are the prologue's inputs
    assert [rt.inputs[i][1] for i in plan.host_inputs] == ["in6", "in7", "in8"]
    # step + 1 runs on the host; nothing else does
    assert _op_names(rt, plan.host_steps) == ["aten._foreach_add.Scalar"]
    # the static buffer: the new counters (read by the bias corrections), then lr, each
    # at a 16-byte aligned offset, in step order
    assert [(c.n, c.dtype, c.offset, c.scalars) for c in plan.copies] == [
        (2, torch.float32, 0, True), (1, torch.float32, 16, True)]
    assert plan.nbytes == 32
    assert [rt.steps[c.step].b.name for c in plan.copies] == [c.name for c in plan.copies]
    # the new counters are the graph's outputs 4 and 5, made by the prologue
    assert plan.host_outputs == [4, 5]
    # the recorded graph's steps: the prologue's are done already
    host = HostPrologue(rt, plan, device="cpu")
    done = [k for k, s in enumerate(host.device_rt.steps) if isinstance(s, host_prologue._Done)]
    assert done == plan.host_steps + [c.step for c in plan.copies]
    assert host.device_rt.steps[-1] is rt.steps[-1] and rt.steps[0] is not host.device_rt.steps[0]
    assert "static buffer of 32 bytes" in host_prologue.describe(plan, rt)


def test_the_prologue_computes_this_calls_values_and_leaves_its_inputs_alone():
    """The new counters come out as eager's ``step + 1`` (dtype, value), the inputs are
    not written (the caller copies outputs into mutated inputs, as for any graph), and
    the static buffer, at the same address every call, holds this call's values."""
    _, rt = runtime()
    host = HostPrologue(rt, _plan(rt), device="cpu")
    counters, lrs = (c.name for c in host.plan.copies)
    ptr = host.static.data_ptr()
    for call, (s1, s2, lr) in enumerate([(2.0, 3.0, 0.1), (7.0, 1.0, 0.5), (0.0, 0.0, 2.0)]):
        args = real_inputs(call, (s1, s2), lr)
        versions = [a._version for a in args]
        got = host.run(rt, args)
        assert [a._version for a in args] == versions
        assert set(got.outputs) == {4, 5}
        for i, want in zip((4, 5), (s1 + 1, s2 + 1)):
            t = got.outputs[i]
            assert t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == ()
            assert t.item() == want
        assert host.views[counters].tolist() == [s1 + 1, s2 + 1]
        assert host.views[lrs].tolist() == [pytest.approx(lr)]
        assert host.static.data_ptr() == ptr
        # the recorded graph reads the static views, not the host copies' own results
        tensors = host.device_tensors(rt, args, got)
        assert tensors[counters] is host.views[counters] and tensors["in0"] is args[0]


def test_a_recordings_outputs_leave_out_the_prologues():
    _, rt = runtime()
    host = HostPrologue(rt, _plan(rt), device="cpu")
    assert host.strip(list(range(6))) == [0, 1, 2, 3, None, None]
    # an output on the static buffer's memory fails the recording (replay goes off)
    with pytest.raises(RuntimeError, match="static buffer"):
        host.strip([0, 1, 2, host.views[host.plan.copies[0].name][1:], 4, 5])
    ptrs = host.pointers(rt, real_inputs(0))
    assert ptrs[6:] == [0, 0, 0] and all(ptrs[:6])


class FakeEvent:
    """A CUDA event whose copy completes when the test says so."""
    log = []

    def __init__(self):
        self.done = True

    def record(self, stream=None):
        assert stream is None               # (a CPU stand-in: no stream)
        self.done = False
        FakeEvent.log.append(("record", id(self)))

    def query(self):
        return self.done

    def synchronize(self):
        FakeEvent.log.append(("wait", id(self)))
        self.done = True


def test_a_staging_buffer_is_not_rewritten_while_its_copy_may_be_in_flight():
    _, rt = runtime()
    FakeEvent.log = []
    host = HostPrologue(rt, _plan(rt), device="cpu", event=FakeEvent)
    a, b = host.staging
    assert a.buf.data_ptr() != b.buf.data_ptr()
    host.run(rt, real_inputs(0))             # stages in a, records a's event
    host.run(rt, real_inputs(1))             # b: a's copy may still be running
    assert host.waits == 0 and [e for e, _ in FakeEvent.log] == ["record", "record"]
    b.event.done = True                      # b's copy is done, a's is not
    host.run(rt, real_inputs(2))             # back to a: waits for a's copy first
    assert host.waits == 1
    assert FakeEvent.log[2:] == [("wait", id(a.event)), ("record", id(a.event))]
    host.run(rt, real_inputs(3))             # b again: its copy was done, no wait
    assert host.waits == 1
    assert FakeEvent.log[4:] == [("record", id(b.event))]


def test_one_staging_buffer_waits_for_its_previous_copy_every_call():
    _, rt = runtime()
    FakeEvent.log = []
    host = HostPrologue(rt, _plan(rt), device="cpu", event=FakeEvent, staging=1)
    for k in range(3):
        host.run(rt, real_inputs(k))
    assert host.waits == 2


def _seen(rt, **changes):
    """What a first call on the stand-in notes, with some buffers changed."""
    tensors = host_prologue._Seen(rt.take_inputs(stand_in_inputs()))
    rt.run_flat(tensors)
    seen = dict(tensors.seen)
    seen.update(changes)
    return seen


def test_graphs_it_declines_keep_their_reason():
    _, rt = runtime()
    assert isinstance(host_prologue.plan_of(rt, _seen(rt)), HostPlan)
    # a CPU input of more elements than the static buffer takes
    big = ("cpu", HOST_VALUES_MAX + 1, torch.float32)
    why = host_prologue.plan_of(rt, _seen(rt, in7=big))
    assert isinstance(why, str) and "not on the GPU" in why
    # a host step making one
    why = host_prologue.plan_of(rt, _seen(rt, buf1=big))
    assert isinstance(why, str) and "reads a CPU tensor directly" in why
    # an input on a third device
    assert isinstance(host_prologue.plan_of(rt, _seen(rt, in0=("xla", 20, torch.float32))), str)
    # a library call on the CPU counters giving a device value
    why = host_prologue.plan_of(rt, _seen(rt, buf1=("meta", 1, torch.float32)))
    assert isinstance(why, str) and "reads a CPU tensor directly" in why
    # the counters on the device, the host copy of their new values would read the GPU
    dev = ("meta", 1, torch.float32)
    why = host_prologue.plan_of(rt, _seen(rt, in6=dev, in7=dev, buf1=dev, buf2=dev))
    assert isinstance(why, str) and "host copy reads a value made on the GPU" in why
    # a CPU value made from device values
    why = host_prologue.plan_of(rt, _seen(rt, in6=dev, in7=dev))
    assert isinstance(why, str) and "CPU value is made from GPU values" in why
    # a host copy whose values are not of its dtype
    why = host_prologue.plan_of(rt, _seen(rt, in8=("cpu", 1, torch.float64)))
    assert isinstance(why, str) and "host copy" in why


def test_a_graph_output_that_is_a_host_copy_is_declined():
    _, rt = runtime()
    seen = _seen(rt)
    name = _plan(rt).copies[0].name
    rt.out_plan = list(rt.out_plan) + [("buf", name)]
    why = host_prologue.plan_of(rt, seen)
    assert isinstance(why, str) and "host value's copy" in why


def _reads_cpu_directly(a, s):
    return (aten.add.Tensor(a, s),)


def test_a_gpu_step_reading_a_cpu_tensor_itself_is_declined():
    """A device library call taking a CPU tensor (here a kernel the stand-in lowering
    leaves to aten: a CPU scalar it reads as an argument) would be replayed with the
    recording call's value."""
    import torch.fx as fx
    from kiln.kernels import compile as kc
    from kiln.kernels import ir
    from kiln.kernels.runtime.runner import ExternStep, Runtime
    gm = fx.symbolic_trace(_reads_cpu_directly)
    inputs = [torch.empty(3, device="meta"), torch.tensor(2.0)]
    p = kc.plan(gm, inputs, "triton")
    # a device extern reading the CPU input by hand: the graph the rule guards against
    ext = ir.Extern("bufX", (3,), (1,), torch.float32, op=aten.add.Tensor,
                    args=(ir.ExternArg("in0", (3,), (1,), 0), ir.ExternArg("in1", (), (), 0)))
    rt = Runtime(p.lowered, p.sched, [], p.lowered.device)
    rt.steps = [ExternStep(ext, {"bufX": ext})]
    seen = {"in0": ("meta", 3, torch.float32), "in1": ("cpu", 1, torch.float32),
            "bufX": ("meta", 3, torch.float32)}
    why = host_prologue.plan_of(rt, seen)
    assert isinstance(why, str) and "reads a CPU tensor directly" in why


def test_a_graph_without_host_values_is_not_split():
    _, rt = runtime()
    args = stand_in_inputs()[:6] + [torch.empty((), device="meta")] * 3
    rt.steps = [s for s in rt.steps if not host_prologue.is_host_copy(s)]
    assert not host_prologue.wanted(rt, args)


def _replay_of(rt, monkeypatch, mode="auto"):
    """GraphReplay's decision for a stand-in graph as if it were on a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    pool = SimpleNamespace(retire=lambda owner: None)       # no CUDA memory pool here
    monkeypatch.setattr(graph_replay, "_pool", lambda device: pool)
    monkeypatch.setattr(config, "cudagraphs", mode)
    device, rt.device = rt.device, torch.device("cuda")
    try:
        return graph_replay.GraphReplay.maybe(rt)
    finally:
        rt.device = device


def test_a_graph_with_cpu_step_counters_is_replayable(monkeypatch):
    """Adam's graph over six parameters: four steps (the counters' add, two host copies,
    one run of Triton kernels) but a launch a kernel; its host copies no longer keep it
    off replay, and its first call sets up the prologue."""
    _, rt = runtime(6)
    assert len(rt.steps) < graph_replay.GRAPH_MIN_STEPS <= len(rt.sched.groups)
    g = _replay_of(rt, monkeypatch)
    assert g is not None
    g(rt, stand_in_inputs(6))                 # the first call: run, split
    assert not g.disabled and g.reason is None and g.calls == 1
    assert isinstance(g.host, HostPrologue)
    assert g.host.plan.host_inputs == list(range(18, 25)) and len(g.host.plan.host_outputs) == 6


def test_a_prologue_that_fails_turns_replay_off_and_the_call_runs_plainly(monkeypatch):
    _, rt = runtime(6)
    g = _replay_of(rt, monkeypatch)
    g(rt, stand_in_inputs(6))

    def fail(rt, args):
        raise TypeError("no")
    monkeypatch.setattr(g.host, "run", fail)
    out = g(rt, stand_in_inputs(6))
    assert g.disabled and g.reason == "host prologue failed: TypeError: no"
    assert [t.item() for t in out[-6:]] == [3.0 + i for i in range(6)]   # step + 1


def _sums_a_cpu_tensor(x, c):
    return (aten.sum.default(c), aten.add.Tensor(aten.mul.Tensor(x, 2.0), 1.0))


def test_a_graph_with_a_cpu_tensor_of_more_elements_is_not(monkeypatch):
    import torch.fx as fx
    inputs = [torch.empty(8, device="meta"), torch.randn(HOST_VALUES_MAX + 1)]
    _, rt = runtime(gm=fx.symbolic_trace(_sums_a_cpu_tensor), inputs=inputs)
    g = _replay_of(rt, monkeypatch, mode="1")
    assert g is not None
    g(rt, inputs)
    assert g.disabled and g.host is None and "not on the GPU" in g.reason


def test_a_small_cpu_tensor_is_reduced_by_the_prologue(monkeypatch):
    """A CPU input of a few elements (at most HOST_VALUES_MAX) is the prologue's: its
    sum, a CPU output, is computed on the host every call."""
    import torch.fx as fx
    inputs = [torch.empty(8, device="meta"), torch.randn(3)]
    _, rt = runtime(gm=fx.symbolic_trace(_sums_a_cpu_tensor), inputs=inputs)
    g = _replay_of(rt, monkeypatch, mode="1")
    out = g(rt, inputs)
    assert not g.disabled and g.reason is None and g.host is not None
    assert g.host.plan.host_outputs == [0] and out[0].item() == pytest.approx(inputs[1].sum().item())


@pytest.mark.slow
def test_the_split_graph_runs_as_eager_call_after_call(tmp_path):
    """The prologue, then the rest's Triton kernels (interpreted) reading the static
    buffer, against eager over calls with new counter values; then GraphReplay itself,
    recording once and replaying an emulated CUDA graph (``FakeGraph``: the same
    tensors, the same memory) with each call's counters, for the Adam-like graph, for
    the graph kiln captures from a foreach AdamW step, and for the graphs a GPU trace
    captures from AdamW, Adam (amsgrad, weight decay, maximize) and SGD with momentum,
    decided with a GPU run's device labels; and foreach ops whose CPU ``scalars`` the
    kernels read from the static buffer."""
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(HERE, "host_prologue_cases.py")],
                       env=env, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd_momentum", "sgd_tensor_lr"])
def test_the_optimizer_graphs_a_gpu_trace_captures_are_replayable(name):
    """The graph kiln captures from a real foreach optimizer step as a trace of CUDA
    parameters does (``capturable=False``: Adam stacks its step sizes, a CPU tensor of a
    value per parameter, for ``_foreach_addcdiv.Tensor``), decided with the devices a
    GPU run notes: a host prologue that only bumps the step counters; the kernels
    compute the bias corrections and step sizes from the counters' copies."""
    from .host_prologue_cases import gpu_labels, host_steps, optimizer_graph
    gm, stand_in = optimizer_graph(name)
    targets = {str(n.target) for n in gm.graph.nodes}
    assert ("aten._foreach_addcdiv.Tensor" in targets) == name.startswith("adam")
    _, rt = runtime(gm=gm, inputs=stand_in)
    rt.device = torch.device("cuda")
    plan = host_prologue.plan_of(rt, gpu_labels(gm, stand_in))
    assert isinstance(plan, HostPlan), plan
    assert host_steps(rt, plan) == (["aten._foreach_add.Scalar"] if name.startswith("adam") else [])
    assert all(c.scalars and c.n == 1 for c in plan.copies), plan.copies
    if name.startswith("adam"):
        # a counter's copy each, staged by one stack into their aligned places
        host = HostPrologue(rt, plan, device="cpu")
        assert len(plan.copies) == 6 and len(host.fills) == 1
        for call in range(2):
            args = [t if t.dim() else torch.tensor(float(call * 10 + k))
                    for k, t in enumerate(stand_in)]
            host.run(rt, args)
            staged = {host.views[c.name].item() for c in plan.copies}
            assert len(staged) == 6             # each counter's new value, once
            assert staged <= {args[pos].item() + 1 for pos, _ in host.inputs}
    # no device step reads host memory itself: only host copies cross over
    host = set(plan.host_names) | {rt.inputs[i][1] for i in plan.host_inputs}
    for k, step in enumerate(rt.steps):
        if k not in plan.host_steps and not host_prologue.is_host_copy(step):
            assert not host_prologue._reads(step) & host, step


@pytest.mark.parametrize("returned", [False, True])
def test_stacked_step_sizes_are_computed_by_the_kernels_or_staged_whole(returned):
    """Read only as ``scalars``, the stack is never made: each parameter's kernel
    computes its own step size from its counter's copy (no host step). Read by the CPU
    too (an output), it is made on the host and its three values copied as one."""
    from .host_prologue_cases import step_sizes_graph, step_sizes_inputs
    inputs = step_sizes_inputs(0, "meta")
    _, rt = runtime(gm=step_sizes_graph(returned), inputs=inputs)
    plan = _plan(rt, inputs)
    assert isinstance(plan, HostPlan), plan
    steps = _op_names(rt, plan.host_steps)
    if returned:
        assert "aten.cat.default" in steps
        assert [c.n for c in plan.copies if not c.scalars] == [3]
    else:
        assert steps == [] and all(c.n == 1 for c in plan.copies), plan
