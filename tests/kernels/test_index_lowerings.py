"""Gathers (``kiln/kernels/lowering/index.py``): embedding, index.Tensor with one index
tensor (negative indices wrap), gather — against eager on awkward inputs, fused with
their consumers, and out-of-range indices raising as in eager."""
import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph

aten = torch.ops.aten


def _run(f, *args):
    c = compile_aten_graph(fx.symbolic_trace(f), list(args))
    for g, e in zip(c(*args), f(*args)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    assert c.artefacts["fallbacks"] == [], c.artefacts["fallbacks"]
    return c


def test_embedding_fused_with_position_add():
    def f(w, ids, pos):
        return (aten.add.Tensor(aten.embedding.default(w, ids), pos),
                aten.embedding.default(w, aten.select.int(ids, 0, 1)))
    w = torch.randn(11, 6)
    ids = torch.randint(0, 11, (3, 5))
    c = _run(f, w, ids, torch.randn(5, 6))
    _run(f, torch.randn(6, 11).t(), ids.int(), torch.randn(5, 6))    # strided weight, int32


def test_index_tensor_wraps_negative_indices():
    def f(x, i):
        return (aten.index.Tensor(x, [None, i]), aten.index.Tensor(x, [i]),
                aten.index.Tensor(x, [None, None, aten.select.int(i, 0, 0)]))
    x = torch.randn(4, 5, 6).transpose(0, 2)                  # (6, 5, 4), non-contiguous
    i = torch.tensor([[0, -1, 3], [2, -4, 1]])
    _run(f, x, i)


def test_gather():
    def f(x, i):
        return (aten.gather.default(x, 1, i), aten.gather.default(x, 0, i))
    x = torch.randn(7, 9)
    _run(f, x, torch.randint(0, 7, (4, 3)))


@pytest.mark.parametrize("bad", [11, -1])
def test_out_of_range_index_raises(bad):
    def f(w, ids):
        return (aten.embedding.default(w, ids),)
    w, ids = torch.randn(11, 4), torch.tensor([1, 2, 3])
    c = compile_aten_graph(fx.symbolic_trace(f), [w, ids])
    with pytest.raises(IndexError, match="index out of range"):  # eager's type
        c(w, torch.tensor([1, bad, 3]))


def test_index_select_and_slice_scatter():
    def f(x, i, y, z):
        return (aten.index_select.default(x, 1, i),
                aten.slice_scatter.default(x, y, 0, 1, 3),
                aten.slice_scatter.default(x, z, 1, -3, None))
    x = torch.randn(5, 4, 3).transpose(0, 1)               # (4, 5, 3), non-contiguous
    _run(f, x, torch.tensor([4, 0, 0, 2]), torch.randn(2, 5, 3), torch.randn(4, 3, 3))
