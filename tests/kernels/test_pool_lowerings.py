"""Pooling and functional-copy lowerings (``kiln/kernels/lowering/pool.py``): compared
with eager on awkward shapes — padding, ceil mode, dilation, NaN and -inf in windows,
non-contiguous inputs — through the C++ path (and not falling back)."""
import pytest
import torch
import torch.fx as fx

from kiln.kernels import compile_aten_graph

aten = torch.ops.aten


def _run(f, *args, exact=True):
    c = compile_aten_graph(fx.symbolic_trace(f), list(args))
    got, ref = c(*args), f(*args)
    assert c.artefacts["fallbacks"] == [], c.artefacts["fallbacks"]
    for g, e in zip(got, ref):
        if exact:
            torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(g, e, equal_nan=True)
    return c


@pytest.mark.parametrize("kernel,stride,padding,dilation,ceil", [
    ([3, 3], [2, 2], [1, 1], [1, 1], False),      # resnet's stem pool
    ([2, 2], [2, 2], [0, 0], [1, 1], False),
    ([3, 3], [2, 2], [0, 0], [1, 1], True),       # ceil mode: windows past the edge
    ([3, 2], [1, 2], [1, 0], [2, 1], False),      # dilation, uneven kernel
    ([1, 1], [], [0, 0], [1, 1], False),
])
def test_max_pool2d_with_indices(kernel, stride, padding, dilation, ceil):
    def f(x):
        v, i = aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation, ceil)
        return (v, i)
    x = torch.randn(2, 3, 11, 9)
    x[0, 0, 2, 3] = float("nan")
    x[1, 2] = float("-inf")                        # a plane of -inf: indices of first taps
    x[1, 1, 4:6, 4:6] = 1.5                        # ties: the first one wins
    _run(f, x)
    _run(f, torch.randn(3, 9, 11).transpose(1, 2))  # 3-D and non-contiguous


def test_max_pool_over_fused_normalisation_stays_small():
    """resnet's stem: a pool over BatchNorm+ReLU, its indices unused (inference). The
    kernel must mask only the taps that can fall outside (5 of 9 for a 3x3/2 window
    with padding 1), load the per-channel statistics once rather than once per masked
    tap, and not compute the indices nobody reads: each was seconds of Triton compile
    time on resnet18."""
    def f(x, mean, w):
        y = aten.relu.default(aten.mul.Tensor(aten.sub.Tensor(x, mean), w))
        v, _ = aten.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])
        return (v,)
    x = torch.randn(2, 3, 8, 8)
    x[0, 1, 0, 0] = float("nan")
    c = _run(f, x, torch.randn(3, 1, 1), torch.randn(3, 1, 1))
    src = c.artefacts["source"]
    assert src.count("? in0[") == 5, src
    assert src.count("in1[") == 1 and src.count("in2[") == 1, src
    import re
    assert re.findall(r"buf\d+", c.artefacts["schedule"]) == ["buf0"], c.artefacts["schedule"]


@pytest.mark.parametrize("ceil,include_pad,override", [
    (False, True, None), (False, False, None), (True, True, None), (True, False, None),
    (False, True, 3)])
def test_avg_pool2d_and_backward(ceil, include_pad, override):
    args = ([3, 3], [2, 2], [1, 1], ceil, include_pad, override)

    def f(x, g):
        return (aten.avg_pool2d.default(x, *args),
                aten.avg_pool2d_backward.default(g, x, *args),
                aten.avg_pool2d.default(x, [3, 3], [1, 1], [1, 1], False, include_pad),)
    x = torch.randn(2, 4, 8, 11, dtype=torch.float64)
    g = torch.randn_like(aten.avg_pool2d.default(x, *args))
    _run(f, x, g, exact=False)


@pytest.mark.parametrize("out", [[1, 1], [2, 5], [7, 10]])
def test_adaptive_avg_pool2d_and_backward(out):
    def f(x, g):
        return (aten._adaptive_avg_pool2d.default(x, out),
                aten._adaptive_avg_pool2d_backward.default(g, x))
    x = torch.randn(2, 3, 14, 10)
    g = torch.randn(2, 3, *out)
    _run(f, x, g, exact=False)


def test_adaptive_avg_pool2d_of_a_single_pixel_broadcasts():
    def f(x):            # alexnet at small resolutions: 1x1 features pooled to 6x6
        return (aten._adaptive_avg_pool2d.default(x, [6, 6]),)
    _run(f, torch.randn(2, 5, 1, 1), exact=False)


def test_functional_copy_broadcasts_and_casts():
    def f(a, b):
        return (aten.copy.default(a, b),
                aten.copy.default(a, aten.select.int(aten.select.int(b, 0, 0), 0, 1)))
    _run(f, torch.randn(4, 5), torch.randn(1, 5, dtype=torch.float64), exact=False)


def test_adaptive_pool_that_does_not_divide_falls_back():
    def f(x):
        return (aten._adaptive_avg_pool2d.default(x, [3, 3]),)
    x = torch.randn(1, 2, 7, 7)
    c = compile_aten_graph(fx.symbolic_trace(f), [x])
    assert c.artefacts["fallbacks"] == ["aten._adaptive_avg_pool2d.default"]
    torch.testing.assert_close(c(x)[0], f(x)[0])


@pytest.mark.parametrize("kernel,stride,padding,dilation", [
    ([3, 3], [2, 2], [1, 1], [1, 1]), ([2, 2], [2, 2], [0, 0], [1, 1]),
    ([3, 3], [1, 1], [1, 1], [1, 1]), ([3, 2], [2, 1], [1, 0], [2, 1])])
@pytest.mark.parametrize("hw", [(12, 10), (15, 9)])     # (15, 9): not whole strides
def test_max_pool2d_backward_gathers_what_eager_scatters(kernel, stride, padding, dilation, hw):
    x = torch.randn(2, 3, *hw, dtype=torch.float64)
    x[0, 0, :4, :4] = 0.5                       # ties: several windows pick one element
    v, i = torch.ops.aten.max_pool2d_with_indices.default(x, kernel, stride, padding, dilation)
    g = torch.randn_like(v)

    def f(g, x, i):
        return (aten.max_pool2d_with_indices_backward.default(
            g, x, kernel, stride, padding, dilation, False, i),)
    c = _run(f, g, x, i, exact=False)
    assert c(g, x, i)[0].is_contiguous()


def test_adaptive_avg_pool2d_backward_of_a_single_pixel_sums():
    def f(g, x):
        return (aten._adaptive_avg_pool2d_backward.default(g, x),)
    _run(f, torch.randn(2, 5, 6, 6), torch.randn(2, 5, 1, 1), exact=False)


def test_channels_last_pool_backwards_keep_eagers_layout():
    """Pool backwards of channels-last tensors (coatnet's) are lowered too: the kernel
    computes them in its own layout and a graph output is copied into eager's."""
    aten = torch.ops.aten
    x = torch.randn(2, 3, 8, 9).to(memory_format=torch.channels_last)
    g = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)

    def f(g, x):
        return (aten.avg_pool2d_backward.default(g, x, [3, 3], [2, 2], [1, 1], False, True, None),
                aten.mul.Tensor(aten.avg_pool2d_backward.default(
                    g, x, [3, 3], [2, 2], [1, 1], False, False, None), 2.0))
    c = compile_aten_graph(fx.symbolic_trace(f), [g, x], target="cpp")
    for got, want in zip(c(g, x), f(g, x)):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert c.artefacts["fallbacks"] == []
