"""A compiled graph frees what it no longer needs while it runs: buffers after their last
reader, and (called boxed, as the backward is) its inputs too.

A training step's peak memory is the forward's saved activations plus the backward's
work; a backward that held every saved activation until it returned would keep them all
alive beside the gradients it makes (eager frees each as its autograd node finishes)."""
import weakref

import torch
import torch.fx as fx

import kiln
from kiln.kernels import compile_aten_graph
from kiln.kernels.runtime import runner as runtime

aten = torch.ops.aten
_seen = []
_watched = []

_lib = torch.library.Library("kiln_test_memory", "DEF")
_lib.define("probe(Tensor x) -> Tensor")


def _probe(x):
    """Records whether the watched tensor is still alive when the graph calls it."""
    if _watched:
        _seen.append(_watched[0]() is not None)
    return x.clone()


_lib.impl("probe", _probe, "CPU")
_lib.impl("probe", lambda x: torch.empty_like(x), "Meta")


def _graph(a):
    return (torch.ops.kiln_test_memory.probe.default(aten.mm.default(a, a)),)


def _compiled():
    _watched.clear()
    a = torch.randn(16, 16)
    return compile_aten_graph(fx.symbolic_trace(_graph), [a])


def test_boxed_call_frees_an_input_after_its_last_reader():
    c = _compiled()
    a = torch.randn(16, 16)
    expected = _graph(a)[0]
    _watched[:] = [weakref.ref(a)]
    _seen.clear()
    args = [a]
    del a
    got = c.call_boxed(args)[0]
    assert args == []                      # the call took the list over
    assert _seen == [False]                # freed after the mm, before the probe ran
    torch.testing.assert_close(got, expected)


def test_plain_call_leaves_the_callers_inputs_alone():
    c = _compiled()
    a = torch.randn(16, 16)
    _watched[:] = [weakref.ref(a)]
    _seen.clear()
    c(a)
    assert _seen == [True] and a.shape == (16, 16)


def test_training_backward_is_called_boxed(monkeypatch):
    """The backward graph gets the saved activations in a list it owns, and the
    autograd context drops its own references first (``maybe_clear_saved_tensors``)."""
    calls = []
    orig = runtime.Runtime.call_boxed

    def spy(self, args):
        calls.append(len(args))
        return orig(self, args)
    monkeypatch.setattr(runtime.Runtime, "call_boxed", spy)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(4, 8)
    kiln.compile(m, backend="kiln")(x).sum().backward()
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).sum().backward()
    for g, p in zip(got, m.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert len(calls) == 1 and calls[0] >= 2


def test_cross_entropy_backward_holds_one_logits_sized_buffer(monkeypatch):
    """Planned from the compiled backward of a cross-entropy (``memory_plan``): while it
    runs, at most the saved logits and the gradient are of the logits' size. Built as
    decomposed (nll_loss's backward a scatter into zeros, then log_softmax's backward),
    it held four: a language model's peak was there."""
    from kiln.kernels import compile as kcompile
    from kiln.kernels.runtime import memory_plan
    built = []
    build = kcompile.build
    monkeypatch.setattr(kcompile, "build", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    torch.manual_seed(0)
    w = torch.randn(64, 1000, requires_grad=True)
    h, y = torch.randn(256, 64), torch.randint(0, 1000, (256,))

    def step(h, y):
        return torch.nn.functional.cross_entropy(h @ w, y)
    kiln.compile(step, backend="kiln")(h, y).backward()
    g, w.grad = w.grad.clone(), None
    step(h, y).backward()
    torch.testing.assert_close(g, w.grad, rtol=1e-5, atol=1e-6)
    logits = 256 * 1000 * 4
    bw = built[-1][0]
    _, _, live = memory_plan.peak(bw)
    big = [k for k, v in live.items() if v >= logits]
    assert len(big) <= 2, live
