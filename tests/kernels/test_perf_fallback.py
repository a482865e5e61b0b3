"""The perf fallback (kernels/runtime/perf_fallback.py): a compiled graph slower than its
aten graph run eagerly ends up run eagerly, a faster one stays compiled; every result
equals eager's, during the trial and after; inputs written once per call.

Timings are injected (``perf_fallback.adjust``) so decisions do not depend on the
machine, except in the one real-timing test (marked slow)."""
import gc
import logging
import re
import time

import pytest
import torch
import torch.fx as fx

import kiln
from kiln import config
from kiln.kernels import compile_aten_graph
from kiln.kernels.runtime import graph_replay
from kiln.kernels.runtime import perf_fallback as pf
from kiln.kernels.runtime.runner import Runtime

aten = torch.ops.aten


@pytest.fixture(autouse=True)
def _fallback_on(monkeypatch):
    monkeypatch.setattr(config, "perf_fallback", True)
    monkeypatch.setattr(config, "perf_fallback_rounds", 6)
    monkeypatch.setattr(pf, "adjust", None)


@pytest.fixture
def eager_runs(monkeypatch):
    """Counts calls of the eager variants: aten graphs (plain and boxed) and torch-level
    graphs (the kiln backend's inference calls)."""
    runs = []
    call, boxed = pf.EagerVariant.__call__, pf.EagerVariant.call_boxed
    torch_level = pf.TorchLevelEager.__call__

    def counted(self, *args):
        runs.append(self)
        return call(self, *args)

    def counted_boxed(self, args):
        runs.append(self)
        return boxed(self, args)

    def counted_torch_level(self, *args):
        runs.append(self)
        return torch_level(self, *args)
    monkeypatch.setattr(pf.EagerVariant, "__call__", counted)
    monkeypatch.setattr(pf.EagerVariant, "call_boxed", counted_boxed)
    monkeypatch.setattr(pf.TorchLevelEager, "__call__", counted_torch_level)
    return runs


def timings(monkeypatch, compiled_ms, eager_ms):
    monkeypatch.setattr(pf, "adjust", lambda which, s: (compiled_ms if which == "compiled"
                                                        else eager_ms) / 1e3)


def _graph(x, y):
    return (aten.mul.Tensor(aten.sin.default(x), y), aten.sum.default(x))


def _compiled(*inputs):
    gm = fx.symbolic_trace(_graph)
    return gm, compile_aten_graph(gm, list(inputs), "cpp")


def _check_calls(cg, gm, inputs, n):
    for _ in range(n):
        got, want = cg(*inputs), gm(*inputs)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
            torch.testing.assert_close(g, w)


def test_slower_compiled_graph_ends_up_eager(monkeypatch, eager_runs, caplog):
    timings(monkeypatch, compiled_ms=3.0, eager_ms=2.0)
    x, y = torch.randn(64, 33), torch.randn(33)
    gm, cg = _compiled(x, y)
    with caplog.at_level(logging.INFO, logger="kiln.perf"):
        _check_calls(cg, gm, (x, y), 20)
    (variant,) = cg.variants.values()
    assert isinstance(variant, pf.EagerVariant)
    (choice,) = cg.perf_choices.values()
    assert choice["choice"] == "eager" and choice["samples"] == (6, 6)
    assert choice["compiled_ms"] == pytest.approx(3.0) and choice["eager_ms"] == pytest.approx(2.0)
    # compiled warm-up and two timed calls, then blocks E C E C E of one untimed and
    # two timed calls (decided at call 18), then eager
    assert len(eager_runs) == 3 * 3 + 2
    assert "compiled 3.000 ms, eager 2.000 ms (samples 6/6) -> eager" in caplog.text
    assert "float32[64, 33]@cpu" in caplog.text


def test_faster_compiled_graph_stays_compiled(monkeypatch, eager_runs):
    timings(monkeypatch, compiled_ms=1.5, eager_ms=2.0)
    x, y = torch.randn(64, 33), torch.randn(33)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 20)
    (variant,) = cg.variants.values()
    assert isinstance(variant, Runtime)
    assert len(eager_runs) == 9                 # three blocks of three, none after
    assert next(iter(cg.perf_choices.values()))["choice"] == "compiled"


