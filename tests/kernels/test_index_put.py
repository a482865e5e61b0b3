"""``index_put`` as an ``ir.Scatter`` on the C++ target (``lowering.index._index_put``):
one index tensor or several (adjacent or not, broadcasting, with slices between),
negative and int32 indices, broadcast values, repeated positions accumulating, the copy
of the destination fused with its producer, out-of-range indices raising as in eager —
and the backward of indexing through the whole kiln backend with no fallback."""
import pytest
import torch
import torch.fx as fx

import kiln
from kiln.kernels import compile_aten_graph

aten = torch.ops.aten


def _check(f, *args, exact=True):
    c = compile_aten_graph(fx.symbolic_trace(f), list(args), target="cpp")
    for g, e in zip(c(*args), f(*args)):
        if exact:
            assert torch.equal(g, e), (g, e)
        else:
            torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)
    assert c.artefacts["fallbacks"] == [], c.artefacts["fallbacks"]
    assert "scatter over" in c.artefacts["schedule"]
    return c


@pytest.mark.parametrize("accumulate", [False, True])
def test_one_index_tensor_with_repeats_and_negatives(accumulate):
    def f(x, i, v):
        return (aten.index_put.default(aten.mul.Tensor(x, 2.0), [i], v, accumulate),)
    x = torch.randint(-8, 8, (6, 4)).float()
    i = torch.tensor([0, 2, -4, -1, 5, 2])            # 2 and -4 name the same row
    v = torch.randint(-8, 8, (6, 4)).float()           # exact sums in any order
    if not accumulate:
        i = torch.tensor([0, 2, -3, -1])               # no repeats: one answer
        v = v[:4]
    _check(f, x, i, v)


def test_several_index_tensors_adjacent_and_apart():
    def f(x, i, j, v, w):
        return (aten.index_put.default(x, [None, i, j], v, True),        # adjacent: (5, B)
                aten.index_put.default(x, [i, None, j], w, False))       # apart: (B, 4)
    x = torch.randn(3, 5, 4).transpose(0, 1).contiguous().transpose(0, 1)   # strided
    i = torch.tensor([[0], [2]])                       # broadcasts with j to (2, 3)
    j = torch.tensor([1, -1, 3], dtype=torch.int32)
    v = torch.randint(-4, 4, (3, 2, 3)).float()
    w = torch.randn(5)                                 # broadcast over (2, 3, 5)
    _check(f, x, i, j, v, w)


def test_scalar_and_broadcast_values():
    def f(x, i, v, w):
        return (aten.index_put.default(x, [i], v, False),                  # [1, 7] over [3, 7]
                aten.index_put.default(x, [None, i], aten.select.int(w, 0, 0), True),  # [3]
                aten.index_put.default(x, [i, i], aten.select.int(aten.select.int(w, 0, 1), 0, 2),
                                        True))                           # 0-d
    x = torch.randn(7, 7, dtype=torch.float64)
    i = torch.tensor([1, 4, 6])
    _check(f, x, i, torch.randn(1, 7, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64),
           exact=False)


def test_integer_destination():
    def f(x, i, v):
        return (aten.index_put.default(x, [i], v, True),)
    _check(f, torch.randint(0, 9, (5, 3)), torch.tensor([4, 4, 0]), torch.randint(0, 9, (3, 3)))


@pytest.mark.parametrize("bad", [6, -7])
def test_out_of_range_index_raises(bad):
    def f(x, i, v):
        return (aten.index_put.default(x, [i], v, True),)
    x, v = torch.randn(6, 2), torch.randn(2, 2)
    c = compile_aten_graph(fx.symbolic_trace(f), [x, torch.tensor([0, 1]), v], target="cpp")
    with pytest.raises(IndexError, match="index out of range"):  # eager's type
        c(x, torch.tensor([1, bad]), v)


def test_indexing_backward_through_kiln_has_no_fallback():
    """``x[idx]``'s gradient is new_zeros + index_put(accumulate=True): repeated rows of
    idx add up, as in eager."""
    from kiln.kernels import compile as kcompile
    seen = []
    orig = kcompile.build

    def spy(gm, inputs, target="cpp"):
        rt, arte = orig(gm, inputs, target)
        seen.append(arte["fallbacks"])
        return rt, arte
    kcompile.build = spy
    try:
        x = torch.randn(9, 5, dtype=torch.float64, requires_grad=True)
        idx = torch.tensor([3, 0, 3, 8, -1])

        def fn(x, idx):
            return (x[idx] * torch.arange(5.0, dtype=torch.float64)).sin().sum()
        kiln.compile(fn)(x, idx).backward()
    finally:
        kcompile.build = orig
    g = x.grad.clone()
    x.grad = None
    fn(x, idx).backward()
    torch.testing.assert_close(g, x.grad, rtol=1e-12, atol=1e-12)
    assert len(seen) == 2 and seen == [[], []], seen


def test_leading_unindexed_dims_scatter_in_parallel():
    """x[:, i] += v: rows never collide, so the scatter loop is parallel over them (and
    each element still gets its repeats in index order)."""
    def f(x, i, v):
        return (aten.index_put.default(x, [None, i], v, True),)
    x = torch.randint(-8, 8, (64, 50)).float()         # exact sums in any order (eager's
    i = torch.randint(-50, 50, (700,))                 # may differ with the thread count)
    v = torch.randint(-8, 8, (64, 700)).float()
    c = _check(f, x, i, v)
    scatter = c.artefacts["source"].split("scatter over")[1]
    assert scatter.count("#pragma omp parallel for") == 1
