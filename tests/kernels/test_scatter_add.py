"""``scatter_add`` / ``scatter`` / ``scatter_reduce`` (sum) and ``embedding_dense_backward``
as an ``ir.Scatter`` (``lowering_index._scatter_dim``, ``_embedding_dense_backward``).

The C++ path must equal eager bit for bit: random (not integer-valued) floats with
repeated indices, so that only eager's order of accumulation gives eager's sums. Shapes
are awkward: negative dims, size-1 dims, an index smaller than ``src`` in every dim,
transposed operands, an expanded index (eager's sorted path), out-of-range embedding
indices (eager's CPU kernel skips them). The Triton path runs the ``test_tri_*`` tests
in a child pytest under TRITON_INTERPRET=1 (atomics: integer-valued floats, or a
tolerance)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

import kiln
from kiln.kernels import compile_aten_graph

aten = torch.ops.aten
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
cpp_only = pytest.mark.skipif(INTERPRET, reason="the C++ tests run in the parent")
interp_only = pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")


def _check(f, *args, target="cpp", exact=True, fallbacks=()):
    """Compile ``f``'s graph, compare every output with eager, and check exactly the
    ops in ``fallbacks`` fall back."""
    c = compile_aten_graph(fx.symbolic_trace(f), list(args), target=target)
    for g, e in zip(c(*args), f(*args)):
        assert g.dtype == e.dtype and g.shape == e.shape, (g, e)
        if exact:
            assert torch.equal(g, e), (g, e)
        else:
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert sorted(c.artefacts["fallbacks"]) == sorted(fallbacks), c.artefacts["fallbacks"]
    assert "scatter over" in c.artefacts["schedule"]
    return c


def _t(*shape, dtype=torch.float32):
    """A transposed (non-contiguous) random tensor of ``shape``."""
    return torch.randn(*reversed(shape), dtype=dtype).permute(*reversed(range(len(shape))))


def _scatter_graph(x, i, s, j, p):
    """Along the last dim (negative), the first (the fused producer is the initial value),
    a size-1 dim; scatter and scatter of a value at ``p`` (on Triton a permutation:
    repeats have no one answer there), scatter_reduce sum."""
    return (aten.scatter_add.default(x, -1, i, s),
            aten.scatter_add.default(aten.mul.Tensor(x, 2.0), 0, i, s),
            aten.scatter_add.default(aten.unsqueeze.default(x, 1), 1, j,
                                     aten.unsqueeze.default(s, 1)),
            aten.scatter.src(x, 0, p, s), aten.scatter.value(x, 1, p, -1.5),
            aten.scatter_reduce.two(x, -2, i, s, "sum"))


def _scatter_inputs(dtype=torch.float32):
    x = _t(6, 7, dtype=dtype)
    i = torch.randint(0, 6, (4, 5))                   # repeats; smaller than x and s
    s = _t(5, 9, dtype=dtype)                         # larger than i in every dim
    j = torch.zeros(4, 1, 5, dtype=torch.int64)       # along a size-1 dim
    return x, i, s, j, i


def _embedding_graph(g, ix, gt, jx):
    """Two-dim indices with repeats and a padding row; int32 indices, no padding, a
    transposed gradient; indices out of range (skipped, as eager's CPU kernel does)."""
    return (aten.embedding_dense_backward.default(g, ix, 9, 2, False),
            aten.embedding_dense_backward.default(gt, jx, 6, -1, False))


def _embedding_inputs(dtype=torch.float32, values=torch.randn):
    g = values(3, 40, 5).to(dtype)
    ix = torch.randint(0, 9, (3, 40))
    gt = values(4, 7).to(dtype).t()
    jx = torch.tensor([5, 0, 5, -1, 6, 5, 0], dtype=torch.int32)
    return g, ix, gt, jx


@cpp_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("graph, inputs", [(_scatter_graph, _scatter_inputs),
                                           (_embedding_graph, _embedding_inputs)],
                         ids=["scatter", "embedding"])
def test_bit_equal(graph, inputs, dtype):
    torch.manual_seed(0)
    _check(graph, *inputs(dtype))


@cpp_only
def test_scatter_add_integers_int32_index_and_empty_index():
    def f(x, i, s, e):
        return (aten.scatter_add.default(x, 1, i, s), aten.scatter_add.default(x, 0, e, s))
    x, s = torch.randint(-9, 9, (3, 8)), torch.randint(-9, 9, (3, 11))
    i = torch.randint(0, 8, (3, 11), dtype=torch.int32)
    _check(f, x, i, s, torch.zeros(0, 4, dtype=torch.int64))


@cpp_only
def test_expanded_index_takes_eager_sorted_path():
    """An index expanded along dim 0 with at least 16 columns sends eager to its sorted
    kernel (a stable sort: index order per row kept), so the sums are still equal."""
    def f(x, i, s):
        e = aten.expand.default(i, [300, 32])
        return (aten.scatter_add.default(x, 0, e, s), aten.scatter.src(x, 0, e, s),
                aten.scatter_reduce.two(x, 0, e, s, "sum"))
    torch.manual_seed(1)
    _check(f, torch.randn(7, 32), torch.randint(0, 7, (300, 1)), torch.randn(300, 32))


@cpp_only
def test_rows_scatter_in_parallel():
    """Along the last dim, rows never collide: the scatter loop is parallel over them,
    and each element still gets its repeats in index order."""
    def f(x, i, s):
        return (aten.scatter_add.default(x, 1, i, s),)
    torch.manual_seed(2)
    c = _check(f, torch.randn(64, 50), torch.randint(0, 50, (64, 700)), torch.randn(64, 701))
    assert c.artefacts["source"].split("scatter over")[1].count("#pragma omp parallel for") == 1


@cpp_only
@pytest.mark.parametrize("bad", [7, -1])
def test_out_of_range_index_raises(bad):
    def f(x, i, s):
        return (aten.scatter_add.default(x, 1, i, s),)
    x, s = torch.randn(2, 7), torch.randn(2, 2)
    c = compile_aten_graph(fx.symbolic_trace(f), [x, torch.tensor([[0, 1]] * 2), s], target="cpp")
    with pytest.raises(RuntimeError, match="index out of range"):
        c(x, torch.tensor([[0, 1], [bad, 2]]), s)


@cpp_only
def test_what_is_not_exact_falls_back():
    """Other reductions, a sum that leaves self out, and frequency scaling fall back."""
    def f(x, i, s, ix, g):
        return (aten.scatter_reduce.two(x, 0, i, s, "amax"),
                aten.scatter_reduce.two(x, 0, i, s, "sum", include_self=False),
                aten.embedding_dense_backward.default(g, ix, 5, -1, True),
                aten.scatter_add.default(x, 0, i, s))
    x, s = torch.randn(4, 3), torch.randn(4, 3)
    ix, g = torch.tensor([0, 4, 4]), torch.randn(3, 2)
    _check(f, x, torch.randint(0, 4, (4, 3)), s, ix, g,
           fallbacks=["aten.scatter_reduce.two"] * 2 + ["aten.embedding_dense_backward.default"])


@cpp_only
def test_scatter_add_through_kiln_has_no_fallback(monkeypatch):
    """``Tensor.scatter_add`` in a compiled function (its backward is a gather)."""
    from kiln.kernels import compile as kcompile
    seen, build = [], kcompile.build
    monkeypatch.setattr(kcompile, "build", lambda *a, **k: seen.append(build(*a, **k)) or seen[-1])
    s = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    i = torch.tensor([[0, 1, 0, 2, 2, 0]] * 4)

    def fn(s, i):
        return torch.zeros(4, 3, dtype=torch.float64).scatter_add(1, i, s.exp()).cos().sum()
    out = kiln.compile(fn)(s, i)
    out.backward()
    g = s.grad.clone()
    s.grad = None
    want = fn(s, i)
    want.backward()
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, s.grad, rtol=1e-12, atol=1e-12)
    assert [arte["fallbacks"] for _, arte in seen] == [[], []]


