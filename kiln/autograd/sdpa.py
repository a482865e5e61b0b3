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

In training, where the fused kernel eager would pick can be named at trace time (the
CUDA flash, memory-efficient and cuDNN kernels, the CPU flash kernel), two other ops are
recorded instead, so that the backward does not run the attention again:

* ``kiln.sdpa_fused(q, k, v, attn_mask, is_causal, scale, kernel, layout)`` calls that
  kernel's aten op directly (with eager's mask preparation: boolean to additive, padded
  and expanded for the efficient kernel) and returns the output and the kernel's
  logsumexp;
* ``kiln.sdpa_fused_backward(grad, q, k, v, attn_mask, out, logsumexp, is_causal,
  scale, kernel)`` calls the same kernel's backward, as eager's autograd formula does.

``kernel`` is ``torch._fused_sdp_choice``'s answer for tensors of the traced shapes,
strides and dtypes on the real device (asked at trace time). Masks that need a
gradient, grouped-query attention and other kernels keep ``kiln.sdpa_backward``.

Attention with dropout (``dropout_p > 0``) is left to the math path: recomputing it
would draw a different mask, and the math path draws it once, as a recorded op.
"""
from __future__ import annotations

import contextlib
import threading

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

aten = torch.ops.aten

_lib = torch.library.Library("kiln", "FRAGMENT")
_lib.define("sdpa(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None, "
            "float dropout_p=0.0, bool is_causal=False, float? scale=None, "
            "bool enable_gqa=False, int layout=0) -> Tensor")
_lib.define("sdpa_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
            "Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, "
            "bool enable_gqa, bool mask_grad) -> Tensor[]")
_lib.define("sdpa_fused(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, "
            "bool is_causal, float? scale, int kernel, int layout) -> (Tensor, Tensor)")
_lib.define("sdpa_fused_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
            "Tensor? attn_mask, Tensor out, Tensor logsumexp, bool is_causal, float? scale, "
            "int kernel) -> Tensor[]")

#: ``layout`` values
CONTIGUOUS, BLHE = 0, 1
#: ``kernel`` values: ``torch.nn.attention.SDPBackend``'s numbers for the kernels whose
#: forward and backward ``sdpa_fused`` calls itself (on the CPU only FLASH is one)
FLASH, EFFICIENT, CUDNN = 1, 2, 3
_FUSED = {"cpu": {FLASH}, "cuda": {FLASH, EFFICIENT, CUDNN}}


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


def _dense_last_dim(mask):
    """The fused CUDA kernels need the mask's last dim dense (PyTorch falls back to the
    math path otherwise); a mask the backward gets back as a broadcast view of what the
    forward saved (bert's: strides (0, 512, 1, 0)) is made so here."""
    if mask is not None and mask.dim() and mask.stride(-1) != 1:
        return mask.contiguous()
    return mask


def _call(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa):
    kw = {"enable_gqa": True} if enable_gqa else {}
    mask = _dense_last_dim(mask)
    stream = getattr(_stream, "on", False) and q.device.type == "cuda"
    with _stream_order() if stream else contextlib.nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, **kw)


#: per thread: is a graph compiled per size of a stream running (``in_stream``)?
_stream = threading.local()


def in_stream(on: bool) -> bool:
    """Mark this thread's calls as those of a graph compiled per size of a stream
    (``autograd/specialize.PerSizeGraph``), returning the mark before. Its attention
    then runs the flash or the memory-efficient kernel, never cuDNN's: cuDNN builds an
    execution plan per new shape, 47 ms on an H100 (torch 2.11, bf16, causal,
    4x8xLx64) where the other two take 0.05 ms, and every call of a stream brings a
    new shape (a LLaMA over 21 lengths: a second of its first pass). At those shapes
    the flash kernel also ran faster once planned (0.04 against 0.15 ms). cuDNN is
    left out rather than put last: PyTorch keeps it first on Hopper whatever priority
    order it is given. The results are the same attention to the kernels' rounding, as
    eager's own choice between them varies with the shapes; where neither kernel
    applies, the math path runs."""
    before = getattr(_stream, "on", False)
    _stream.on = on
    return before


def _stream_order():
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False, layout=CONTIGUOUS):
    return _fixed_layout(_call(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa),
                         layout)


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


def _fixed_layout(out, layout):
    strides = _out_strides(tuple(out.shape), layout)
    if out.stride() != strides and out.numel() > 1:
        fixed = torch.empty_strided(out.shape, strides, dtype=out.dtype, device=out.device)
        out = fixed.copy_(out)
    return out


