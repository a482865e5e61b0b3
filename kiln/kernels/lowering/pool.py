"""Lowerings of pooling (and ``empty_permuted``).

Registered into ``LOWERINGS`` on import (``lowering/__init__.py`` imports this module). On the model zoo these were most of what fell back to aten: CNNs pool with
``max_pool2d_with_indices`` and ``_adaptive_avg_pool2d``; inception averages with
``avg_pool2d``.

Pooling windows are unrolled into the loop body, one masked load per tap: every index
stays affine in the output's loop variables (the IR has no division), and a tap outside
the input (padding, a ceil-mode edge) is masked off. Backward passes gather by phase of
the stride (see ``_max_pool2d_with_indices_backward``).
"""
from __future__ import annotations

import torch

from .. import ir
from ..ir import Index
from .base import (Lazy, Unsupported, View, as_expr, add_mask, is_box, pointwise,
                       reduce, register, window_layout)
from ..ops import cast, const, op, within

aten = torch.ops.aten
#: Windows with more taps than this are not unrolled (the op falls back).
MAX_TAPS = 64


@register(aten.empty_permuted.default)
def _empty_permuted(lo, node, *a, **kw):
    """Uninitialised memory in eager: zeros here, laid out as eager would lay it out."""
    m = lo.out_meta(node)
    return Lazy(tuple(m.shape), m.dtype, lambda idx: const(0, m.dtype), layout=tuple(m.stride()))


def _pair(v, default=None):
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        v = default
    if isinstance(v, int):
        return (v, v)
    v = tuple(v)
    return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])


def _side_checks(pos, first: int, step: int, n_out: int, size: int):
    """``0 <= pos < size`` for ``pos = o*step + first``, o in [0, n_out), keeping only
    the sides that can fail (None: always in range). A consumer that reads the pool
    outside its own range (pad, cat) masks every load itself, so only ``o``'s own range
    matters; each dropped check is a compare and an ``and`` less in the kernel, which on
    resnet18's stem pool halves its compile time."""
    checks = []
    if first < 0:
        checks.append(op("ge", Index(pos), const(0, torch.int64)))
    if (n_out - 1) * step + first >= size:
        checks.append(op("lt", Index(pos), const(size, torch.int64)))
    return checks


def _taps(x, idx, kernel, stride, padding, dilation, out_hw):
    """For each tap of the window at output index ``idx`` (…, oh, ow): (validity or None
    when the tap is always inside the input, input index list, flat position ih*W+iw
    as an affine index)."""
    H, W = int(x.sizes[-2]), int(x.sizes[-1])
    oh, ow = idx[-2], idx[-1]
    out = []
    for kh in range(kernel[0]):
        for kw in range(kernel[1]):
            fh, fw = kh * dilation[0] - padding[0], kw * dilation[1] - padding[1]
            ih, iw = oh * stride[0] + fh, ow * stride[1] + fw
            checks = (_side_checks(ih, fh, stride[0], out_hw[0], H)
                      + _side_checks(iw, fw, stride[1], out_hw[1], W))
            valid = None
            for c in checks:
                valid = c if valid is None else op("and", valid, c)
            out.append((valid, list(idx[:-2]) + [ih, iw], ih * W + iw))
    return out


_PROBE = frozenset({"kiln_ph", "kiln_pw"})


def _position_free_loads(x, idx) -> frozenset:
    """The loads in ``x``'s expression at (…, h, w) whose address does not depend on h
    or w (a BatchNorm's per-channel statistics under a pool): they are in bounds for
    every tap, so a tap's mask need not cover them, and one copy serves every tap
    (masked copies differ, and each would redo their arithmetic — an rsqrt a tap)."""
    probe = x.load(list(idx[:-2]) + [ir.Affine.var(v) for v in sorted(_PROBE)])
    tainted = set()
    free = set()
    for e in ir.walk(probe):
        own = isinstance(e, (Index, ir.Load)) and _PROBE & e.index.vars()
        if own or any(c in tainted for c in e.children()):
            tainted.add(e)
        elif isinstance(e, ir.Load):
            free.add(e)
    return frozenset(free)


def _guarded(x, sub, valid, free=frozenset()):
    """``x`` at ``sub``, its loads masked by ``valid`` unless the tap is always inside
    (``free``: loads left unmasked, see ``_position_free_loads``)."""
    v = x.load(sub)
    return v if valid is None else add_mask(v, valid, free)


