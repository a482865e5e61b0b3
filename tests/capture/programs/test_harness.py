"""PYTEST_DONT_REWRITE

The checker must be able to fail: run it against deliberately wrong fake compilers
(independent of kiln and of torch.compile) and make sure each kind of wrongness is
caught -- wrong values, lost input/state mutations, wrong exception types, lost
requires_grad, Python type changes, wrong graph and break counts, wrong gradients.
"""
import types

import pytest
import torch
import torch.nn as nn

from . import harness as H


@pytest.fixture
def fake(monkeypatch):
    """Install a fake compiler: ``fake.wrap(fn) -> compiled`` decides the wrongness;
    ``fake.graphs`` graphs are handed to the backend per compile; ``fake.breaks`` is
    what explain reports."""
    state = types.SimpleNamespace(wrap=lambda fn: fn, graphs=1, breaks=0)

    def _compile(fn, backend, fullgraph):
        for _ in range(state.graphs):
            backend(torch.fx.symbolic_trace(lambda x: x + 1), [])
        return state.wrap(fn)

    def _explain(fn):
        def run(*a, **k):
            fn(*a, **k)
            return types.SimpleNamespace(graph_break_count=state.breaks, break_reasons=[], graph_count=state.graphs)
        return run

    monkeypatch.setattr(H, "_reset", lambda: None)
    monkeypatch.setattr(H, "_compile", _compile)
    monkeypatch.setattr(H, "_explain", _explain)
    return state


def _add(x):
    return x + 1


def test_correct_compiler_passes(fake):
    H.check(_add, H.shapes((3,)), graphs=1, breaks=0)


def test_wrong_value_caught(fake):
    fake.wrap = lambda fn: (lambda *a: fn(*a) + 1e-4)
    with pytest.raises(AssertionError):
        H.check(_add, H.shapes((3,)))


def test_wrong_graph_count_caught(fake):
    fake.graphs = 2
    with pytest.raises(AssertionError, match="graphs"):
        H.check(_add, H.shapes((3,)), graphs=1)


def test_wrong_break_count_caught(fake):
    fake.breaks = 1
    with pytest.raises(AssertionError, match="graph_break_count"):
        H.check(_add, H.shapes((3,)), breaks=0)


def test_lost_input_mutation_caught(fake):
    def f(x):
        x.add_(1)
        return x.sum()
    fake.wrap = lambda fn: (lambda x: fn(x.clone()))
    with pytest.raises(AssertionError, match="args"):
        H.check(f, H.shapes((3,)))


def test_lost_state_mutation_caught(fake):
    log = []
    def f(x):
        log.append(x.shape[0])
        return x * 2
    fake.wrap = lambda fn: (lambda x: x * 2)
    with pytest.raises(AssertionError, match="state"):
        H.check(f, H.shapes((3,)), state=log)


def test_lost_module_buffer_update_caught(fake):
    bn = nn.BatchNorm1d(3).train()
    def f(x):
        return bn(x)
    def wrap(fn):
        def run(x):
            bn.eval()
            try:
                return torch.nn.functional.batch_norm(x, None, None, bn.weight, bn.bias, training=True)
            finally:
                bn.train()
        return run
    fake.wrap = wrap
    with pytest.raises(AssertionError, match="state"):
        H.check(f, H.shapes((4, 3)), state=bn)


def test_lost_module_attribute_update_caught(fake):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
        def forward(self, x):
            self.calls += 1
            return x
    m = M()
    fake.wrap = lambda fn: (lambda x: x)
    with pytest.raises(AssertionError, match="calls"):
        H.check(m, H.shapes((2,)), state=m)


def test_wrong_exception_type_caught(fake):
    def f(x):
        raise ValueError("no")
    def wrap(fn):
        def run(x):
            raise RuntimeError("other")
        return run
    fake.wrap = wrap
    with pytest.raises(AssertionError, match="raised"):
        H.check(f, H.shapes((2,)))


def test_missing_exception_caught(fake):
    def f(x):
        assert x.dim() == 3
        return x
    fake.wrap = lambda fn: (lambda x: x)
    with pytest.raises(AssertionError, match="eager raised"):
        H.check(f, H.shapes((2,)))


def test_same_exception_type_passes(fake):
    def f(x):
        raise KeyError("k")
    H.check(f, H.shapes((2,)))


def test_requires_grad_mismatch_caught(fake):
    def f(x, w):
        return x * w
    fake.wrap = lambda fn: (lambda x, w: fn(x, w).detach())
    with pytest.raises(AssertionError, match="requires_grad"):
        H.check(f, lambda i: (H.T(3), H.T(3).requires_grad_()))


def test_python_type_change_caught(fake):
    def f(x):
        return x + 1, 2
    fake.wrap = lambda fn: (lambda x: (x + 1, 2.0))
    with pytest.raises(AssertionError, match="type"):
        H.check(f, H.shapes((2,)))


def test_dict_key_order_caught(fake):
    def f(x):
        return {"a": x, "b": 1}
    fake.wrap = lambda fn: (lambda x: {"b": 1, "a": x})
    with pytest.raises(AssertionError, match="keys"):
        H.check(f, H.shapes((2,)))


def test_wrong_gradient_caught(fake):
    def f(x, w):
        return (x * w).sum()
    fake.wrap = lambda fn: (lambda x, w: (x * w * 2).sum() - (x * w).sum().detach())
    with pytest.raises(AssertionError, match="grads"):
        H.check(f, lambda i: (H.T(3), H.T(3).requires_grad_()), backward=True)


def test_branch_flip_inputs_differ_between_calls(fake):
    # A compiler that replays the first call's output is caught on call 1.
    cache = {}
    def wrap(fn):
        def run(x):
            if "out" not in cache:
                cache["out"] = fn(x)
            return cache["out"]
        return run
    fake.wrap = wrap
    with pytest.raises(AssertionError, match="call 1"):
        H.check(lambda x: x.abs() if x.sum() > 0 else -x, lambda i: (H.flip(i, H.T(3)),))


COUNTER = 0


def test_lost_global_rebinding_caught(fake):
    def f(x):
        global COUNTER
        COUNTER += 1
        return x
    fake.wrap = lambda fn: (lambda x: x)
    with pytest.raises(AssertionError, match="COUNTER"):
        H.check(f, H.shapes((2,)), state=H.Globals(globals(), "COUNTER"))
