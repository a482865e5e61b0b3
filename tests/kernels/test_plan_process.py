"""A size's plan made in the planner process (``kernels/plan_process.py``): the same
plan as the calling process makes, its size's calls op by op until it is back."""
import threading

import pytest
import torch

import kiln
from kiln.autograd import specialize
from kiln.kernels import compile as compile_mod
from kiln.kernels import plan_process, size_prebuild


def _f(x, w):
    return torch.softmax(x @ w, -1).sum(0) + x.mean() * 2 - x[:, 3:].amax()


@pytest.fixture
def background(monkeypatch):
    monkeypatch.setattr(kiln.config, "background_size_builds", "1")
    monkeypatch.setattr(kiln.config, "background_size_plans", True)
    monkeypatch.setattr(kiln.config, "perf_fallback", False)


def _sized_graphs(monkeypatch):
    seen = []
    real = specialize.specialise

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append((out[0], [a[2][i] for i in out[1]]))
        return out
    monkeypatch.setattr(specialize, "specialise", spy)
    return seen


def test_the_planner_makes_the_plan_the_calling_process_makes(background, monkeypatch):
    """A later size's graph written out, planned by the planner process: source, entry
    points, size arguments and printed IR as the calling process's own plan of it."""
    seen = _sized_graphs(monkeypatch)
    cf = kiln.compile(_f)
    w = torch.randn(16, 16)
    for n in (33, 34, 35):
        cf(torch.randn(n, 16), w)
    kiln.wait_for_compiles(120)
    gm, args = seen[-1]
    got, done = [], threading.Event()
    job = plan_process.submit(gm, args, "cpp", lambda p: (got.append(p), done.set()))
    assert job is not None and done.wait(120) and got[0] is not None
    theirs = got[0]
    with kiln.config.patch(graph_cache=False):
        ours = compile_mod.checked_plan(gm, args, "cpp")
    assert theirs.source == ours.source and theirs.entries == ours.entries
    assert theirs.size_args.values == ours.size_args.values
    assert theirs.artefacts["ir"] == ours.artefacts["ir"]


def test_a_later_size_is_planned_in_the_planner_its_calls_op_by_op_meanwhile(background,
                                                                               monkeypatch):
    """Sizes after the first of a symbolic graph: planned by the planner (none lowered
    in this process), their first calls op by op with eager's values; once back, built;
    a plan the planner could not make (here: made to fail) is made at the next call."""
    lowered = []
    real_plan = compile_mod.checked_plan
    monkeypatch.setattr(compile_mod, "checked_plan",
                        lambda gm, a, t: (lowered.append(gm), real_plan(gm, a, t))[1])
    real_submit = plan_process.submit

    def submit(gm, args, target, on_done):
        if args[0].shape[0] == 47:           # the planner "fails" this one
            return real_submit(gm, args, target, lambda p: on_done(None))
        return real_submit(gm, args, target, on_done)
    monkeypatch.setattr(plan_process, "submit", submit)
    cf = kiln.compile(_f)
    w = torch.randn(16, 16)
    cf(torch.randn(41, 16), w)                        # static: planned here
    n_static = len(lowered)
    before = size_prebuild.eager_calls
    for n in (43, 45, 47):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls - before == 3, "op by op until planned"
    kiln.wait_for_compiles(120)
    assert not plan_process._planner.jobs
    assert len(lowered) == n_static, "none planned in this process"
    before = size_prebuild.eager_calls
    for n in (43, 45, 47, 43):
        x = torch.randn(n, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
    assert size_prebuild.eager_calls == before, "built"
    assert len(lowered) == n_static + 1, "47 planned here at its next call"


def test_what_the_planner_is_not_asked(background):
    import torch.fx as fx
    t = torch.randn(4, 6)
    gm = fx.symbolic_trace(lambda x: x + 1)
    assert plan_process.available(gm, "cpp", [t])
    with kiln.config.overlay({"kernel_size_args": False}):
        assert plan_process.available(gm, "cpp", [t])
        assert plan_process.settings()["kernel_size_args"] is False, "a function's own settings sent"
    assert not plan_process.available(gm, "triton", [t]), "the interpreter's CPU inputs"
    gm.register_buffer("c", torch.ones(3))
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.ops.aten.add.Tensor, (x, g.get_attr("c"))))
    with pytest.raises(plan_process.Unencodable):
        plan_process.encode(fx.GraphModule(gm, g))
    m = plan_process.TensorMeta(torch.randn(5, 8)[1:, ::2])
    back = m.meta()
    assert (back.shape, back.stride(), back.storage_offset()) == ((4, 4), (8, 2), 8)


def test_asking_never_waits_for_the_planner_to_read(background, monkeypatch):
    """A planner that reads nothing yet (starting up; busy with earlier plans): asking
    it for plans larger than a pipe's buffer returns at once (a writer thread sends
    them); the jobs stay open."""
    import sys
    import time
    slow = plan_process._Planner([sys.executable, "-c", "import time; time.sleep(60)"])
    monkeypatch.setattr(plan_process, "_planner", slow)
    big = {"graph": ["x" * 50_000] * 8, "inputs": [], "target": "cpp", "settings": {}}
    asked = threading.Thread(target=lambda: [slow.submit(plan_process.Job(lambda p: None), big)
                                             for _ in range(4)], daemon=True)
    t0 = time.monotonic()
    asked.start()
    asked.join(30)
    assert not asked.is_alive(), "blocked on the pipe"
    assert len(slow.jobs) == 4 and time.monotonic() - t0 < 30
    slow.proc.kill()


@pytest.mark.parametrize("plans", [True, False])
def test_the_planner_starts_while_a_processs_first_symbolic_graph_compiles(background,
                                                                           monkeypatch, plans):
    """A process's first graph, symbolic from its first call (``dynamic=True``), compiles
    in the calling thread; the planner's start-up (seconds: torch and kiln imported)
    overlaps that compile instead of delaying the first later size's plan. Not started
    with plans off."""
    monkeypatch.setattr(kiln.config, "background_size_plans", plans)
    monkeypatch.setattr(size_prebuild, "_built", [0])
    fresh = plan_process._Planner()
    monkeypatch.setattr(plan_process, "_planner", fresh)
    asked = []
    monkeypatch.setattr(fresh, "submit", lambda job, m: asked.append(m) or False)
    cf = kiln.compile(_f, dynamic=True)
    w = torch.randn(16, 16)
    try:
        cf(torch.randn(52, 16), w)                # the symbolic graph's first size
        assert (fresh.proc is not None) == plans and not asked
        x = torch.randn(53, 16)
        torch.testing.assert_close(cf(x, w), _f(x, w))
        assert len(asked) == plans
    finally:
        if fresh.proc is not None:
            fresh.proc.kill()


def test_the_planner_plans_under_the_callers_tf32_setting():
    """Whether fp32 products run on tensor cores decides ``pad_mm``'s padding: sent with
    each request and set in the planner."""
    from kiln.kernels import pad_mm, plan_worker
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        for on in (True, False):
            torch.backends.cuda.matmul.allow_tf32 = on
            assert plan_process.torch_state() == {"fp32_tensor_cores": on}
            torch.backends.cuda.matmul.allow_tf32 = not on
            plan_worker._set_torch_state({"fp32_tensor_cores": on})
            assert pad_mm._fp32_on_tensor_cores() is on
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
