"""Small CPU matrix products compiled into kiln's own C++ loops (``lowering_matmul``):
results match eager's BLAS to rounding on awkward layouts, bias/activation fuse into the
product's kernel so a stack of small layers needs no library call, and products above
``config.small_matmul_macs`` stay library calls."""
import pytest
import torch
import torch.fx as fx

import kiln
from kiln import config
from kiln.kernels import compile_aten_graph

aten = torch.ops.aten


def _compile(fn, args):
    return compile_aten_graph(fx.symbolic_trace(fn), args, target="cpp")


def _externs(fn):
    """How many library calls the compiled graph's runtime makes."""
    rt = next(iter(fn.variants.values()))
    return sum(type(s).__name__ == "ExternStep" for s in rt.steps)


def _tol(dtype, k):
    eps = torch.finfo(dtype).eps
    return dict(rtol=4 * k * eps, atol=4 * k * eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("m,k,n", [(1, 16, 16), (3, 7, 5), (1, 1, 1), (17, 1, 9),
                                   (5, 33, 1), (0, 4, 3)])
def test_mm_matches_eager(m, k, n, dtype):
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    fn = _compile(lambda x, y: (aten.mm.default(x, y),), [a, b])
    torch.testing.assert_close(fn(a, b)[0], a @ b, **_tol(dtype, k))
    assert _externs(fn) == 0


def test_transposed_and_strided_operands():
    a = torch.randn(9, 6)[::2]                    # rows with a stride of 12
    b = torch.randn(4, 6)                          # used transposed, as Linear does
    bias = torch.randn(1, 4)                       # broadcast over rows
    fn = _compile(lambda x, w, c: (aten.addmm.default(c, x, aten.t.default(w)),), [a, b, bias])
    torch.testing.assert_close(fn(a, b, bias)[0], torch.addmm(bias, a, b.t()), **_tol(torch.float32, 6))
    assert _externs(fn) == 0


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1), (2, 0)])
def test_addmm_scales(beta, alpha):
    c, a, b = torch.randn(3, 5), torch.randn(3, 4), torch.randn(4, 5)
    if beta == 0:
        c[0, 0] = float("nan")                     # beta=0 ignores the bias, NaN included
    fn = _compile(lambda c, a, b: (aten.addmm.default(c, a, b, beta=beta, alpha=alpha),), [c, a, b])
    torch.testing.assert_close(fn(c, a, b)[0], torch.addmm(c, a, b, beta=beta, alpha=alpha),
                               **_tol(torch.float32, 4))


def test_bias_and_activation_fuse_with_the_product():
    x, w, b = torch.randn(2, 16), torch.randn(16, 16), torch.randn(16)
    fn = _compile(lambda x, w, b: (aten.relu.default(aten.addmm.default(b, x, aten.t.default(w))),),
                  [x, w, b])
    torch.testing.assert_close(fn(x, w, b)[0], torch.relu(torch.addmm(b, x, w.t())), **_tol(torch.float32, 16))
    assert len(fn.artefacts["ir"].strip().splitlines()) == 3 + 2   # 3 inputs, product, output
    assert _externs(fn) == 0


def test_large_products_stay_library_calls(monkeypatch):
    monkeypatch.setattr(config, "small_matmul_macs", 1000)
    a, b = torch.randn(10, 10), torch.randn(10, 11)       # 1100 multiply-adds
    fn = _compile(lambda x, y: (aten.mm.default(x, y),), [a, b])
    assert _externs(fn) == 1
    assert fn.artefacts["fallbacks"] == []                 # a library call, not a fallback
    torch.testing.assert_close(fn(a, b)[0], a @ b)


def test_integer_and_half_products_stay_library_calls():
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    fn = _compile(lambda x, y: (aten.mm.default(x, y),), [a, b])
    assert _externs(fn) == 1
    assert torch.equal(fn(a, b)[0], a @ b)


def test_small_mlp_trains_like_eager():
    """Forward and backward (whose mm's take transposed saved activations) of a small
    MLP through the whole kiln backend, no library call left in any graph."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    ref.load_state_dict(m.state_dict())
    from kiln.kernels import compile as kcompile
    built = []
    orig = kcompile.build

    def spy(gm, inputs, target="cpp"):
        rt, arte = orig(gm, inputs, target)
        built.append(rt)
        return rt, arte
    kcompile.build = spy
    try:
        c = kiln.compile(m)
        x = torch.randn(5, 8)
        c(x).square().sum().backward()
    finally:
        kcompile.build = orig
    ref(x).square().sum().backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=n)
    assert len(built) == 2
    assert all(type(s).__name__ != "ExternStep" for rt in built for s in rt.steps)