def _one_hot_graph(x, t, s, c):
    """Scatters with one index per line along their dim, all pointwise: nll_loss's
    backward (a value into zeros, along the last dim), a source bigger than the index
    along the dim, an add along dim 0 into a transposed tensor, scatter_reduce sum."""
    z = aten.zeros_like.default(x)
    t1 = aten.unsqueeze.default(t, 1)
    return (aten.mul.Tensor(aten.scatter.value(z, 1, t1, -1.0), 0.25),
            aten.scatter.src(x, -1, t1, s),
            aten.scatter_add.default(aten.t.default(x), 0, c, aten.t.default(s)),
            aten.scatter_reduce.two(x, 1, t1, s, "sum"))


def _one_hot_inputs(dtype=torch.float32):
    x = torch.randn(6, 7, dtype=dtype)
    t = torch.randint(0, 7, (6,))
    s = torch.randn(6, 3, dtype=dtype)
    c = torch.randint(0, 7, (1, 6))
    return x, t, s, c


@cpp_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_one_index_per_line_is_pointwise(dtype):
    """No ``ir.Scatter`` (no buffer of the output's size stored twice): one fused
    pointwise kernel, bit-equal to eager."""
    torch.manual_seed(5)
    args = _one_hot_inputs(dtype)
    c = compile_aten_graph(fx.symbolic_trace(_one_hot_graph), list(args), target="cpp")
    for g, e in zip(c(*args), _one_hot_graph(*args)):
        assert g.dtype == e.dtype and torch.equal(g, e), (g, e)
    assert "scatter over" not in c.artefacts["schedule"]
    assert c.artefacts["fallbacks"] == []


