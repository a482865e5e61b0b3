"""A whole training step on a GPU, compiled with the kiln backend, against eager: the
optimizer's graph, which reads its step counters on the CPU (eager's layout), is
replayed from a recorded CUDA graph through its host prologue
(kiln/kernels/runtime/host_prologue.py). Skipped without CUDA."""
import copy

import pytest
import torch

import kiln
from kiln import config

from .foreach_train_case import OPTIMIZERS, Net, Recorder, _options, assert_same_state, train_step

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
STEPS = 5


def _optimizer_runtimes(recorder):
    """The Runtimes of the aten graphs holding the optimizer's ``_foreach_*`` ops."""
    out = []
    for gm, c in recorder.optimizer_graphs():
        out += [rt for rt in c.variants.values() if hasattr(rt, "graphs")]
    return out


@needs_cuda
@pytest.mark.parametrize("name", ["adamw", "adam", "adam_amsgrad_wd", "sgd_momentum"])
def test_the_optimizer_graph_is_replayed_and_matches_eager(name, monkeypatch):
    import kiln.kernels.backend as kernel_backend
    # "1": this small net's optimizer graph is a handful of launches (same-shaped
    # parameters share a kernel), under the size "auto" replays from
    monkeypatch.setattr(config, "cudagraphs", "1")
    monkeypatch.setattr(config, "perf_fallback", False)     # kiln's graphs every call
    cls, kw = OPTIMIZERS[name]
    torch.manual_seed(0)
    m1 = Net().cuda()
    m2 = copy.deepcopy(m1)
    o1, o2 = cls(m1.parameters(), **_options(kw, "cuda")), cls(m2.parameters(), **_options(kw, "cuda"))
    rec = Recorder()
    rec.inner = kernel_backend.compile_aten_graph
    monkeypatch.setattr(kernel_backend, "compile_aten_graph", rec)
    compiled = kiln.compile(train_step, backend="kiln")
    torch.manual_seed(1)
    versions = []
    for _ in range(STEPS):
        x, y = torch.randn(6, 4, device="cuda"), torch.randn(6, 3, device="cuda")
        torch.testing.assert_close(compiled(m1, o1, x, y), train_step(m2, o2, x, y),
                                   rtol=1e-5, atol=1e-6)
        versions.append([(o1.state[p]["step"]._version, o2.state[q]["step"]._version)
                         for p, q in zip(m1.parameters(), m2.parameters())
                         if "step" in o1.state.get(p, {})])
    torch.cuda.synchronize()
    assert_same_state(m1, o1, m2, o2)            # exp_avg, exp_avg_sq, step (CPU, dtype)
    for p in m1.parameters():
        if "step" in o1.state.get(p, {}):
            assert o1.state[p]["step"].device.type == "cpu"
    # each call bumps a step counter's version once, as eager's in-place add does
    for a, b in zip(versions[1:], versions[2:]):
        assert [x2 - x1 for (x1, _), (x2, _) in zip(a, b)] == \
            [y2 - y1 for (_, y1), (_, y2) in zip(a, b)]
    # the graph of steps 2.. (the first step's, which made the state, ran once)
    rts = [rt for rt in _optimizer_runtimes(rec) if rt.graphs is not None and rt.graphs.calls > 1]
    assert rts, "no optimizer graph replays (plain calls, or none compiled)"
    for rt in rts:
        g = rt.graphs
        assert g.reason is None and g.replays >= 1, (g.calls, g.records, g.reason)
        # SGD keeps no step counter: no host values, no prologue
        assert (g.host is not None) == (name != "sgd_momentum")
        if g.host is not None:
            # the host bumps the counters; the kernels compute the bias corrections and
            # step sizes (a non-capturable Adam's stack of them is never made)
            ops = [str(rt.steps[k].b.op) for k in g.host.plan.host_steps]
            assert ops == ["aten._foreach_add.Scalar"], ops


