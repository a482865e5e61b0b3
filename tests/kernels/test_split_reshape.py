"""A reshape that only splits dims keeps a lazy value lazy (``shapes._split_remap``):
its index map is affine, so the value is computed where it is read instead of stored
first (the loss gradient of an LM head goes on into its cast and padded copy in one
kernel: ``mm_operand_layout_cases.py``). Merges: ``test_merge_reshape.py``."""
import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import compile as kcompile
from kiln.kernels import ir
from kiln.kernels.lowering.shapes import _split_remap

aten = torch.ops.aten


def _build(fn, args):
    with config.patch(graph_cache=False):
        rt, art = kcompile.build(fx.symbolic_trace(fn), args, "cpp")
    bufs = kcompile.plan(fx.symbolic_trace(fn), args, "cpp").lowered.buffers
    for g, w in zip(rt(*args), fn(*args)):
        assert g.shape == w.shape and g.dtype == w.dtype and g.stride() == w.stride()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    return [b for b in bufs if isinstance(b, (ir.Pointwise, ir.Reduction))], art


def split_then_sum(x):
    y = aten.view.default(aten.relu.default(x), [2, 16, 37])
    return (aten.sum.dim_IntList(aten.mul.Tensor(y, 3.0), [1]),)


def split_with_ones(x):
    y = aten.view.default(aten.exp.default(x), [2, 1, 16, 37, 1])
    return (aten.add.Tensor(y, 1.0),)


def test_split_reshape_of_a_lazy_value_stores_nothing_before_its_reader():
    bufs, art = _build(split_then_sum, [torch.randn(32, 37)])
    assert [type(b).__name__ for b in bufs] == ["Reduction"], art["ir"]


def test_split_reshape_with_size_one_dims():
    bufs, art = _build(split_with_ones, [torch.randn(32, 37)])
    assert len(bufs) == 1 and bufs[0].numel == 32 * 37, art["ir"]


@pytest.mark.parametrize("src,dst,split", [
    ((32, 37), (2, 16, 37), True), ((6,), (2, 3), True), ((6, 4), (6, 2, 2), True),
    ((2, 3), (6,), False), ((4, 6), (2, 12), False), ((6,), (4,), False),
    ((0, 3), (0, 1, 3), False), ((1, 6), (6, 1), True)])
def test_which_reshapes_are_splits(src, dst, split):
    remap = _split_remap(src, dst)
    assert (remap is not None) == split
    if remap is None:
        return
    # the map sends every output index to the input index of the same element
    base = torch.arange(int(torch.tensor(src).prod())).view(src)
    out = base.view(dst)
    names = [ir.Affine.var(f"y{j}") for j in range(len(dst))]
    for pos in torch.cartesian_prod(*[torch.arange(s) for s in dst]).view(-1, len(dst)).tolist():
        env = dict((f"y{j}", v) for j, v in enumerate(pos))
        idx = [sum(k * env[v] for v, k in a.terms) + a.const for a in remap(names)]
        assert base[tuple(idx)] == out[tuple(pos)]
