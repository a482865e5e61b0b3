"""An out-of-range index raises what eager raises (its exception type), whichever op
the call was decomposed into: ``IndexError`` for indexing, ``index_select`` (but along
dim 1), ``embedding``, ``index_put``, ``nll_loss``; ``RuntimeError`` for ``gather``,
the scatters and ``index_add``."""
import pytest
import torch
import torch.nn.functional as F

import kiln


def _setitem(x):
    y = x.clone()
    y[torch.tensor([5])] = 1.0
    return y


CALLS = {
    "index_select_dim0": lambda x: x.index_select(0, torch.tensor([0, 7])),
    "index_select_dim1": lambda x: x.index_select(1, torch.tensor([0, 7])),
    "index_select_dim_last": lambda x: x.index_select(-1, torch.tensor([9])),
    "index_select_negative": lambda x: x.index_select(0, torch.tensor([-1])),
    "index_select_3d_dim1": lambda x: x.view(2, 2, 5).index_select(1, torch.tensor([2])),
    "index_select_3d_dim2": lambda x: x.view(2, 2, 5).index_select(2, torch.tensor([5])),
    "index": lambda x: x[torch.tensor([0, 9])],
    "index_negative": lambda x: x[torch.tensor([0, -9])],
    "index_second_dim": lambda x: x[:, torch.tensor([0, 5])],
    "index_two_tensors": lambda x: x[torch.tensor([0, 1]), torch.tensor([0, 5])],
    "gather": lambda x: torch.gather(x, 1, torch.tensor([[0, 7]] * 4)),
    "embedding": lambda x: F.embedding(torch.tensor([1, 4]), x),
    "index_put": lambda x: x.index_put((torch.tensor([0, 4]),), torch.tensor(1.0)),
    "index_put_accumulate": lambda x: x.index_put((torch.tensor([0, 4]),), torch.tensor(1.0),
                                                  accumulate=True),
    "setitem": _setitem,
    "scatter": lambda x: x.scatter(1, torch.tensor([[0, 7]] * 4), 1.0),
    "scatter_add": lambda x: x.scatter_add(1, torch.tensor([[0, 7]] * 4), x[:, :2]),
    "index_add": lambda x: x.index_add(0, torch.tensor([0, 4]), x[:2]),
    "index_fill": lambda x: x.index_fill(0, torch.tensor([4]), 1.0),
    "index_copy": lambda x: x.index_copy(0, torch.tensor([4]), x[:1]),
    "take": lambda x: x.take(torch.tensor([30])),
    "nll_loss": lambda x: F.nll_loss(x, torch.tensor([0, 1, 2, 9])),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 1, 2, 9])),
}


def _error(fn, x):
    try:
        fn(x)
    except Exception as e:          # noqa: BLE001
        return type(e)
    return None


@pytest.mark.parametrize("name", list(CALLS))
def test_out_of_range_index_raises_as_eager(name):
    f = CALLS[name]
    program = lambda x: f(x) + 1          # noqa: E731  (a kernel after the index)
    x = torch.randn(4, 5)
    expect = _error(program, x.clone())
    assert expect is not None
    assert _error(kiln.compile(program, backend="kiln"), x.clone()) is expect