def _lse_shape(q, kernel):
    """The logsumexp's shape each kernel returns (contiguous once ``sdpa_fused`` is
    done): the efficient kernel pads the query length to a multiple of 32, cuDNN keeps
    a trailing 1."""
    b, h, length = q.shape[0], q.shape[1], q.shape[2]
    if kernel == EFFICIENT and q.device.type != "cpu":
        return (b, h, -(-length // 32) * 32)
    if kernel == CUDNN:
        return (b, h, length, 1)
    return (b, h, length)


def _kernel_mask(mask, q, k, kernel):
    """The mask as eager's ``scaled_dot_product_attention`` hands it to ``kernel``:
    last dim dense, boolean turned additive (-inf where False); for the efficient CUDA
    kernel, rows padded to a multiple of 8 elements and expanded to (B, H, L, S)."""
    if mask is None:
        return None
    mask = _dense_last_dim(mask)
    if mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(),
                                                                  float("-inf"))
    if kernel == EFFICIENT and q.device.type != "cpu":
        if mask.stride(-1) != 1 or any(st % 8 for st in mask.stride()[:-1]):
            n = mask.shape[-1]
            mask = F.pad(mask, (0, 8 - n % 8))[..., :n]
        mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return mask


def _sdpa_fused(q, k, v, attn_mask, is_causal, scale, kernel, layout):
    m = _kernel_mask(attn_mask, q, k, kernel)
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, is_causal, attn_mask=m, scale=scale)
    elif kernel == EFFICIENT:
        out, lse = aten._scaled_dot_product_efficient_attention(
            q, k, v, m, True, 0.0, is_causal, scale=scale)[:2]
    elif kernel == FLASH:
        out, lse = aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal, False, scale=scale)[:2]
    else:
        out, lse = aten._scaled_dot_product_cudnn_attention(
            q, k, v, m, True, 0.0, is_causal, False, scale=scale)[:2]
    return _fixed_layout(out, layout), lse.contiguous()


def _lse_dtype(q):
    """float32, but float64 for float64 queries (only the CPU kernel takes those)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _sdpa_fused_meta(q, k, v, attn_mask, is_causal, scale, kernel, layout):
    return (_sdpa_meta(q, k, v, layout=layout),
            torch.empty(_lse_shape(q, kernel), dtype=_lse_dtype(q), device=q.device))


def _sdpa_fused_backward(grad, q, k, v, attn_mask, out, lse, is_causal, scale, kernel):
    """Eager's backward formula for ``kernel`` (no dropout: its random state is unused,
    so an empty one stands in)."""
    m = _kernel_mask(attn_mask, q, k, kernel)
    length, source = q.shape[2], k.shape[2]
    if grad.stride() != out.stride():
        # the kernels assume the incoming gradient is laid out as their output (eager's
        # autograd hands it over so); cuDNN's backward silently gives wrong gradients for
        # a (B, H, L, E)-contiguous one against its (B, L, H, E)-major output
        grad = torch.empty_like(out).copy_(grad)
    if q.device.type == "cpu":
        grads = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad, q, k, v, out, lse, 0.0, is_causal, attn_mask=m, scale=scale)
    elif kernel == EFFICIENT:
        rng = torch.empty((), dtype=torch.long)
        grads = aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, m, out, lse, rng, rng, 0.0, [True, True, True, False], is_causal,
            scale=scale)[:3]
    elif kernel == FLASH:
        rng = torch.empty(0, dtype=torch.long)
        grads = aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, None, None, length, source, 0.0, is_causal, rng, rng,
            scale=scale)
    else:
        rng = torch.empty((), dtype=torch.long, device=q.device)
        grads = aten._scaled_dot_product_cudnn_attention_backward(
            grad, q, k, v, out, lse, rng, rng, m, None, None, length, source, 0.0, is_causal,
            scale=scale)
    return [_like(g, t) for g, t in zip(grads, (q, k, v))]


def _sdpa_fused_backward_meta(grad, q, k, v, attn_mask, out, lse, is_causal, scale, kernel):
    return [torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)]


_lib.impl("sdpa", _sdpa, "CompositeExplicitAutograd")
_lib.impl("sdpa", _sdpa_meta, "Meta")
_lib.impl("sdpa_backward", _sdpa_backward, "CompositeExplicitAutograd")
_lib.impl("sdpa_backward", _sdpa_backward_meta, "Meta")
_lib.impl("sdpa_fused", _sdpa_fused, "CompositeExplicitAutograd")
_lib.impl("sdpa_fused", _sdpa_fused_meta, "Meta")
_lib.impl("sdpa_fused_backward", _sdpa_fused_backward, "CompositeExplicitAutograd")
_lib.impl("sdpa_fused_backward", _sdpa_fused_backward_meta, "Meta")

SDPA = torch.ops.kiln.sdpa.default
SDPA_BACKWARD = torch.ops.kiln.sdpa_backward.default
SDPA_FUSED = torch.ops.kiln.sdpa_fused.default
SDPA_FUSED_BACKWARD = torch.ops.kiln.sdpa_fused_backward.default


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


class _SavedAttention(torch.autograd.Function):
    """Used while tracing only: the fused kernel's forward, saving its logsumexp, and
    its backward from it (``sdpa_fused``, ``sdpa_fused_backward``)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, is_causal, scale, kernel, layout):
        out, lse = SDPA_FUSED(q, k, v, mask, is_causal, scale, kernel, layout)
        ctx.params = (is_causal, scale, kernel)
        ctx.has_mask = mask is not None
        ctx.save_for_backward(q, k, v, out, lse, *([mask] if mask is not None else []))
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, *rest = ctx.saved_tensors
        mask = rest[0] if ctx.has_mask else None
        dq, dk, dv = SDPA_FUSED_BACKWARD(grad, q, k, v, mask, out, lse, *ctx.params)
        return dq, dk, dv, None, None, None, None, None


