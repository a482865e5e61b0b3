"""Bilinear resampling: ``upsample_bilinear2d`` as gathers, its backward as a scatter.

Each output row (column) reads two input rows (columns) with two weights, computed from
the output index with eager's CPU formulas in eager's order: the source coordinate
``scale * (i + 0.5) - 0.5`` clamped at 0 (``scale * i`` with ``align_corners``), its
integer part capped at the last row, the neighbour one further unless that is past the
edge, and the output ``(x00 * w0 + x01 * w1) * h0 + (x10 * w0 + x11 * w1) * h1``. The
indices are not affine in the output index, so they are gather terms (``ir.Load.gather``)
— always in range by construction.

The backward adds each gradient element, times the product of its two weights, to the
four input elements it was read from: an ``ir.Scatter`` over (N, C, H_out, W_out, 2, 2),
taps innermost in eager's order, parallel over N and C (which never collide).
"""
from __future__ import annotations

import torch

from .. import ir
from ..ir import Index
from .base import Lazy, Unsupported, View, as_expr, is_box, register
from .index import scatter_buffer, stored
from ..ops import cast, const, op

aten = torch.ops.aten
_I64 = torch.int64


def _opmath(dtype):
    if dtype == torch.float64:
        return torch.float64
    if dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.float32
    raise Unsupported("K0205", f"bilinear resampling of {dtype}")


def _ratio(insize, outsize, align_corners, scale, opdt):
    """``area_pixel_compute_scale`` in the op's math type."""
    if align_corners:
        return float(torch.tensor(insize - 1, dtype=opdt) / (outsize - 1)) if outsize > 1 else 0.0
    if scale is not None and scale > 0:
        return float(torch.tensor(1.0 / scale, dtype=torch.float64).to(opdt))
    return float(torch.tensor(insize, dtype=opdt) / outsize)


def _axis(i, insize, outsize, align_corners, scale, opdt):
    """(first index, second index, first weight, second weight) of output index ``i``
    (an ``Affine`` loop variable) along one axis."""
    if insize == outsize:
        e = Index(i) if i.terms else const(i.const, _I64)
        return e, e, const(1.0, opdt), const(0.0, opdt)
    ratio = const(_ratio(insize, outsize, align_corners, scale, opdt), opdt)
    pos = cast(Index(i) if i.terms else const(i.const, _I64), opdt)
    if align_corners:
        real = op("mul", ratio, pos)
    else:
        real = op("sub", op("mul", ratio, op("add", pos, const(0.5, opdt))), const(0.5, opdt))
        real = op("maximum", real, const(0.0, opdt))
    i0 = op("minimum", cast(real, _I64), const(insize - 1, _I64))
    lam1 = op("minimum", op("maximum", op("sub", real, cast(i0, opdt)), const(0.0, opdt)),
              const(1.0, opdt))
    step = op("where", op("lt", i0, const(insize - 1, _I64)), const(1, _I64), const(0, _I64))
    return i0, op("add", i0, step), op("sub", const(1.0, opdt), lam1), lam1


def _tap(xv: View, n, c, ih, iw, opdt):
    index = ir.Affine.c(xv.offset) + n * xv.strides[0] + c * xv.strides[1]
    return cast(ir.Load(xv.buf, index, xv.dtype, None, ((ih, xv.strides[2]), (iw, xv.strides[3]))),
                opdt)


@register(aten.upsample_bilinear2d.default)
def _upsample_bilinear2d(lo, node, x, output_size, align_corners, scales_h=None,
                         scales_w=None):
    xv = stored(lo, node, x)
    if len(xv.sizes) != 4:
        raise Unsupported("K0205", "upsample_bilinear2d of a non-4-d tensor")
    m = lo.out_meta(node)
    sizes, dtype = tuple(int(s) for s in m.shape), m.dtype
    opdt = _opmath(dtype)
    H, W = int(xv.sizes[2]), int(xv.sizes[3])
    Ho, Wo = sizes[2], sizes[3]

    def body(idx):
        n, c, oh, ow = idx
        h0, h1, wh0, wh1 = _axis(oh, H, Ho, align_corners, scales_h, opdt)
        w0, w1, ww0, ww1 = _axis(ow, W, Wo, align_corners, scales_w, opdt)

        def row(ih):
            return op("add", op("mul", _tap(xv, n, c, ih, w0, opdt), ww0),
                      op("mul", _tap(xv, n, c, ih, w1, opdt), ww1))
        return cast(op("add", op("mul", row(h0), wh0), op("mul", row(h1), wh1)), dtype)
    return Lazy(sizes, dtype, body)


@register(aten.upsample_bilinear2d.vec)
def _upsample_bilinear2d_vec(lo, node, x, output_size, align_corners, scale_factors):
    m = lo.out_meta(node)
    sh, sw = (None, None) if not scale_factors else tuple(scale_factors)
    return _upsample_bilinear2d(lo, node, x, list(m.shape[2:]), align_corners, sh, sw)


@register(aten.upsample_bilinear2d_backward.default)
def _upsample_bilinear2d_backward(lo, node, grad, output_size, input_size, align_corners,
                                  scales_h=None, scales_w=None):
    if not is_box(grad) or len(grad.sizes) != 4:
        raise Unsupported("K0205", "upsample_bilinear2d_backward of a non-4-d gradient")
    m = lo.out_meta(node)
    sizes, dtype = tuple(int(s) for s in m.shape), m.dtype
    opdt = _opmath(dtype)
    if lo.target != "cpp" and dtype not in (torch.float32, torch.float64):
        raise Unsupported("K0208", "Triton accumulates float32/64 only (atomics)")
    N, C, H, W = sizes
    Ho, Wo = (int(s) for s in output_size)
    if lo.target != "cpp" and 0 in (N, C, H, W, Ho, Wo):
        raise Unsupported("K0206", "an empty scatter")
    iter_sizes = (N, C, Ho, Wo, 2, 2)

    def pick(t, a, b):
        return op("where", op("eq", Index(t), const(0, _I64)), a, b)

    def tap(v):
        """(row, column, weight) of tap (th, tw) of output pixel (n, c, oh, ow)."""
        n, c, oh, ow, th, tw = v
        h0, h1, wh0, wh1 = _axis(oh, H, Ho, align_corners, scales_h, opdt)
        w0, w1, ww0, ww1 = _axis(ow, W, Wo, align_corners, scales_w, opdt)
        return pick(th, h0, h1), pick(tw, w0, w1), op("mul", pick(th, wh0, wh1),
                                                      pick(tw, ww0, ww1))

    def value(idx):
        g = as_expr(grad, list(idx[:4]), (N, C, Ho, Wo), opdt)
        return cast(op("mul", tap(idx)[2], g), dtype)

    def dest(out, ivars):
        row, col, _ = tap(ivars)
        st = out.strides
        return ir.Load(out.buf, ivars[0] * st[0] + ivars[1] * st[1], dtype, None,
                       ((row, st[2]), (col, st[3])))
    return scatter_buffer(lo, node, 0, iter_sizes, dest, Lazy(iter_sizes, dtype, value), True,
                          (0, 1))