@cpp_only
def test_one_hot_out_of_range_index_raises():
    x, t, s, c = _one_hot_inputs()
    comp = compile_aten_graph(fx.symbolic_trace(_one_hot_graph), [x, t, s, c], target="cpp")
    with pytest.raises(RuntimeError, match="index out of range"):
        comp(x, torch.tensor([0, 1, 2, 7, 1, 1]), s, c)


@cpp_only
def test_cross_entropy_backward_stores_no_scatter():
    """F.cross_entropy through kiln: its backward (nll_loss backward, then log_softmax's)
    has no scatter kernel, and the gradient is eager's."""
    from kiln.kernels import compile as kcompile
    seen, build = [], kcompile.build
    x = torch.randn(16, 50, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 50, (16,))

    def fn(x, y):
        return torch.nn.functional.cross_entropy(x * 2, y)
    import unittest.mock as mock
    with mock.patch.object(kcompile, "build",
                           lambda *a, **k: seen.append(build(*a, **k)) or seen[-1]):
        out = kiln.compile(fn)(x, y)
        out.backward()
    g, x.grad = x.grad.clone(), None
    fn(x, y).backward()
    torch.testing.assert_close(g, x.grad, rtol=1e-12, atol=1e-12)
    assert len(seen) == 2 and all("scatter over" not in a["schedule"] for _, a in seen)


# --- the Triton path, under the interpreter ------------------------------------------
def _ints(*shape):
    """Integer-valued floats: sums are exact whatever order the atomics take."""
    return torch.randint(-4, 5, shape).float()


@interp_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tri_scatter_ops(dtype):
    """float16 sums in a float32 copy rounded once (eager's CPU rounds at every add):
    small integers, so that both are exact."""
    torch.manual_seed(4)
    x, i, s, j, _ = _scatter_inputs()
    p = torch.stack([torch.randperm(6)[:4] for _ in range(5)], 1)
    if dtype == torch.float32:
        c = _check(_scatter_graph, x, i, s, j, p, target="triton", exact=False)
        assert "tl.atomic_add" in c.artefacts["source"]
    x, s = _ints(6, 7).to(dtype), _ints(9, 5).to(dtype).t()    # exact sums: bit-equal
    _check(_scatter_graph, x, i, s, j, p, target="triton")


@interp_only
def test_tri_int64_accumulation_falls_back():
    """``tl.atomic_add`` has int32 but no int64: that one is declined."""
    def f(x, i, s):
        return (aten.scatter_add.default(x, 1, i, s),
                aten.scatter_add.default(aten._to_copy.default(x, dtype=torch.int32), 1, i,
                                         aten._to_copy.default(s, dtype=torch.int32)))
    x, s = torch.randint(-9, 9, (3, 8)), torch.randint(-9, 9, (3, 11))
    _check(f, x, torch.randint(0, 8, (3, 5)), s, target="triton",
           fallbacks=["aten.scatter_add.default"])


@interp_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_tri_embedding_dense_backward(dtype):
    """As for scatter_add, and the padding row and out-of-range indices skipped."""
    torch.manual_seed(5)
    _check(_embedding_graph, *_embedding_inputs(dtype, values=_ints), target="triton")
    if dtype == torch.float32:
        _check(_embedding_graph, *_embedding_inputs(dtype), target="triton", exact=False)


@pytest.mark.slow
@cpp_only
def test_triton_path_under_the_interpreter(tmp_path):
    """The ``test_tri_*`` tests in a child pytest: TRITON_INTERPRET must be set before
    triton is first imported."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        os.path.abspath(__file__), "--rootdir", root, "-k", "test_tri_"],
                       env=env, capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "6 passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]


@interp_only
def test_tri_one_index_per_line_is_pointwise():
    torch.manual_seed(6)
    args = _one_hot_inputs()
    c = compile_aten_graph(fx.symbolic_trace(_one_hot_graph), list(args), target="triton")
    for g, e in zip(c(*args), _one_hot_graph(*args)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert "tl.atomic_add" not in c.artefacts["source"]