def test_a_difference_within_the_margin_keeps_the_compiled_graph(monkeypatch):
    timings(monkeypatch, compiled_ms=1.05, eager_ms=1.0)
    x, y = torch.randn(8, 3), torch.randn(3)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 19)
    assert isinstance(next(iter(cg.variants.values())), Runtime)


def test_a_clear_difference_decides_after_two_samples_each(monkeypatch, eager_runs):
    timings(monkeypatch, compiled_ms=10.0, eager_ms=1.0)
    x, y = torch.randn(8, 3), torch.randn(3)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 6)           # compiled warm-up, C C, E E E
    assert next(iter(cg.perf_choices.values()))["samples"] == (2, 2)
    assert isinstance(next(iter(cg.variants.values())), pf.EagerVariant)


def test_a_first_eager_call_much_slower_ends_the_trial(monkeypatch, eager_runs):
    timings(monkeypatch, compiled_ms=1.0, eager_ms=4.5)
    x, y = torch.randn(8, 3), torch.randn(3)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 8)
    (choice,) = cg.perf_choices.values()
    assert choice["choice"] == "compiled" and choice["samples"] == (2, 0)
    assert "first call" in choice["reason"] and len(eager_runs) == 1


def test_each_shape_class_decides_on_its_own(monkeypatch):
    x, y = torch.randn(8, 3), torch.randn(3)
    x2, y2 = torch.randn(5, 7), torch.randn(7)
    gm, cg = _compiled(x, y)
    timings(monkeypatch, compiled_ms=1.0, eager_ms=5.0)
    _check_calls(cg, gm, (x, y), 12)
    timings(monkeypatch, compiled_ms=5.0, eager_ms=1.0)
    _check_calls(cg, gm, (x2, y2), 12)
    choices = {k[0][0]: v["choice"] for k, v in cg.perf_choices.items()}
    assert choices == {(8, 3): "compiled", (5, 7): "eager"}


def test_setting_off_never_times_nor_runs_eagerly(monkeypatch, eager_runs):
    monkeypatch.setattr(config, "perf_fallback", False)
    timings(monkeypatch, compiled_ms=10.0, eager_ms=1.0)
    x, y = torch.randn(8, 3), torch.randn(3)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 15)
    assert isinstance(next(iter(cg.variants.values())), Runtime)
    assert not eager_runs and not cg.perf_choices


def test_an_eager_variant_that_raises_leaves_the_compiled_graph(monkeypatch):
    def broken(self, *args):
        raise RuntimeError("eager alternative broken")
    monkeypatch.setattr(pf.EagerVariant, "__call__", broken)
    x, y = torch.randn(8, 3), torch.randn(3)
    gm, cg = _compiled(x, y)
    _check_calls(cg, gm, (x, y), 4)
    (choice,) = cg.perf_choices.values()
    assert choice["choice"] == "compiled" and "broken" in choice["reason"]
    assert isinstance(next(iter(cg.variants.values())), Runtime)


# --- through kiln.compile ------------------------------------------------------------
def test_compiled_function_with_input_mutation_writes_once_per_call(monkeypatch, eager_runs):
    """Each call runs one variant: the compiled path (a functional aten graph, the
    input written by the autograd runtime after it) or the torch-level graph (which
    writes it itself), so the input is written once per call."""
    timings(monkeypatch, compiled_ms=2.0, eager_ms=1.0)

    def f(x, y):
        x.add_(y)
        return (x * 2).sin(), x.sum()

    c = kiln.compile(f)
    a, b = torch.randn(16, 4), torch.randn(4)
    a_ref, b_ref = a.clone(), b.clone()
    for _ in range(15):
        got, want = c(a, b), f(a_ref, b_ref)
        torch.testing.assert_close(a, a_ref)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)
    assert len(eager_runs) >= 6
    assert all(isinstance(r, pf.TorchLevelEager) for r in eager_runs)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.mark.parametrize("eager_faster", [True, False])
