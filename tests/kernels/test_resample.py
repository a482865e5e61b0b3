"""Bilinear resampling (``lowering_resample.py``): upsample_bilinear2d as gathers at
computed rows and columns, its backward as a 4-tap scatter — against eager on up- and
down-sampling, equal sizes, size-1 sides, align_corners and explicit scales, float32
and float64, with no fallback; and F.interpolate's gradient through the kiln backend."""
import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import kiln
from kiln.kernels import compile_aten_graph

aten = torch.ops.aten
SHAPES = [(5, 7, 11, 3), (4, 4, 8, 8), (6, 5, 6, 9), (1, 3, 4, 1), (9, 8, 3, 2)]


def _close(got, want):
    eps = torch.finfo(want.dtype).eps
    torch.testing.assert_close(got, want, rtol=8 * eps, atol=8 * eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_match_eager(shape, align, dtype):
    H, W, Ho, Wo = shape
    x = torch.randn(2, 3, H, W, dtype=dtype)
    g = torch.randn(2, 3, Ho, Wo, dtype=dtype)

    def f(x, g):
        return (aten.upsample_bilinear2d.default(x, [Ho, Wo], align),
                aten.upsample_bilinear2d_backward.default(g, [Ho, Wo], [2, 3, H, W], align))
    c = compile_aten_graph(fx.symbolic_trace(f), [x, g], target="cpp")
    for got, want in zip(c(x, g), f(x, g)):
        _close(got, want)
    assert c.artefacts["fallbacks"] == []


def test_explicit_scales():
    x = torch.randn(1, 2, 6, 5)

    def f(x):
        return (aten.upsample_bilinear2d.default(x, [9, 12], False, 1.7, 2.5),)
    c = compile_aten_graph(fx.symbolic_trace(f), [x], target="cpp")
    _close(c(x)[0], f(x)[0])


def test_interpolate_gradient_through_kiln():
    def fn(x):
        return F.interpolate(x.sin(), scale_factor=2, mode="bilinear").square().sum()
    x = torch.randn(2, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    kiln.compile(fn)(x).backward()
    got = x.grad.clone()
    x.grad = None
    fn(x).backward()
    torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-12)
