"""Mutated inputs written in place by Triton kernels (kernels/runtime/in_place.py), run
under TRITON_INTERPRET=1 by ``test_in_place_outputs.py`` (not collected by the normal
run: no ``test_`` prefix)."""
import os

import pytest
import torch

import kiln
from kiln import config
from kiln.kernels.runtime import runner

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_in_place_outputs.py)")


@pytest.fixture(autouse=True)
def _triton_target(monkeypatch):
    monkeypatch.setattr(config, "kernel_target", "triton")
    yield


def record_runtimes(monkeypatch) -> list:
    """Every Runtime built from now on, while ``monkeypatch`` holds."""
    made = []
    orig = runner.Runtime.__init__

    def init(self, *a, **k):
        orig(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(runner.Runtime, "__init__", init)
    return made


@pytest.fixture
def runtimes(monkeypatch):
    return record_runtimes(monkeypatch)


def _momentum_step(ps, gs, ms, lr):
    for p, g, m in zip(ps, gs, ms):
        m.mul_(0.9).add_(g)
        p.add_(m, alpha=-lr)


def _state(seed=0):
    torch.manual_seed(seed)
    shapes = [(64, 33), (33,), (7, 5, 3)]
    return ([torch.randn(s) for s in shapes], [torch.randn(s) for s in shapes],
            [torch.zeros(s) for s in shapes])


def test_an_update_step_writes_its_inputs_in_place(runtimes):
    ps, gs, ms = _state()
    ps2, ms2 = [p.clone() for p in ps], [m.clone() for m in ms]
    ptrs = [t.data_ptr() for t in ps + ms]
    f = kiln.compile(_momentum_step, backend="kiln")
    with torch.no_grad():
        for _ in range(3):
            f(ps, gs, ms, 0.1)
            _momentum_step(ps2, gs, ms2, 0.1)
    for a, b in zip(ps + ms, ps2 + ms2):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
    assert [t.data_ptr() for t in ps + ms] == ptrs
    # each call leaves autograd a record of the write (eager's count is per op)
    assert all(t._version >= 3 for t in ps + ms)
    written = set().union(*(rt.in_place_inputs for rt in runtimes))
    assert len(written) == 6, written       # three parameters, three momentum buffers


def test_a_plan_from_the_graph_cache_keeps_the_copy(runtimes, monkeypatch, tmp_path):
    """The second compile of the step loads its plan from the graph cache (no loop
    bodies): it copies the new values back instead of writing in place, and is right
    (it raised AttributeError on the H100 before)."""
    monkeypatch.setattr(config, "graph_cache", True)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    results = []
    for _ in range(2):
        kiln.reset()
        ps, gs, ms = _state()
        ps2, ms2 = [p.clone() for p in ps], [m.clone() for m in ms]
        f = kiln.compile(_momentum_step, backend="kiln")
        with torch.no_grad():
            for _ in range(2):
                f(ps, gs, ms, 0.1)
                _momentum_step(ps2, gs, ms2, 0.1)
        for a, b in zip(ps + ms, ps2 + ms2):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        results.append(set().union(*(rt.in_place_inputs for rt in runtimes)))
        runtimes.clear()
    assert len(results[0]) == 6 and results[1] == set(), results


def test_the_version_counter_catches_a_saved_tensor_written_in_place():
    x = torch.randn(5)
    w = torch.randn(5, requires_grad=True)
    y = (w * x).sum()                       # saves x for the backward
    f = kiln.compile(lambda t: t.mul_(2), backend="kiln")
    with torch.no_grad():
        f(x)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def _flip_update(x):
    x.copy_(x.flip(0) + 1)


def _sum_then_scale(x):
    s = x.sum()
    x.mul_(2)
    return s


def _returns_the_input(x):
    x.add_(1)
    return x


def _old_value_after(x, y):
    x.add_(1)
    return y * 2


def _reads_old_after(x):
    old = x * 3
    x.add_(1)
    return old + 1


CASES = {"flip_update": (_flip_update, 1), "sum_then_scale": (_sum_then_scale, 1),
         "returns_the_input": (_returns_the_input, 1), "old_value_after": (_old_value_after, 2),
         "reads_old_after": (_reads_old_after, 1)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mutations_match_eager(name, runtimes):
    fn, n = CASES[name]
    torch.manual_seed(1)
    args = [torch.randn(6, 5) for _ in range(n)]
    ref = [a.clone() for a in args]
    f = kiln.compile(fn, backend="kiln")
    with torch.no_grad():
        for _ in range(2):
            got = f(*args)
            want = fn(*ref)
            if want is not None:
                torch.testing.assert_close(got, want)
            for a, r in zip(args, ref):
                torch.testing.assert_close(a, r)
    if name == "returns_the_input":
        assert got is args[0]


def test_an_input_aliasing_the_mutated_one():
    base = torch.randn(8)
    ref = base.clone()

    def f(x, y):
        x.add_(y)
    g = kiln.compile(f, backend="kiln")
    with torch.no_grad():
        g(base, base)
        f(ref, ref)
    torch.testing.assert_close(base, ref)