def _window_args(kernel, stride, padding, dilation):
    kernel = _pair(kernel)
    return kernel, _pair(stride, kernel), _pair(padding, 0), _pair(dilation, 1)


@register(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(lo, node, x, kernel_size, stride=(), padding=0, dilation=1,
                             ceil_mode=False):
    if not is_box(x) or len(x.sizes) not in (3, 4) or not x.dtype.is_floating_point:
        raise Unsupported("K0205", "max_pool2d of this rank or dtype")
    kernel, stride, padding, dilation = _window_args(kernel_size, stride, padding, dilation)
    if kernel[0] * kernel[1] > MAX_TAPS:
        raise Unsupported("K0212", "window too large to unroll")
    vals_m, idx_m = lo.out_meta(node)
    sizes, dtype = tuple(vals_m.shape), vals_m.dtype

    memo = {}

    def both(idx):
        """The window's max (NaN wins, the first of equals wins, as ATen's loop) and
        the flat position it came from (built once per index: values and indices share
        one expression DAG)."""
        key = tuple(idx)
        if key not in memo:
            memo[key] = _window_max(idx)
        return memo[key]

    def _window_max(idx):
        # The value needs no "first valid tap" rule: a -inf start gives the same max.
        # The index does (ATen starts at the first valid tap), so only the index chain
        # carries ``found`` (True once a tap that is always inside has been seen), and
        # a graph that drops the indices (inference) keeps the short value chain.
        best, where_, found = const(float("-inf"), dtype), const(0, torch.int64), None
        free = _position_free_loads(x, idx)
        for valid, sub, flat in _taps(x, idx, kernel, stride, padding, dilation,
                                      sizes[-2:]):
            v = _guarded(x, sub, valid, free)
            better = op("or", op("gt", v, best), op("isnan", v))
            take = better if valid is None else op("and", valid, better)
            if found is True:
                take_i = take
            elif found is None:
                take_i = valid
            else:
                first = op("or", op("not", found), better)
                take_i = first if valid is None else op("and", valid, first)
            best = op("where", take, v, best)
            where_ = Index(flat) if take_i is None else op("where", take_i, Index(flat), where_)
            found = True if (valid is None or found is True) else \
                (valid if found is None else op("or", found, valid))
        return best, where_

    return (Lazy(sizes, dtype, lambda idx: both(idx)[0], window_layout(x, sizes)),
            Lazy(tuple(idx_m.shape), torch.int64, lambda idx: both(idx)[1],
                 window_layout(x, tuple(idx_m.shape))))


def _axis_count(o, stride, pad, k, lo_b, hi_b, dt):
    """How many of a window's ``k`` taps along one axis (window at output position ``o``)
    fall in [lo_b, hi_b), as an expression."""
    n = const(0, dt)
    for t in range(k):
        inside = within(Index(o * stride + (t - pad)), lo_b, hi_b)
        n = op("add", n, op("where", inside, const(1, dt), const(0, dt)))
    return n


def _avg_divisor(o_h, o_w, H, W, kernel, stride, padding, count_include_pad,
                 divisor_override, dt):
    """ATen's divisor of the window at (o_h, o_w): the override; else its taps inside
    the padded input (count_include_pad) or inside the input itself."""
    if divisor_override:
        return const(divisor_override, dt)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    bh = (-ph, H + ph) if count_include_pad else (0, H)
    bw = (-pw, W + pw) if count_include_pad else (0, W)
    return op("mul", _axis_count(o_h, sh, ph, kh, *bh, dt), _axis_count(o_w, sw, pw, kw, *bw, dt))


def _acc(dtype):
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@register(aten.avg_pool2d.default)
def _avg_pool2d(lo, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
    if not is_box(x) or len(x.sizes) not in (3, 4):
        raise Unsupported("K0205", "avg_pool2d of this rank")
    kernel, stride, padding, dilation = _window_args(kernel_size, stride, padding, 1)
    if kernel[0] * kernel[1] > MAX_TAPS:
        raise Unsupported("K0212", "window too large to unroll")
    H, W = int(x.sizes[-2]), int(x.sizes[-1])
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    acc_t = _acc(dtype)

    def body(idx):
        total = const(0, acc_t)
        free = _position_free_loads(x, idx)
        for valid, sub, _ in _taps(x, idx, kernel, stride, padding, dilation, sizes[-2:]):
            v = cast(_guarded(x, sub, valid, free), acc_t)
            total = op("add", total, v if valid is None else
                       op("where", valid, v, const(0, acc_t)))
        div = _avg_divisor(idx[-2], idx[-1], H, W, kernel, stride, padding,
                           count_include_pad, divisor_override, acc_t)
        return cast(op("truediv", total, div), dtype)
    return Lazy(sizes, dtype, body, window_layout(x, sizes))


def _blocks(lo, node, x, out_hw):
    """``x`` (…, H, W) as a strided view (…, oh, kh, ow, kw) of equal windows: when oh
    divides H (windows of H/oh rows), or H is 1 (every output row reads the one row);
    the same for W."""
    if not isinstance(x, View):
        x = lo.realize(x, origin=node.name)
    dims = []
    for n_in, n_out, st in ((int(x.sizes[-2]), int(out_hw[0]), x.strides[-2]),
                            (int(x.sizes[-1]), int(out_hw[1]), x.strides[-1])):
        if n_out <= 0:
            raise Unsupported("K0206", "empty output")
        if n_in % n_out == 0:
            k = n_in // n_out
            dims.append((n_out, k, st * k, st))
        elif n_in == 1:
            dims.append((n_out, 1, 0, st))
        else:
            raise Unsupported("K0205", "windows of unequal sizes")
    (oh, kh, s_oh, s_kh), (ow, kw, s_ow, s_kw) = dims
    lead = len(x.sizes) - 2
    return View(x.buf, tuple(x.sizes[:-2]) + (oh, kh, ow, kw),
                tuple(x.strides[:-2]) + (s_oh, s_kh, s_ow, s_kw), x.offset, x.dtype), lead, kh * kw


@register(aten._adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(lo, node, x, output_size):
    """Windows of equal size when the output size divides the input's (global pooling
    included): a mean over two dims of a strided view."""
    if not is_box(x) or len(x.sizes) not in (3, 4):
        raise Unsupported("K0205", "adaptive_avg_pool2d of this rank")
    v, lead, n = _blocks(lo, node, x, _pair(output_size))
    m = lo.out_meta(node)
    acc_t = torch.float32 if m.dtype in (torch.float16, torch.bfloat16) else m.dtype
    s = reduce(lo, node, v, [lead + 1, lead + 3], False, "sum", acc_t)
    return Lazy(s.sizes, m.dtype,
                lambda idx: cast(op("truediv", s.load(idx), const(n, acc_t)), m.dtype))


@register(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(lo, node, grad, x):
    """Each input element gets its window's gradient over the window size: written as
    the (…, oh, kh, ow, kw) view of a contiguous result, where that is a broadcast. An
    input of one row (or column) read by every output row gets their sum."""
    if not is_box(grad) or len(grad.sizes) not in (3, 4):
        raise Unsupported("K0205", "adaptive_avg_pool2d_backward of this rank")
    m = lo.out_meta(node)
    if tuple(m.stride()) != ir.contiguous_strides(tuple(m.shape)):
        raise Unsupported("K0210", "non-contiguous gradient layout")
    H, W = int(m.shape[-2]), int(m.shape[-1])
    n = len(grad.sizes)
    for d, n_in in ((n - 2, H), (n - 1, W)):
        if n_in == 1 and int(grad.sizes[d]) > 1:
            grad = reduce(lo, node, grad, [d], True, "sum", grad.dtype)
    oh, ow = int(grad.sizes[-2]), int(grad.sizes[-1])
    if oh <= 0 or ow <= 0 or H % oh or W % ow:
        raise Unsupported("K0205", "output size does not divide the input's")
    kh, kw = H // oh, W // ow
    dtype = m.dtype
    lead = tuple(m.shape[:-2])
    six = lead + (oh, kh, ow, kw)

    def body(idx):
        g = as_expr(grad, list(idx[:-4]) + [idx[-4], idx[-2]], tuple(grad.sizes), dtype)
        return op("truediv", g, const(kh * kw, dtype))
    buf = lo.realize(Lazy(six, dtype, body), origin=node.name)
    strides = ir.contiguous_strides(tuple(m.shape))
    return View(buf.buf, tuple(m.shape), strides, 0, dtype)



def _gather_by_phase(lo, node, grad, kernel, stride, padding, dilation, contribution):
    """A pooling backward as a gather: input row ``ih = a*sh + p`` is reached by tap
    ``kh`` of output row ``oh = (ih + ph - kh*dh) / sh`` — an integer only for the taps
    of the right phase ``p``, and then ``a`` plus a constant. So the result is computed
    as a (…, H/sh, sh, W/sw, sw) array (the same memory as (…, H, W); sizes rounded up
    to whole strides, the excess sliced off; where eager's result is laid out otherwise,
    channels-last, a graph output is copied into its layout), each phase summing
    ``contribution(at, o_h, o_w, valid, flat)`` over its own taps (``at``: the output
    index, ``flat``: this input element's ``ih*W + iw``)."""
    m = lo.out_meta(node)
    sizes, dtype = tuple(m.shape), m.dtype
    H, W = int(sizes[-2]), int(sizes[-1])
    sh, sw = stride
    if kernel[0] * kernel[1] > MAX_TAPS:
        raise Unsupported("K0212", "window too large to unroll")
    Hp, Wp = -(-H // sh) * sh, -(-W // sw) * sw
    OH, OW = int(grad.sizes[-2]), int(grad.sizes[-1])
    acc_t = _acc(dtype)
    lead = sizes[:-2]
    six = tuple(lead) + (Hp // sh, sh, Wp // sw, sw)

    def body(idx):
        pre, a, p, b, q = list(idx[:-4]), idx[-4], idx[-3], idx[-2], idx[-1]
        result = const(0, acc_t)
        for ph_ in range(sh):
            for pw_ in range(sw):
                total = const(0, acc_t)
                flat = (a * sh + ph_) * W + (b * sw + pw_)
                for kh in range(kernel[0]):
                    dh = ph_ + padding[0] - kh * dilation[0]
                    if dh % sh:
                        continue
                    o_h = a + dh // sh
                    for kw in range(kernel[1]):
                        dw = pw_ + padding[1] - kw * dilation[1]
                        if dw % sw:
                            continue
                        o_w = b + dw // sw
                        valid = op("and", within(Index(o_h), 0, OH), within(Index(o_w), 0, OW))
                        total = op("add", total, contribution(pre + [o_h, o_w], o_h, o_w,
                                                              valid, flat, acc_t))
                here = op("and", op("eq", Index(p), const(ph_, torch.int64)),
                          op("eq", Index(q), const(pw_, torch.int64)))
                result = op("where", here, total, result)
        return cast(result, dtype)
    buf = lo.realize(Lazy(six, dtype, body), origin=node.name)
    strides = ir.contiguous_strides(tuple(lead) + (Hp, Wp))
    if (Hp, Wp) != (H, W) or tuple(m.stride()) != ir.contiguous_strides(sizes):
        lo.relaid.add(buf.buf)          # a graph output gets eager's layout (channels-last…)
    return View(buf.buf, sizes, strides, 0, dtype)


@register(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(lo, node, grad, x, kernel_size, stride, padding,
                                      dilation, ceil_mode, indices):
    """Each output's gradient goes to the input element its saved index names."""
    if not (is_box(grad) and is_box(indices)) or len(grad.sizes) not in (3, 4):
        raise Unsupported("K0205", "max_pool2d backward of this rank")
    kernel, stride, padding, dilation = _window_args(kernel_size, stride, padding, dilation)

    def contribution(at, o_h, o_w, valid, flat, acc_t):
        hit = op("and", valid, op("eq", add_mask(indices.load(at), valid), Index(flat)))
        g = cast(add_mask(grad.load(at), valid), acc_t)
        return op("where", hit, g, const(0, acc_t))
    return _gather_by_phase(lo, node, grad, kernel, stride, padding, dilation, contribution)


@register(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(lo, node, grad, x, kernel_size, stride, padding, ceil_mode,
                         count_include_pad, divisor_override):
    """Each output's gradient over its window's divisor, to every input of the window."""
    if not is_box(grad) or len(grad.sizes) not in (3, 4):
        raise Unsupported("K0205", "avg_pool2d backward of this rank")
    kernel, stride, padding, dilation = _window_args(kernel_size, stride, padding, 1)
    m = lo.out_meta(node)
    H, W = int(m.shape[-2]), int(m.shape[-1])

    def contribution(at, o_h, o_w, valid, flat, acc_t):
        g = cast(add_mask(grad.load(at), valid), acc_t)
        div = _avg_divisor(o_h, o_w, H, W, kernel, stride, padding, count_include_pad,
                           divisor_override, acc_t)
        return op("where", valid, op("truediv", g, div), const(0, acc_t))
    return _gather_by_phase(lo, node, grad, kernel, stride, padding, dilation, contribution)
