"""A tuple of constants read by a trace (a convolution's stride, a shape argument) is
guarded whole (``GuardSet.constant_tuple``): the same tuple object, or one equal item by
item in types and values. Fewer guards per call, with the same recompiles as the
item-by-item guards they replace."""
import torch

import kiln


def _counting(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return backend


def test_a_convolution_attribute_is_one_guard_and_changes_recompile():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    graphs = []
    f = kiln.compile(conv, backend=_counting(graphs))
    x = torch.randn(1, 3, 9, 9)
    torch.testing.assert_close(f(x), conv(x))
    _, guards = kiln.export(conv, x)
    words = [g.description for g in guards]
    assert "L['self'].stride == (2, 2)" in words, words
    assert not any("stride[" in w or "len(L['self'].stride)" in w for w in words), words
    conv.stride = tuple([2, 2])         # another tuple, equal: the same graph serves
    torch.testing.assert_close(f(x), conv(x))
    assert len(graphs) == 1
    conv.stride = (1, 1)                # a changed value: a new graph, right values
    torch.testing.assert_close(f(x), conv(x))
    assert len(graphs) == 2


def test_item_types_are_guarded_exactly():
    graphs = []

    def fn(x, t):
        return x * t[0] + t[1][0]

    f = kiln.compile(fn, backend=_counting(graphs))
    x = torch.arange(4)
    for t in ((2, (3,)), tuple([2, tuple([3])]), (2.0, (3,)), (2, (3.0,)), (True, (3,))):
        got, want = f(x, t), fn(x, t)
        assert got.dtype == want.dtype and torch.equal(got, want), (t, got, want)
    # the equal tuple reuses the first graph; each change of an item's type is a graph
    assert len(graphs) == 4


def test_nan_and_signed_zero_items():
    graphs = []

    def fn(x, t):
        return x + t[0] * 0 + torch.copysign(torch.ones(()), torch.tensor(t[1]))

    f = kiln.compile(fn, backend=_counting(graphs))
    x = torch.zeros(3)
    for t in ((float("nan"), 0.0), (float("nan"), 0.0), (1.0, -0.0)):
        torch.testing.assert_close(f(x, t), fn(x, t), equal_nan=True)
    assert len(graphs) == 2
