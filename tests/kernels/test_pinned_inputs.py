"""Graphs whose every input's signature capture's guards pin (static sizes) skip the
kernel compiler's per-call signature check; the backward and symbolic graphs keep it,
and a parameter whose layout changes is caught by the guards (a new graph), never run
through kernels built for the old one."""
import torch

import kiln
from kiln.kernels import compile as kc


def _spy(monkeypatch):
    """(graphs made, graphs whose signature was looked up, one entry per lookup)."""
    made, lookups = [], []
    init, variant = kc.CompiledGraph.__init__, kc.CompiledGraph._variant

    def spy_init(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    def spy_variant(self, args):
        lookups.append(self)
        return variant(self, args)
    monkeypatch.setattr(kc.CompiledGraph, "__init__", spy_init)
    monkeypatch.setattr(kc.CompiledGraph, "_variant", spy_variant)
    return made, lookups


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_a_static_inference_graph_checks_its_signature_once(monkeypatch):
    made, lookups = _spy(monkeypatch)
    m = _mlp().eval()
    f = kiln.compile(m)
    with torch.no_grad():
        f(torch.randn(3, 8))
        before = len(lookups)
        for _ in range(5):
            x = torch.randn(3, 8)
            torch.testing.assert_close(f(x), m(x))
    assert made and all(g.pinned for g in made)
    assert before >= 1 and len(lookups) == before


def test_training_pins_the_forward_not_the_backward(monkeypatch):
    made, lookups = _spy(monkeypatch)
    m = _mlp()
    f = kiln.compile(m)
    for _ in range(3):
        x = torch.randn(3, 8)
        m.zero_grad()
        f(x).sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(grads, m.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert sorted(g.pinned for g in made) == [False, True]     # the backward, the forward
    backward = next(g for g in made if not g.pinned)
    assert lookups.count(backward) == 3                         # checked every call


def test_a_parameter_changing_layout_is_a_new_graph(monkeypatch):
    made, _ = _spy(monkeypatch)
    m = torch.nn.Linear(8, 16).eval()
    f = kiln.compile(m)
    x = torch.randn(3, 8)
    with torch.no_grad():
        f(x)
        f(x)
        # the same values, transposed strides: the kernels of the first graph read the
        # weight row-major; the entry's stride guard fails, and a new graph is built
        m.weight.data = m.weight.data.t().contiguous().t()
        torch.testing.assert_close(f(x), m(x))
    assert len(made) == 2


def test_symbolic_graphs_are_not_pinned(monkeypatch):
    made, lookups = _spy(monkeypatch)

    def fn(x, y):
        return torch.relu(x) * y

    f = kiln.compile(fn, dynamic=True)
    for n in (3, 5, 7):
        x, y = torch.randn(n, 4), torch.randn(n, 4)
        torch.testing.assert_close(f(x, y), fn(x, y))
    assert made and not any(g.pinned for g in made)