@needs_cuda
def test_a_graph_reading_a_cpu_tensor_of_more_elements_stays_off_replay(monkeypatch):
    """CPU tensors of at most HOST_VALUES_MAX elements are read through the prologue:
    a larger one keeps plain calls, with the reason."""
    import torch.fx as fx
    from kiln.kernels import compile_aten_graph
    monkeypatch.setattr(config, "cudagraphs", "1")
    monkeypatch.setattr(config, "perf_fallback", False)
    aten = torch.ops.aten

    def f(x, c):
        y = aten.add.Tensor(aten.mul.Tensor(x, 2.0), 1.0)
        return (aten.sum.default(c), y)
    gm = fx.symbolic_trace(f)
    from kiln.kernels.lowering.host_scalars import HOST_VALUES_MAX
    x, c = torch.randn(8, device="cuda"), torch.randn(HOST_VALUES_MAX + 1)
    g = compile_aten_graph(gm, [x, c])
    for _ in range(3):
        got, want = g(x, c), gm(x, c)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
    rt = next(iter(g.variants.values()))
    assert rt.graphs is not None and rt.graphs.disabled and rt.graphs.replays == 0
    assert "not on the GPU" in rt.graphs.reason


@needs_cuda
def test_a_graph_of_step_counters_replays_with_each_calls_values(monkeypatch):
    """An aten graph like Adam's: counters on the CPU, bumped by the graph, read by its
    kernels; replayed calls see their own counters, never the recording call's."""
    from kiln.kernels import compile_aten_graph
    from .host_prologue_cases import adam_graph, real_inputs
    monkeypatch.setattr(config, "cudagraphs", "auto")
    monkeypatch.setattr(config, "perf_fallback", False)
    gm = adam_graph(6)

    # parameters and moments stay where they are (new values in place, as an
    # optimizer's); the counters and lr are new CPU tensors every call
    device = real_inputs(0, [0.0] * 6, device="cuda")[:18]
    c = compile_aten_graph(gm, real_inputs(0, [0.0] * 6, device="cuda"))
    for k in range(6):
        new = real_inputs(k, [float(k + i) for i in range(6)], 0.1 + k)
        for d, n in zip(device, new):
            d.copy_(n)
        args = device + new[18:]
        got, want = c(*args), gm(*args)
        for a, b in zip(got, want):
            assert a.device == b.device and a.dtype == b.dtype
            torch.testing.assert_close(a, b)
        del got, a, b                    # (outputs still held would be copied out)
    rt = next(iter(c.variants.values()))
    assert rt.graphs is not None and rt.graphs.host is not None, getattr(rt.graphs, "reason", None)
    assert rt.graphs.reason is None and (rt.graphs.records, rt.graphs.replays) == (1, 4)


@needs_cuda
def test_foreach_tensor_scalars_on_the_cpu_replay_with_each_calls_values(monkeypatch):
    """``_foreach_addcdiv/addcmul.Tensor`` on CUDA tensors with CPU ``scalars`` (a
    non-capturable Adam's step sizes): the kernels read value i from the static buffer,
    as eager's functor does ``x + s * (a / b)`` / ``x + s * (a * b)`` in float32 (the
    same ops; at most an ulp apart where the compilers contract differently); the graph
    is replayed, each call with its own values."""
    from kiln.kernels import compile_aten_graph
    from .host_prologue_cases import _tensor_scalars, _tensor_scalars_inputs
    import torch.fx as fx
    monkeypatch.setattr(config, "cudagraphs", "1")
    monkeypatch.setattr(config, "perf_fallback", False)
    gm = fx.symbolic_trace(_tensor_scalars)
    fixed = _tensor_scalars_inputs(0, "cuda")[:-1]
    c = compile_aten_graph(gm, _tensor_scalars_inputs(0, "cuda"))
    for k in range(5):
        args = fixed + [torch.randn(3) * (k + 1)]
        got, want = c(*args), gm(*args)
        for a, b in zip(got, want):
            assert a.device == b.device and a.dtype == b.dtype
            torch.testing.assert_close(a, b, rtol=2.0 ** -23, atol=1e-30)
        del got, a, b
    rt = next(iter(c.variants.values()))
    assert rt.graphs is not None and rt.graphs.host is not None, getattr(rt.graphs, "reason", None)
    assert rt.graphs.reason is None and rt.graphs.replays >= 3