def fused_kernel(q, k, v, mask, is_causal, scale, device) -> int | None:
    """The fused kernel eager's ``scaled_dot_product_attention`` would run for tensors
    of these (meta) tensors' shapes, strides, dtypes and ``requires_grad`` on ``device``
    (``torch._fused_sdp_choice`` on empty ones there), if ``sdpa_fused`` can call it;
    else None."""
    if device is None or device.type not in _FUSED or q.dim() != 4 or k.dim() != 4 \
            or v.dim() != 4 or (mask is not None and mask.requires_grad):
        return None
    if device.type == "cuda" and not torch.cuda.is_available():
        return None                 # graphs for a GPU traced without one: recompute
    if is_symbolic([q, k, v, mask]):
        return None     # eager's choice may change with the sizes: kiln.sdpa asks per call

    def real(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)
    with _disable_current_modes(), torch.enable_grad():
        qq, kk, vv = (real(t).requires_grad_(t.requires_grad) for t in (q, k, v))
        mm = _dense_last_dim(real(mask)) if mask is not None else None
        choice = int(torch._fused_sdp_choice(qq, kk, vv, mm, 0.0, is_causal, scale=scale,
                                             enable_gqa=False))
    if choice == FLASH and device.type == "cuda" and (q.shape[-1] % 8 or v.shape[-1] % 8):
        return None     # eager pads such heads for the CUDA flash kernel first; recompute
    return choice if choice in _FUSED[device.type] else None


def is_symbolic(xs) -> bool:
    return any(isinstance(t, torch.Tensor) and any(isinstance(n, torch.SymInt) for n in t.shape)
               for t in xs)


_SDPA_FUNCTIONS = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}
_functorch_level = torch._C._functorch.peek_interpreter_stack


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
        # inside a torch.func transform (a captured ``vmap(attention)``) functorch's own
        # rules for the op give the aten ops: ``_WholeAttention`` has none
        if func in _SDPA_FUNCTIONS and _functorch_level() is None:
            try:
                q, k, v, mask, p, causal, scale, gqa = _bind(*args, **kwargs)
            except TypeError:
                return func(*args, **kwargs)
            if p == 0.0 and all(isinstance(t, torch.Tensor) for t in (q, k, v)) and \
                    (mask is None or isinstance(mask, torch.Tensor)):
                dev = self.device_of(q)
                layout = BLHE if dev is not None and dev.type == "cuda" else CONTIGUOUS
                training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                kernel = None
                if training and not gqa:
                    kernel = fused_kernel(q, k, v, mask, bool(causal), scale, dev)
                if kernel is not None:
                    return _SavedAttention.apply(q, k, v, mask, bool(causal), scale, kernel,
                                                 layout)
                return _WholeAttention.apply(q, k, v, mask, float(p), bool(causal), scale,
                                             bool(gqa), layout)
        return func(*args, **kwargs)
