"""Library calls with a layout of kiln's choosing: half-precision 2-d convolutions run
channels-last on the GPU (cuDNN's tensor-core kernels are NHWC)."""

from __future__ import annotations

import torch

from ..ops import cast, op
from .base import (Lazy, Unsupported, View, channels_last_strides, is_box, is_channels_last,
                   is_dense_channels_last, register)

aten = torch.ops.aten


# --- library calls with a layout of our choosing ---------------------------------------
#: dtypes whose 2-d convolutions run channels-last on the Triton (GPU) path: cuDNN's
#: tensor-core kernels are NHWC; given NCHW it transposes in and out around each call
#: (two extra kernels, and their launch cost, per convolution).
CHANNELS_LAST_DTYPES = {torch.bfloat16, torch.float16}


@register(aten.convolution.default)
def _convolution(lo, node, x, w, b, stride, padding, dilation, transposed, output_padding,
                 groups):
    if (lo.target != "triton" or not is_box(x) or len(x.sizes) != 4 or transposed
            or x.dtype not in CHANNELS_LAST_DTYPES):
        raise Unsupported("K0211", "convolution stays as the graph has it")
    cl = channels_last_strides(x.sizes)
    if not (isinstance(x, View) and is_channels_last(x.sizes, x.strides)):
        lazy = x if isinstance(x, Lazy) else Lazy(x.sizes, x.dtype, x.load)
        x = lo.realize(Lazy(lazy.sizes, lazy.dtype, lazy.fn, cl), strides=cl, origin=node.name)
    if is_box(w) and len(w.sizes) == 4 and not (isinstance(w, View) and
                                                 is_dense_channels_last(w.sizes, w.strides)):
        # cuDNN takes the weight in the input's layout: given a contiguous (NCHW) one,
        # ATen copies it channels-last on every call, in a copy kernel per convolution
        # (17 of resnet18's 20). Our kernel makes that copy instead, vectorised.
        wl = w if isinstance(w, Lazy) else Lazy(w.sizes, w.dtype, w.load)
        wcl = channels_last_strides(w.sizes)
        w = lo.realize(Lazy(wl.sizes, wl.dtype, wl.fn, wcl), strides=wcl, origin=node.name)
    # the bias is added by kiln, in the kernel that reads the result: ATen adds it in a
    # kernel of its own after cuDNN's (one launch per convolution with a bias: a
    # squeeze-excitation block's two). Its rounding is ATen's: the product rounded to
    # the output dtype, then the sum.
    split = b is not None and is_box(b) and len(b.sizes) == 1 and b.dtype == x.dtype
    out = lo.fallback(node, (x, w, None if split else b, stride, padding, dilation,
                             transposed, output_padding, groups), {}, "library call")
    # cuDNN (and oneDNN) give a channels-last result for a channels-last input; the meta
    # kernel does not say so. Should a library disagree, the runtime copies (_fix_layout).
    ext = lo.by_name[out.buf]
    ext.strides = channels_last_strides(ext.sizes)
    lo.relaid.add(ext.name)
    product = View(out.buf, out.sizes, ext.strides, 0, out.dtype)
    if not split:
        return product
    dt = out.dtype
    return Lazy(product.sizes, dt,
                lambda idx: cast(op("add", cast(product.load(idx), dt),
                                    cast(b.load([idx[1]]), dt)), dt), ext.strides)