def test_inference_calls_are_timed_against_the_torch_level_graph(monkeypatch, eager_runs,
                                                                 caplog, eager_faster):
    """Inference (no_grad) calls of the kiln backend's callable: the whole compiled path
    against the torch-level graph run by PyTorch (eager's own fused batch norm), with no
    second trial inside the inference aten graph."""
    timings(monkeypatch, compiled_ms=2.0 if eager_faster else 1.0,
            eager_ms=1.0 if eager_faster else 1.5)
    torch.manual_seed(0)
    m = _Net().eval()
    c = kiln.compile(m)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="kiln.perf"):
        for _ in range(22):
            torch.testing.assert_close(c(x), m(x))
    (decision,) = [r.getMessage() for r in caplog.records if r.name == "kiln.perf"]
    assert decision.endswith("-> eager" if eager_faster else "-> compiled")
    assert "float32[2, 3, 8, 8]@cpu" in decision and "(samples 6/6)" in decision
    assert eager_runs and all(isinstance(r, pf.TorchLevelEager) for r in eager_runs)
    assert len(eager_runs) == (9 + 4 if eager_faster else 9)


def test_training_and_inference_calls_of_one_function(monkeypatch, eager_runs, caplog):
    """Grad on with parameters requiring grad: the autograd stage's path, its forward
    and backward aten graphs timed each on its own; under no_grad: the inference trial."""
    timings(monkeypatch, compiled_ms=3.0, eager_ms=1.0)
    torch.manual_seed(0)
    m = _Net()
    c = kiln.compile(m)
    x = torch.randn(2, 3, 8, 8)
    with caplog.at_level(logging.INFO, logger="kiln.perf"):
        for _ in range(8):
            c(x).sum().backward()
        with torch.no_grad():
            m.eval()
            for _ in range(8):
                torch.testing.assert_close(c(x), m(x))
    names = [r.getMessage().split(" ")[1] for r in caplog.records if r.name == "kiln.perf"]
    assert sorted(names) == ["GraphModule", "KilnBackward", "KilnForward"], names
    kinds = {type(r).__name__ for r in eager_runs}
    assert kinds == {"EagerVariant", "TorchLevelEager"}


def test_compile_option_turns_it_off(monkeypatch, eager_runs):
    timings(monkeypatch, compiled_ms=10.0, eager_ms=1.0)
    c = kiln.compile(lambda x: (x * 3).cos(), options={"perf_fallback": False})
    x = torch.randn(7, 5)
    for _ in range(10):
        torch.testing.assert_close(c(x), (x * 3).cos())
    assert not eager_runs


def test_training_forward_and_backward_each_decide(monkeypatch, eager_runs, caplog):
    timings(monkeypatch, compiled_ms=3.0, eager_ms=1.0)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    ref.load_state_dict(m.state_dict())
    c = kiln.compile(m)
    x = torch.randn(5, 6)
    with caplog.at_level(logging.INFO, logger="kiln.perf"):
        for _ in range(12):
            m.zero_grad()
            ref.zero_grad()
            out, want = c(x), ref(x)
            torch.testing.assert_close(out, want)
            out.square().sum().backward()
            want.square().sum().backward()
            for p, q in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad, q.grad)
    decisions = [r for r in caplog.records if r.name == "kiln.perf"]
    assert len(decisions) == 2 and all(r.getMessage().endswith("-> eager") for r in decisions)


def test_decision_is_in_the_trace_report(monkeypatch, tmp_path):
    """The decision, made at a later call, is filed with the compile it belongs to."""
    import html
    from kiln.debug import trace_dir

    timings(monkeypatch, compiled_ms=3.0, eager_ms=1.0)
    c = kiln.compile(lambda x: (x * 3).cos() + 1)
    x = torch.randn(7, 5)
    try:
        with config.patch(trace_dir=str(tmp_path)):
            for _ in range(8):
                torch.testing.assert_close(c(x), (x * 3).cos() + 1)
    finally:
        trace_dir.sync()
    page = html.unescape((tmp_path / "index.html").read_text())
    assert re.search(r"notes \(\d+\)</summary><pre>perf: [^\n]*compiled 3\.000 ms, "
                     r"eager 1\.000 ms \(samples 2/2\) -> eager", page)


