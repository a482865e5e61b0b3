"""Scaled-dot-product attention kept whole: ``kiln.sdpa`` and ``kiln.sdpa_backward``.

Tracing runs on meta tensors, where ``F.scaled_dot_product_attention`` (a
CompositeImplicitAutograd op) takes the math path: matmuls, a softmax and their
backward, so the graph would never use the device's flash / memory-efficient kernels.
With an op set whose ``whole_attention`` is on, the tracer catches the call one level
up (``AttentionMode``, a ``TorchFunctionMode``) and records two ops instead:

* ``kiln.sdpa(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, layout)``
  runs ``F.scaled_dot_product_attention`` itself at run time, so PyTorch picks the
  kernel exactly as eager does (flash, efficient, cuDNN, the CPU flash kernel…). Its
  output strides are fixed at trace time (``layout``: 0 contiguous, 1 the
  (B, L, H, E)-major layout the fused CUDA kernels return), and a result with other
  strides is copied into that layout, so view ops recorded after it stay valid.
* ``kiln.sdpa_backward(grad, q, k, v, attn_mask, …, mask_grad)`` recomputes the
  attention under autograd on the real tensors and returns the gradients of q, k, v
  (and the mask when it needs one): the fused backward kernels run, at the price of
  one attention forward in the backward (as activation checkpointing would). The
  forward saves q, k, v (and the mask) only, never the (L x S) attention matrix.

Attention with dropout (``dropout_p > 0``) is left to the math path: recomputing it
would draw a different mask, and the math path draws it once, as a recorded op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
            "float dropout_p=0.0, bool is_causal=False, float? scale=None, "
            "bool enable_gqa=False, int layout=0) -> Tensor")
_lib.define("sdpa_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
            "Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, "
            "bool enable_gqa, bool mask_grad) -> Tensor[]")

#: ``layout`` values
CONTIGUOUS, BLHE = 0, 1


def _out_strides(shape, layout):
    if layout == BLHE and len(shape) == 4:
        b, h, l, e = shape
        return (l * h * e, e, h * e, 1)
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(strides))


def _out_shape(q, v):
    return (*q.shape[:-1], v.shape[-1])


def _call(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
    kw = {"enable_gqa": True} if enable_gqa else {}
    if mask is not None and mask.dim() and mask.stride(-1) != 1:
        # the fused CUDA kernels need the mask's last dim dense (PyTorch falls back to
        # the math path otherwise); a mask the backward gets back as a broadcast view
        # of what the forward saved (bert's: strides (0, 512, 1, 0)) is made so here
        mask = mask.contiguous()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                          is_causal=is_causal, scale=scale, **kw)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False, layout=CONTIGUOUS):
    out = _call(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    strides = _out_strides(tuple(out.shape), layout)
    if out.stride() != strides and out.numel() > 1:
        fixed = torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)
        out = fixed.copy_(out)
    return out


def _sdpa_meta(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False, layout=CONTIGUOUS):
    shape = _out_shape(q, v)
    return torch.empty_strided(shape, _out_strides(shape, layout), dtype=q.dtype,
                               device=q.device)


def _sdpa_backward(grad, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                   mask_grad):
    with torch.enable_grad():
        qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
        ins = [qq, kk, vv]
        mask = attn_mask
        if mask_grad:
            mask = attn_mask.detach().requires_grad_()
            ins.append(mask)
        out = _call(qq, kk, vv, mask, dropout_p, is_causal, scale, enable_gqa)
        grads = torch.autograd.grad(out, ins, grad)
    # the meta kernel promised empty_like(input) layouts; the fused kernels may return
    # another, and view ops recorded after this one depend on the promise
    return [_like(g, t) for g, t in zip(grads, ins)]


def _like(g, t):
    want = torch.empty_like(t)
    if g.stride() == want.stride() or g.numel() <= 1:
        return g
    return want.copy_(g)


def _sdpa_backward_meta(grad, q, k, v, attn_mask, dropout_p, is_causal, scale,
                        enable_gqa, mask_grad):
    outs = [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]
    if mask_grad:
        outs.append(torch.empty_like(attn_mask))
    return outs


_lib.impl("sdpa", _sdpa, "CompositeExplicitAutograd")
_lib.impl("sdpa", _sdpa_meta, "Meta")
_lib.impl("sdpa_backward", _sdpa_backward, "CompositeExplicitAutograd")
_lib.impl("sdpa_backward", _sdpa_backward_meta, "Meta")

SDPA = torch.ops.kiln.sdpa.default
SDPA_BACKWARD = torch.ops.kiln.sdpa_backward.default


class _WholeAttention(torch.autograd.Function):
    """Used while tracing only: forward and backward are one recorded op each."""

    @staticmethod
    def forward(ctx, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, layout):
        ctx.params = (dropout_p, is_causal, scale, enable_gqa)
        ctx.mask_grad = mask is not None and mask.requires_grad
        ctx.has_mask = mask is not None
        ctx.save_for_backward(q, k, v, *([mask] if mask is not None else []))
        return SDPA(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, layout)

    @staticmethod
    def backward(ctx, grad):
        q, k, v, *rest = ctx.saved_tensors
        mask = rest[0] if ctx.has_mask else None
        grads = SDPA_BACKWARD(grad, q, k, v, mask, *ctx.params, ctx.mask_grad)
        gmask = grads[3] if ctx.mask_grad else None
        return grads[0], grads[1], grads[2], gmask, None, None, None, None, None


_SDPA_FUNCTIONS = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}


def _bind(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, *,
          enable_gqa=False):
    return q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa


class AttentionMode(TorchFunctionMode):
    """While tracing: ``F.scaled_dot_product_attention`` -> ``_WholeAttention``.
    ``device_of(t)`` gives a meta tensor's real device (for the output layout)."""

    def __init__(self, device_of):
        super().__init__()
        self.device_of = device_of

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA_FUNCTIONS:
            try:
                q, k, v, mask, p, causal, scale, gqa = _bind(*args, **kwargs)
            except TypeError:
                return func(*args, **kwargs)
            if p == 0.0 and all(isinstance(t, torch.Tensor) for t in (q, k, v)) and \
                    (mask is None or isinstance(mask, torch.Tensor)):
                dev = self.device_of(q)
                layout = BLHE if dev is not None and dev.type == "cuda" else CONTIGUOUS
                return _WholeAttention.apply(q, k, v, mask, float(p), bool(causal), scale,
                                             bool(gqa), layout)
        return func(*args, **kwargs)
