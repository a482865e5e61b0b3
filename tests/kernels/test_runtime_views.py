"""The CPU runtime's cheap argument paths: a graph input's view (a Linear's transposed
weight) is built once and reused while the same tensor comes back at the same address,
and a kernel buffer that a library call reads in another shape of the same memory is
allocated in that shape. Both must follow the user's tensors: an in-place update, a
``.data`` swap, a new input each call."""
import pytest
import torch

import kiln
from kiln import config
from kiln.kernels.runtime import runner as runtime


@pytest.fixture(autouse=True)
def _library_matmuls(monkeypatch):
    """These paths are those of library calls: keep the small Linears BLAS calls
    (``config.small_matmul_macs`` would otherwise compile them into the C++ kernels)."""
    monkeypatch.setattr(config, "small_matmul_macs", 0)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
                                 for _ in range(3)]).eval()


def _count_views(monkeypatch):
    n = [0]
    orig = runtime.Runtime.tensor_of

    def counting(self, tensors, buf, *a):
        r = orig(self, tensors, buf, *a)
        n[0] += r is not tensors[buf]       # a view was made
        return r
    monkeypatch.setattr(runtime.Runtime, "tensor_of", counting)
    return n


def test_steady_calls_build_no_views(monkeypatch):
    m, x = _mlp(), torch.randn(1, 16)
    c = kiln.compile(m)
    with torch.no_grad():
        for _ in range(3):
            c(x)
        n = _count_views(monkeypatch)
        y = c(torch.randn(1, 16))
    assert n[0] == 0
    assert y.shape == (1, 16)


def test_views_follow_the_parameters():
    m = _mlp()
    c = kiln.compile(m)
    w = m[1][0].weight
    with torch.no_grad():
        for _ in range(3):                  # the weight's view is cached by now
            x = torch.randn(1, 16)
            torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)
        w.mul_(-2.0)                        # in place: the cached view sees it
        x = torch.randn(1, 16)
        torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)
        w.data = torch.randn(16, 16)        # new storage: the view is rebuilt
        for _ in range(2):
            x = torch.randn(1, 16)
            torch.testing.assert_close(c(x), m(x), rtol=0, atol=0)


def test_grad_mode_builds_fresh_views():
    m = _mlp()
    c = kiln.compile(m)
    x = torch.randn(4, 16)
    for _ in range(3):
        y = c(x)
        y.sum().backward()
    g = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad()
    m(x).sum().backward()
    for n, p in m.named_parameters():
        torch.testing.assert_close(g[n] / 3, p.grad, rtol=1e-6, atol=1e-6, msg=n)