def test_perf_is_a_log_artefact():
    from kiln.debug import logs
    try:
        logs.set_logs("perf")
        assert logs.enabled("perf")
    finally:
        logs.set_logs("")


@pytest.mark.slow
def test_real_timings_send_a_slow_kernel_to_eager(monkeypatch):
    """A 256x256x256 matmul forced into kiln's own C++ loops (``small_matmul_macs``) is
    many times slower than the BLAS call eager makes: timed for real, eager wins. One
    thread: on a busy machine a parallel region waits for descheduled threads, which
    blurs both timings."""
    monkeypatch.setattr(config, "small_matmul_macs", 1 << 40)
    monkeypatch.setattr(config, "graph_cache", False)
    x, w = torch.randn(256, 256), torch.randn(256, 256)

    def g(x, w):
        return (aten.relu.default(aten.mm.default(x, w)),)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gm = fx.symbolic_trace(g)
        cg = compile_aten_graph(gm, [x, w], "cpp")
        assert "extern" not in cg.artefacts["ir"]      # the matmul is kiln's own loop
        for _ in range(pf.MAX_CALLS):
            torch.testing.assert_close(cg(x, w)[0], gm(x, w)[0], rtol=1e-4, atol=1e-3)
            if cg.perf_choices:
                break
    finally:
        torch.set_num_threads(threads)
    (choice,) = cg.perf_choices.values()
    assert choice["choice"] == "eager", choice
    assert isinstance(next(iter(cg.variants.values())), pf.EagerVariant)
    torch.testing.assert_close(cg(x, w)[0], gm(x, w)[0])


# --- the schedule, on stand-ins -------------------------------------------------------
class _Replay:
    """A stand-in for GraphReplay: records on the second call."""

    def __init__(self):
        self.disabled, self.graph, self.records, self.calls = False, None, 0, 0

    def step(self):
        self.calls += 1
        if self.calls == 2 or self.calls == 4:      # records, and records again once
            self.records += 1
            graph_replay.recordings += 1          # as GraphReplay._record counts them
            self.graph = object()


class _FakeRuntime:
    def __init__(self):
        self.graphs = _Replay()
        self.log = []

    def __call__(self, *args):
        self.graphs.step()
        self.log.append(self.graphs.calls)
        return ("compiled",)


class _Owner:
    def __init__(self):
        self.gm = fx.symbolic_trace(_graph)
        self.variants = {}
        self._last = None
        self.perf_choices = {}


def test_a_replayed_graph_is_timed_only_on_replays(monkeypatch):
    timings(monkeypatch, compiled_ms=1.0, eager_ms=1.5)
    owner, rt = _Owner(), _FakeRuntime()
    x, y = torch.randn(2, 3), torch.randn(3)
    sig = ((torch.Size((2, 3)), (3, 1), torch.float32, x.device),)
    trial = owner.variants[sig] = pf.maybe_trial(rt, owner, sig)
    ran = [trial(x, y)[0] == "compiled" for _ in range(21)]
    # warm-up, recording, C C(records again: no sample), then blocks E E E, C C C, …
    assert ran[:8] == [True, True, True, True, False, False, False, True]
    assert ran.count(True) == 12 and ran.count(False) == 9
    assert trial.samples["compiled"] == [1e-3] * 6 and len(trial.samples["eager"]) == 6
    assert owner.variants[sig] is rt and trial.decided == "compiled"
    assert owner.perf_choices[(((2, 3), torch.float32, x.device),)]["choice"] == "compiled"


class _MostlyRecordingRuntime(_FakeRuntime):
    """A compiled variant whose calls all record again (a size stream's settling:
    each call one-off work) except its ``sampled``-th."""

    def __init__(self, sampled):
        super().__init__()
        self.sampled = sampled

    def __call__(self, *args):
        self.graphs.calls += 1
        self.graphs.graph = object()
        if self.graphs.calls != self.sampled:
            graph_replay.recordings += 1
        return ("compiled",)


