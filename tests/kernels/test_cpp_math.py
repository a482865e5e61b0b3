"""The C++ path's own float math and store paths: kiln_exp / kiln_tanh against a float64
reference (ulps, specials, overflow and underflow), softmax on awkward rows, and the
streaming-store + huge-page path for large outputs (forced on small shapes here)."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph
from kiln.kernels.codegen.cpp import source as cpp

aten = torch.ops.aten


def _compile(fn, args):
    return compile_aten_graph(fx.symbolic_trace(fn), args, target="cpp")


def _awkward_floats(n_random=1 << 20):
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-(1 << 31), 1 << 31, (n_random,), generator=g, dtype=torch.int64)
    rand = bits.to(torch.int32).view(torch.float32)
    f = torch.finfo(torch.float32)
    specials = torch.tensor([
        0.0, -0.0, float("inf"), float("-inf"), float("nan"), f.tiny, -f.tiny, f.max, -f.max,
        1e-45, -1e-45, 1e-30, -1e-30, 0.5, -0.5, 0.625, -0.625, 0.62499994, 1.0, -1.0,
        9.0, -9.0, 9.5, 10.0, 20.0, -20.0, 88.0, 88.72, 88.7228, 88.73, 89.0, 89.5, 100.0,
        -87.33, -87.34, -100.0, -103.0, -103.97, -103.98, -104.0, -104.5, -150.0, -1e4,
        1e4, 3e38, -3e38], dtype=torch.float32)
    dense = torch.linspace(-110.0, 95.0, 200001, dtype=torch.float32)
    small = torch.logspace(-45, 1, 20001, dtype=torch.float64).to(torch.float32)
    return torch.cat([specials, dense, small, -small, rand])


def _ulps(got: torch.Tensor, ref64: torch.Tensor) -> torch.Tensor:
    """|got - round_to_float(ref)| in float32 ulps (monotone integer mapping of the bits)."""
    ref = ref64.to(torch.float32)

    def key(t):
        i = t.view(torch.int32).to(torch.int64)
        return torch.where(i < 0, -(1 << 31) - i, i)
    return (key(got) - key(ref)).abs()


def _check_unary(aten_op, ref_fn, max_ulp):
    x = _awkward_floats()
    fn = _compile(lambda t: (aten_op(t),), [x])
    got = fn(x)[0]
    ref = ref_fn(x.double())
    nan = ref.isnan()
    assert torch.equal(got.isnan(), nan), "NaN positions differ"
    inf = ref.to(torch.float32).isinf()
    assert torch.equal(got[inf], ref.to(torch.float32)[inf]), "overflow results differ"
    u = _ulps(got[~nan], ref[~nan])
    worst = int(u.max())
    assert worst <= max_ulp, f"max error {worst} ulp at x={x[~nan][u.argmax()].item()!r}"
    z = x == 0                      # signed zeros: tanh(-0) is -0
    assert torch.equal(got[z].view(torch.int32), ref[z].float().view(torch.int32))


def test_exp_full_range_ulps():
    _check_unary(aten.exp.default, torch.exp, 1)


def test_exp_denormal_and_overflow_edges():
    x = torch.tensor([-87.3, -100.0, -103.0, -103.9, -104.0, -200.0, 88.7, 88.73, 1e30,
                      float("-inf"), float("inf")], dtype=torch.float32)
    got = _compile(lambda t: (aten.exp.default(t),), [x])(x)[0]
    ref = torch.exp(x.double()).float()
    assert torch.equal(got, ref)


def test_tanh_full_range_ulps():
    _check_unary(aten.tanh.default, torch.tanh, 2)


def test_tanh_vectorised_source():
    x = torch.randn(4096)
    fn = _compile(lambda t: (aten.tanh.default(t),), [x])
    src = fn.artefacts["source"]
    assert "kiln_tanh(" in src and "std::tanh(t" not in src


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 4097), (64, 1000), (2, 3, 33)])
def test_softmax_awkward_rows(shape):
    torch.manual_seed(0)
    x = torch.randn(shape) * 30
    x.view(-1, shape[-1])[0, 0] = float("-inf")
    if x.view(-1, shape[-1]).shape[0] > 1:
        x.view(-1, shape[-1])[1, :] = float("-inf")      # a row of -inf only: NaN
    if x.view(-1, shape[-1]).shape[0] > 2:
        x.view(-1, shape[-1])[2, -1] = float("nan")
    if x.view(-1, shape[-1]).shape[0] > 3:
        x.view(-1, shape[-1])[3, :] = 3e38               # huge equal values
        x.view(-1, shape[-1])[3, 0] = -3e38
    fn = _compile(lambda t: (aten._softmax.default(t, -1, False),), [x])
    got, ref = fn(x)[0], torch.softmax(x, -1)
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=1e-7, equal_nan=True)


def test_softmax_extreme_spread():
    x = torch.tensor([[0.0, -50.0, -90.0, -100.0, -104.0, -120.0, -1e30],
                      [1e-30, -1e-30, 0.0, -0.0, 1e-45, 2e-45, 0.0]])
    fn = _compile(lambda t: (aten._softmax.default(t, -1, False),), [x])
    got, ref = fn(x)[0], torch.softmax(x.double(), -1).float()
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=0.0)


@pytest.mark.parametrize("shape", [(37, 1001), (8, 256), (3, 2049)])
def test_streaming_stores_match(monkeypatch, shape):
    """Large outputs take the streaming-store path (block buffer, unaligned head and tail,
    fence) and are madvised for huge pages; forced here on small shapes."""
    monkeypatch.setattr(cpp, "STREAM_BYTES", 1024)
    torch.manual_seed(1)
    x, y = torch.randn(shape), torch.randn(shape)

    def chain(a, b):
        t = aten.mul.Tensor(a, b)
        t = aten.sigmoid.default(aten.add.Tensor(t, 1.5))
        t = aten.exp.default(aten.mul.Tensor(t, a))
        return (aten.div.Tensor(aten.relu.default(aten.sub.Tensor(t, b)), 3.0),)

    fn = _compile(chain, [x, y])
    assert "kiln_stream(" in fn.artefacts["source"] and "kiln_hugepages(" in fn.artefacts["source"]
    ref = torch.relu(torch.exp(torch.sigmoid(x * y + 1.5) * x) - y) / 3.0
    torch.testing.assert_close(fn(x, y)[0], ref, rtol=1e-6, atol=1e-6)
    # odd row lengths: rows start off 32-byte boundaries (head and tail stores)
    sm = _compile(lambda t: (aten._softmax.default(t, -1, False),), [x])
    assert "kiln_stream(" in sm.artefacts["source"]
    torch.testing.assert_close(sm(x)[0], torch.softmax(x, -1), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("exponent", [2, 3, 0.5, -0.5, -1, -2, 2.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pow_scalar_matches_eager(exponent, dtype):
    """pow by 2, 3, ±0.5, -1, -2 is eager's cheaper formula (x*x, sqrt, 1/x…), not pow,
    so where that formula is exact arithmetic the results are eager's bits (pow's rounding
    is not). Square roots are compared to an ulp: eager's vectorised sqrt on this CPU
    (MKL) is not correctly rounded, std::sqrt is."""
    x = torch.rand(4099, dtype=dtype) * 8 + 1e-3
    fn = _compile(lambda t: (aten.pow.Tensor_Scalar(t, exponent) + 1,), [x])
    got, want = fn(x)[0], torch.pow(x, exponent) + 1
    if exponent in (2, 3, -1, -2):
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2 * torch.finfo(dtype).eps, atol=0)


def test_multiply_add_rounds_twice_like_eager():
    """a*b+c is two roundings in eager; a contracted FMA (one rounding) differs in the last
    place for these inputs, so the bits must match exactly."""
    g = torch.Generator().manual_seed(1)
    a, b, c = (torch.randn(1 << 16, generator=g) for _ in range(3))
    fn = _compile(lambda x, y, z: (aten.add.Tensor(aten.sub.Tensor(
        aten.mul.Tensor(x, y), aten.mul.Tensor(z, y)), x),), [a, b, c])
    assert torch.equal(fn(a, b, c)[0], a * b - c * b + a)