def test_one_outlying_compiled_sample_sends_nothing_to_eager(monkeypatch):
    """After ``MAX_CALLS`` calls with one compiled sample (ten times eager's: a stall
    the process had, say) against many eager ones, the compiled variant stays: a lone
    sample decides nothing. (Before, a LLaMA size stream in a process that had run
    torch.compile went eager for good on one such sample: 86 ms a pass, not 16.)"""
    timings(monkeypatch, compiled_ms=10.0, eager_ms=1.0)
    owner, rt = _Owner(), _MostlyRecordingRuntime(sampled=3)
    x, y = torch.randn(2, 3), torch.randn(3)
    sig = ((torch.Size((2, 3)), (3, 1), torch.float32, x.device),)
    trial = owner.variants[sig] = pf.maybe_trial(rt, owner, sig)
    for _ in range(pf.MAX_CALLS + 2):
        trial(x, y)
    assert len(trial.samples["compiled"]) == 1 and len(trial.samples["eager"]) >= pf.MIN_SAMPLES
    assert trial.decided == "compiled" and owner.variants[sig] is rt
    assert "1 compiled and" in trial.record["reason"]


def test_garbage_collection_is_no_part_of_a_sample():
    """A collection that runs inside a timed call (the collector's callbacks) is
    taken off the sample: it is the process's cost, not the variant's."""
    assert pf._clock._callback in gc.callbacks
    t0 = pf._start(None)
    pf._clock._callback("start", {"generation": 2})
    time.sleep(0.05)
    pf._clock._callback("stop", {"generation": 2})
    assert pf._stop(None, t0) < 0.04


def _stream_fn(x):
    return torch.sin(x) * 2 + 1


def test_a_new_size_runs_compiled_and_is_no_sample(monkeypatch, eager_runs, choices_made):
    """A stream of new sizes: each size's first call runs the compiled variant (its
    compile), outside the trial's blocks and call count — run eagerly instead, a size
    would compile only at its next call, a whole pass later. So nothing runs eagerly in
    the first pass, and 100 ms of injected compiled time there reaches no decision (the
    old code timed the compiles and chose eager); the blocks begin on sizes seen before."""
    timings(monkeypatch, compiled_ms=100.0, eager_ms=1.0)
    f = kiln.compile(_stream_fn, dynamic=True)
    sizes = range(16, 16 + pf.MAX_CALLS + 4)
    with torch.no_grad():
        for n in sizes:
            x = torch.randn(n, 3)
            torch.testing.assert_close(f(x), _stream_fn(x))
        trial = choices_made[-1].inference
        assert not eager_runs and trial.decided is None and trial.calls == 0
        assert trial.samples == {"compiled": [], "eager": []}
        for n in sizes:             # the second pass: the blocks, on compiled sizes
            x = torch.randn(n, 3)
            torch.testing.assert_close(f(x), _stream_fn(x))
    assert eager_runs and trial.decided == "eager", trial.samples


def test_a_stream_of_sizes_is_compared_per_element(monkeypatch, eager_runs, choices_made):
    """The compiled variant's timed calls draw the big size and eager's the small one:
    per call eager looks faster (4 * 1.5 ms against 64 * 1 ms), per element the
    compiled variant is (1 against 1.5 ms per row), and that is what decides."""
    cur = [0]
    monkeypatch.setattr(pf, "adjust", lambda which, s: (1.0 if which == "compiled" else 1.5)
                        * cur[0] / 1e3)
    f = kiln.compile(_stream_fn, dynamic=True)
    big, small = torch.randn(64, 3), torch.randn(4, 3)
    with torch.no_grad():
        for x in (big, small):      # each size compiled before the trial's blocks
            cur[0] = x.shape[0]
            f(x)
        trial = choices_made[-1].inference
        for _ in range(40):
            if trial.decided is not None:
                break
            x = big if trial.upcoming() == "compiled" else small
            cur[0] = x.shape[0]
            torch.testing.assert_close(f(x), _stream_fn(x))
    assert trial.decided == "compiled", trial.samples


@pytest.fixture
def choices_made(monkeypatch):
    """The InferenceChoice objects the kiln backend makes, in order."""
    made = []
    init = pf.InferenceChoice.__init__

    def recorded(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(pf.InferenceChoice, "__init__", recorded)
    return made
