"""Graphs and inputs shared by the C++ tests and the Triton (interpreter) tests.

Each case is (name, fn calling torch.ops.aten.* directly, input factory, tolerances).
Inputs are awkward on purpose: odd sizes, size-1 dims, broadcasting, non-contiguous
(transposed, sliced) tensors and 0-d tensors. Many ops share one graph (one compile).
"""
from __future__ import annotations

import functools
import inspect

import torch
import torch.fx as fx

from .foreach_cases import foreach_graph, foreach_inputs

aten = torch.ops.aten


def nc(*shape, dtype=torch.float32):
    """A non-contiguous tensor: the transpose of a contiguous one."""
    t = torch.randn(*reversed(shape)).to(dtype)
    return t.permute(*reversed(range(len(shape))))


def sliced(*shape):
    t = torch.randn(*shape[:-1], shape[-1] * 2 + 1)
    return t[..., 1::2]


UNARY = ["abs", "neg", "exp", "expm1", "log1p", "sin", "cos", "tanh", "sigmoid", "erf",
         "floor", "ceil", "round", "trunc", "sign", "atan", "exp2", "relu"]
POSITIVE = ["log", "log2", "log10", "sqrt", "rsqrt", "reciprocal"]


def unary_graph(x, p):
    outs = [getattr(aten, n).default(x) for n in UNARY]
    outs += [getattr(aten, n).default(p) for n in POSITIVE]
    outs.append(aten.gelu.default(x))
    outs.append(aten.gelu.default(x, approximate="tanh"))
    outs.append(aten.hardtanh.default(x, -0.5, 0.5))
    outs.append(aten.leaky_relu.default(x, 0.1))
    outs.append(aten.clamp.default(x, -0.3, 0.7))
    outs.append(aten.pow.Tensor_Scalar(x, 2))
    outs.append(aten.pow.Tensor_Scalar(p, 0.5))
    outs.append(aten.pow.Tensor_Scalar(p, 1.7))
    return tuple(outs)


def binary_graph(a, b, s):
    return (aten.add.Tensor(a, b), aten.add.Tensor(a, b, alpha=2), aten.sub.Tensor(a, b),
            aten.mul.Tensor(a, b), aten.div.Tensor(a, b), aten.maximum.default(a, b),
            aten.minimum.default(a, b), aten.atan2.default(a, b),
            aten.div.Tensor_mode(a, b, rounding_mode="floor"),
            aten.div.Tensor_mode(a, b, rounding_mode="trunc"),
            aten.remainder.Tensor(a, b), aten.fmod.Tensor(a, b),
            aten.eq.Tensor(a, b), aten.ne.Tensor(a, b), aten.lt.Tensor(a, b),
            aten.le.Tensor(a, b), aten.gt.Scalar(a, 0.1), aten.ge.Tensor(a, s),
            aten.where.self(aten.gt.Tensor(a, b), a, b), aten.mul.Tensor(a, s),
            aten.add.Tensor(s, 1.0), aten.pow.Tensor_Tensor(aten.abs.default(a), b),
            aten.logical_and.default(aten.gt.Scalar(a, 0), aten.lt.Scalar(b, 0)),
            aten.logical_not.default(aten.gt.Scalar(a, 0)),
            aten.isnan.default(aten.log.default(a)))


def int_graph(i, j):
    return (aten.add.Tensor(i, j), aten.mul.Tensor(i, 3),
            aten.div.Tensor_mode(i, j, rounding_mode="floor"),
            aten.remainder.Tensor(i, j), aten.div.Tensor(i, j),
            aten._to_copy.default(i, dtype=torch.float32),
            aten.bitwise_and.Tensor(i, j), aten.bitwise_xor.Tensor(i, j),
            aten.abs.default(i), aten.maximum.default(i, j), aten.sum.dim_IntList(i, [1]),
            aten.eq.Scalar(i, 2), aten.where.self(aten.gt.Tensor(i, j), i, j),
            aten.neg.default(i), aten.sign.default(i), aten.pow.Tensor_Scalar(i, 3))


def cast_graph(x, m):
    return (aten._to_copy.default(x, dtype=torch.float64),
            aten._to_copy.default(aten.mul.Tensor(x, 10), dtype=torch.int32),
            aten._to_copy.default(m, dtype=torch.float32),
            aten._to_copy.default(x, dtype=torch.bool),
            aten.add.Tensor(x, m), aten.mul.Tensor(m, 2.5),
            aten.where.ScalarOther(m, x, 0.0), aten.clone.default(x))


def reduction_graph(x):
    return (aten.sum.dim_IntList(x, [1]), aten.sum.dim_IntList(x, [0, 2], True),
            aten.sum.default(x), aten.mean.dim(x, [-1]), aten.mean.dim(x, [0, 1], True),
            aten.amax.default(x, [1]), aten.amin.default(x, [0, 2]),
            aten.argmax.default(x, 2), aten.argmin.default(x, 0, True),
            aten.argmax.default(x), aten.var.correction(x, [1]),
            aten.var.correction(x, [0, 2], correction=0, keepdim=True),
            aten.any.dim(aten.gt.Scalar(x, 1.5), 1), aten.max.default(x),
            aten.prod.dim_int(aten.add.Tensor(aten.abs.default(x), 0.5), 2),
            aten.var_mean.correction(x, [2], correction=1)[0],
            aten.var_mean.correction(x, [2], correction=1)[1],
            aten.max.dim(x, 1)[0], aten.max.dim(x, 1)[1], aten.amax.default(x, []))


def softmax_graph(x):
    return (aten._softmax.default(x, -1, False), aten._softmax.default(x, 0, False),
            aten._log_softmax.default(x, 1, False))


def view_graph(x, y):
    """x: (3, 5, 4), y: (5, 6)."""
    a = aten.permute.default(x, [2, 0, 1])
    b = aten.add.Tensor(a, 1.0)
    c = aten.reshape.default(b, [4, -1])
    d = aten.slice.Tensor(x, 1, 1, None, 2)
    e = aten.unsqueeze.default(aten.sum.dim_IntList(x, [2]), 1)
    f = aten.expand.default(e, [3, 4, 5])
    g = aten.squeeze.dim(aten.unsqueeze.default(y, 0), 0)
    h = aten.transpose.int(y, 0, 1)
    i = aten.select.int(x, 1, -1)
    j = aten.mul.Tensor(aten.t.default(y), 2.0)
    k = aten.cat.default([x, aten.mul.Tensor(x, 2)], 1)
    m = aten.cat.default([y, aten.neg.default(y), aten.exp.default(y)], 0)
    n = aten.constant_pad_nd.default(y, [1, 2, 0, 3], 0.5)
    o = aten.reshape.default(aten.permute.default(x, [1, 0, 2]), [5, -1])
    p = aten.add.Tensor(aten.reshape.default(h, [-1]), 1.0)
    sp = aten.split.Tensor(x, 2, 1)
    q = aten.constant_pad_nd.default(y, [-1, 2, 1, -2], 0.5)   # negative pads crop
    r = aten.constant_pad_nd.default(aten.exp.default(x), [-1, -2])
    return (a, b, c, d, e, f, g, h, i, j, k, m, n, o, p, sp[0], aten.mul.Tensor(sp[-1], 3.0),
            q, r)


def fusion_graph(x, w):
    """Pointwise chain → reduction → epilogue; layer-norm-like; library call in between."""
    h = aten.mm.default(x, w)
    mean = aten.mean.dim(h, [1], True)
    cen = aten.sub.Tensor(h, mean)
    var = aten.mean.dim(aten.mul.Tensor(cen, cen), [1], True)
    y = aten.mul.Tensor(cen, aten.rsqrt.default(aten.add.Tensor(var, 1e-5)))
    z = aten.relu.default(aten.mul.Tensor(y, 2.0))
    return (z, aten.sum.dim_IntList(z, [0]), mean)


def layer_norm_graph(x, w, b):
    out, mean, rstd = (aten.native_layer_norm.default(x, [5], w, b, 1e-5)[i]
                       for i in range(3))
    return (out, mean, rstd, aten.native_layer_norm.default(x, [5], None, None, 1e-6)[0])


def full_graph():
    """Factories must be call_function nodes (symbolic_trace would run them): built by hand."""
    g = fx.Graph()
    x = g.placeholder("x")
    r = g.call_function(aten.arange.start_step, (0, 5, 1), {"dtype": torch.int64})
    f = g.call_function(aten.full.default, ([5, 1], 2.5), {"dtype": torch.float32})
    st = g.call_function(aten.scalar_tensor.default, (3.0,), {"dtype": torch.float32})
    a = g.call_function(aten.add.Tensor, (x, f))
    b = g.call_function(aten.mul.Tensor, (r, 2))
    c = g.call_function(aten.add.Tensor, (x, g.call_function(aten.unsqueeze.default, (r, 1))))
    k = g.call_function(aten.mul.Tensor, (x, st))
    g.output((a, b, c, st, k))
    return fx.GraphModule({}, g)


def const_graph(x):
    return (aten.add.Tensor(x, torch.arange(3.0)),)     # a get_attr tensor constant


def scatter_graph(x, i, v, r, c):
    """index_put: accumulating over repeated rows (the fused producer is the initial
    value), storing at two-tensor positions, a broadcast scalar; cumsum (C++ only)."""
    a = aten.index_put.default(aten.mul.Tensor(x, 2.0), [i], v, True)
    b = aten.index_put.default(x, [r, c], aten.select.int(aten.select.int(v, 0, 0), 0, 1))
    return (a, b, aten.cumsum.default(aten.exp.default(x), 1))


def scan_graph(x, m):
    """cumsum along long rows (several blocks a line on Triton), along columns, of int64."""
    return (aten.cumsum.default(aten.mul.Tensor(x, 0.5), 1), aten.cumsum.default(x, 0),
            aten.cumsum.default(m, 1))


def resample_graph(x, g):
    """upsample_bilinear2d (gathers at computed rows and columns), up and down, with and
    without align_corners, fused with a producer; its backward (a scatter of 4 taps)."""
    e = aten.exp.default(x)
    return (aten.upsample_bilinear2d.default(e, [11, 4], False),
            aten.upsample_bilinear2d.default(x, [3, 9], True),
            aten.upsample_bilinear2d.vec(x, None, False, [2.0, 1.5]),
            aten.upsample_bilinear2d_backward.default(g, [11, 4], [2, 3, 5, 7], False))


def fallback_graph(x, idx):
    g = aten.index_select.default(x, 0, idx)          # not lowered: calls aten
    return (aten.add.Tensor(g, 1.0), aten.cumprod.default(x, 1))


def _pos(*s):
    return torch.rand(*s) + 0.1


def _nonzero(*s):
    t = torch.randn(*s)
    return torch.where(t.abs() < 0.1, torch.full_like(t, 0.5), t)


def pool_graph(x, g, gv):
    v, i = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
    dx = aten.max_pool2d_with_indices_backward.default(gv, x, [3, 3], [2, 2], [1, 1], [1, 1],
                                                       False, i)
    v2, i2 = aten.max_pool2d_with_indices.default(x, [2, 2], [2, 2], [0, 0], [1, 1], True)
    return (v, i, v2, i2, aten.avg_pool2d.default(x, [3, 3], [1, 1], [1, 1]),
            aten._adaptive_avg_pool2d.default(x, [1, 1]),
            aten._adaptive_avg_pool2d.default(x, [5, 2]),
            aten._adaptive_avg_pool2d_backward.default(g, x),
            aten.copy.default(x, aten.relu.default(x)), dx)


def index_graph(w, ids, x, i):
    return (aten.add.Tensor(aten.embedding.default(w, ids), 1.0),
            aten.index.Tensor(x, [None, i]), aten.gather.default(x, 0, aten.abs.default(i)),
            aten.index_select.default(w, 0, aten.select.int(ids, 0, 0)),
            aten.slice_scatter.default(x, aten.slice.Tensor(x, 0, 0, 2), 0, 2, 4))


def batch_norm_train_graph(x, w, b, running_mean, running_var, tracked):
    """BatchNorm's training forward as kiln's decomposition leaves it: statistics, the
    normalised output, then the running-statistics update (an epilogue of the
    statistics' kernel scheduled after the output) and the 0-d batch counter."""
    mean = aten.mean.dim(x, [0, 2, 3], True)
    var = aten.var.correction(x, [0, 2, 3], correction=0, keepdim=True)
    out = aten.add.Tensor(aten.mul.Tensor(aten.mul.Tensor(
        aten.sub.Tensor(x, mean), aten.rsqrt.default(aten.add.Tensor(var, 1e-5))),
        aten.view.default(w, [1, -1, 1, 1])), aten.view.default(b, [1, -1, 1, 1]))
    n = 3 * 4 * 6                    # elements per channel of the case's [3, 5, 4, 6] input
    new_mean = aten.add.Tensor(aten.mul.Tensor(aten.squeeze.dims(mean, [0, 2, 3]), 0.1),
                               aten.mul.Tensor(running_mean, 0.9))
    new_var = aten.add.Tensor(aten.mul.Tensor(aten.squeeze.dims(var, [0, 2, 3]), 0.1 * n / (n - 1)),
                              aten.mul.Tensor(running_var, 0.9))
    return (aten.relu.default(out), new_mean, new_var, aten.add.Tensor(tracked, 1))


def _pool_inputs():
    x = nc(2, 3, 10, 8)
    x[0, 1, 2, 2] = float("nan")
    return [x, torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)]


# --- the rest of the lowering and scalar-op tables (tests/kernels/test_coverage.py) ------
def more_pointwise_graph(x, p, i, j):
    """Scalar-argument variants, the remaining math and bitwise ops, clamps by tensors."""
    u = aten.mul.Tensor(aten.tanh.default(x), 0.9)          # in (-0.9, 0.9)
    return (aten.add.Scalar(x, 2), aten.sub.Scalar(x, 0.5), aten.mul.Scalar(x, 3),
            aten.div.Scalar(x, 4), aten.rsub.Tensor(x, p), aten.rsub.Scalar(x, 1),
            aten.pow.Scalar(2.0, x), aten.div.Scalar_mode(x, 0.7, rounding_mode="floor"),
            aten.fmod.Scalar(x, 0.3), aten.remainder.Scalar(x, 0.3),
            aten.ge.Scalar(x, 0.1), aten.le.Scalar(x, 0.1), aten.ne.Scalar(x, 0),
            aten.where.Scalar(aten.gt.Scalar(x, 0), 1.0, -1.0),
            aten.where.ScalarSelf(aten.gt.Scalar(x, 0), 0.5, x),
            aten.clamp.Tensor(x, aten.neg.default(p), p), aten.clamp_min.default(x, 0.1),
            aten.clamp_max.default(x, 0.2), aten.clamp_min.Tensor(x, p),
            aten.clamp_max.Tensor(x, p),
            aten.asin.default(u), aten.acos.default(u), aten.atanh.default(u),
            aten.asinh.default(x), aten.acosh.default(aten.add.Tensor(p, 1)),
            aten.sinh.default(x), aten.cosh.default(x), aten.tan.default(u),
            aten.isinf.default(aten.reciprocal.default(aten.mul.Tensor(x, 0))),
            aten.logical_or.default(aten.gt.Scalar(x, 0), aten.gt.Scalar(p, 0.5)),
            aten.logical_xor.default(aten.gt.Scalar(x, 0), aten.gt.Scalar(p, 0.5)),
            aten.bitwise_not.default(i), aten.bitwise_or.Tensor(i, j),
            aten.bitwise_or.Scalar(i, 6), aten.bitwise_and.Scalar(i, 6),
            aten.bitwise_xor.Scalar(i, 6), aten.floor_divide.default(x, p))


def more_reductions_graph(x):
    """Whole-tensor and multi-dim reductions, min with indices."""
    return (aten.any.default(aten.gt.Scalar(x, 0)), aten.any.dims(aten.gt.Scalar(x, 1), [0, 2]),
            aten.mean.default(x), aten.min.default(x), aten.min.dim(x, 1)[0],
            aten.min.dim(x, 1)[1], aten.prod.default(aten.add.Tensor(aten.abs.default(x), 0.5)))


def more_shapes_graph(x, y):
    """Splits, squeezes, aliases and repeats."""
    a, b = aten.split_with_sizes.default(x, [1, 2], 0)
    return (aten.add.Tensor(a, 1), aten.mul.Tensor(b, 2), aten.squeeze.default(y),
            aten.add.Tensor(aten._unsafe_view.default(x, [3, 20]), 1),
            aten.mul.Tensor(aten.alias.default(x), 2), aten.lift_fresh_copy.default(y),
            aten.repeat.default(y, [2, 1, 3]))


def factories_graph():
    """Factories (by hand, as ``full_graph``): values, and empty ones filled by a copy."""
    g = fx.Graph()
    x = g.placeholder("x")
    f32 = {"dtype": torch.float32}
    outs = [g.call_function(aten.arange.default, (5,), {"dtype": torch.int64}),
            g.call_function(aten.arange.start, (1, 6), {"dtype": torch.int64}),
            g.call_function(aten.zeros.default, ([2, 3],), f32),
            g.call_function(aten.ones.default, ([2, 3],), f32),
            g.call_function(aten.zeros_like.default, (x,)),
            g.call_function(aten.ones_like.default, (x,)),
            g.call_function(aten.full_like.default, (x, 1.5))]
    empties = [g.call_function(aten.empty.memory_format, ([5, 3],), f32),
               g.call_function(aten.empty_like.default, (x,)),
               g.call_function(aten.empty_strided.default, ([5, 3], [1, 5]), f32),
               g.call_function(aten.empty_permuted.default, ([5, 3], [1, 0]), f32),
               g.call_function(aten.new_empty_strided.default, (x, [5, 3], [3, 1]))]
    outs += [g.call_function(aten.copy.default, (e, x)) for e in empties]
    g.output(tuple(outs))
    return fx.GraphModule({}, g)


def more_scatter_graph(x, idx, src, g, ids, rows, v):
    """scatter (src, value), scatter_add, scatter_reduce (sum), an accumulating
    _unsafe_index_put and embedding's backward."""
    return (aten.scatter.src(x, 1, idx, src), aten.scatter.value(x, 1, idx, 2.0),
            aten.scatter_add.default(x, 0, aten.remainder.Scalar(idx, 4), src),
            aten.scatter_reduce.two(x, 0, aten.remainder.Scalar(idx, 4), src, "sum"),
            aten._unsafe_index_put.default(x, [rows], v, True),
            aten.embedding_dense_backward.default(g, ids, 7, -1, False))


def small_mm_graph(b, x, w, gp, xp):
    """A small addmm (a sum over the shared dim on the CPU) and avg_pool2d's backward."""
    return (aten.addmm.default(b, x, w),
            aten.avg_pool2d_backward.default(gp, xp, [3, 3], [1, 1], [1, 1], False, True, None))


def _scatter_inputs():
    idx = torch.stack([torch.randperm(6)[:3] for _ in range(4)])       # unique per row
    return [torch.randn(4, 6), idx, torch.randn(4, 3), torch.randn(2, 5, 3),
            torch.randint(0, 7, (2, 5)), torch.tensor([0, 2, 0, 3]), torch.randn(4, 6)]


CASES = [
    # name, fn, inputs factory, (rtol, atol)
    ("unary_contig", unary_graph, lambda: [torch.randn(7, 33), _pos(7, 33)], (1e-5, 1e-6)),
    ("unary_noncontig", unary_graph, lambda: [nc(5, 3, 9), _pos(5, 3, 9)], (1e-5, 1e-6)),
    ("unary_0d", unary_graph, lambda: [torch.randn(()), _pos(())], (1e-5, 1e-6)),
    ("unary_f64", unary_graph, lambda: [torch.randn(17, dtype=torch.float64),
                                        _pos(17).double()], (1e-12, 1e-12)),
    ("binary_broadcast", binary_graph, lambda: [torch.randn(4, 1, 7), _nonzero(5, 1),
                                                torch.tensor(0.3)], (1e-5, 1e-6)),
    ("binary_noncontig", binary_graph, lambda: [sliced(6, 11), nc(6, 11) + 3,
                                                torch.randn(1, 11)], (1e-5, 1e-6)),
    ("int_ops", int_graph, lambda: [torch.randint(-20, 20, (9, 5)),
                                    torch.randint(1, 7, (9, 5))], (0, 0)),
    ("int32_ops", int_graph, lambda: [torch.randint(-20, 20, (3, 4), dtype=torch.int32),
                                      torch.randint(1, 7, (4,), dtype=torch.int32)], (0, 1e-6)),
    ("casts", cast_graph, lambda: [torch.randn(6, 5), torch.rand(6, 5) > 0.5], (1e-6, 1e-6)),
    ("reductions", reduction_graph, lambda: [torch.randn(5, 7, 9)], (1e-5, 1e-5)),
    ("reductions_noncontig", reduction_graph, lambda: [nc(4, 1, 13)], (1e-5, 1e-5)),
    ("reductions_large", reduction_graph, lambda: [torch.randn(33, 65, 129)], (1e-4, 1e-4)),
    ("softmax", softmax_graph, lambda: [torch.randn(37, 129)], (1e-5, 1e-6)),
    ("softmax_noncontig", softmax_graph, lambda: [nc(10, 31)], (1e-5, 1e-6)),
    ("views", view_graph, lambda: [torch.randn(3, 5, 4), torch.randn(5, 6)], (1e-6, 1e-6)),
    ("views_noncontig", view_graph, lambda: [nc(3, 5, 4), sliced(5, 6)], (1e-6, 1e-6)),
    ("fusion", fusion_graph, lambda: [torch.randn(13, 8), torch.randn(8, 21)], (1e-4, 1e-5)),
    ("layer_norm", layer_norm_graph, lambda: [nc(3, 4, 5), torch.randn(5), torch.randn(5)],
     (1e-5, 1e-5)),
    ("full_arange", full_graph(), lambda: [torch.randn(5, 3)], (1e-6, 1e-6)),
    ("tensor_constant", const_graph, lambda: [torch.randn(4, 3)], (1e-6, 1e-6)),
    ("pooling", pool_graph, _pool_inputs, (1e-5, 1e-6)),
    ("indexing", index_graph, lambda: [nc(9, 5), torch.randint(0, 9, (2, 3)), nc(4, 6),
                                       torch.tensor([[0, -1], [2, -3]])], (0, 0)),
    ("scatter", scatter_graph, lambda: [nc(6, 5), torch.tensor([0, 2, -4, 5, 2]),
                                        torch.randint(-4, 4, (5, 5)).float(),
                                        torch.tensor([1, 3, -1]), torch.tensor([0, 4, 2])],
     (1e-6, 1e-6)),
    ("scan", scan_graph, lambda: [torch.randn(3, 2500), torch.randint(-3, 9, (4, 1100))],
     (1e-4, 1e-4)),
    ("resample", resample_graph, lambda: [nc(2, 3, 5, 7), torch.randn(2, 3, 11, 4)],
     (1e-5, 1e-6)),
    ("batch_norm_train", batch_norm_train_graph,
     lambda: [nc(3, 5, 4, 6), torch.randn(5), torch.randn(5), torch.randn(5), torch.rand(5),
              torch.tensor(7)], (1e-5, 1e-6)),
    ("fallback", fallback_graph, lambda: [torch.randn(6, 4), torch.tensor([4, 0, 0, 2])],
     (1e-6, 1e-6)),
    ("more_pointwise", more_pointwise_graph,
     lambda: [torch.randn(6, 7), _pos(6, 7), torch.randint(-20, 20, (6, 7)),
              torch.randint(1, 7, (6, 7))], (1e-5, 1e-5)),
    ("more_reductions", more_reductions_graph, lambda: [nc(3, 4, 5)], (1e-5, 1e-5)),
    ("more_shapes", more_shapes_graph, lambda: [torch.randn(3, 4, 5), torch.randn(2, 1, 3)],
     (1e-6, 1e-6)),
    ("factories", factories_graph(), lambda: [torch.randn(5, 3)], (1e-6, 1e-6)),
    ("more_scatter", more_scatter_graph, _scatter_inputs, (1e-6, 1e-6)),
    ("foreach", foreach_graph(), foreach_inputs, (1e-5, 1e-6)),
    ("small_mm", small_mm_graph, lambda: [torch.randn(5), torch.randn(3, 4), torch.randn(4, 5),
                                          torch.randn(1, 2, 6, 5), torch.randn(1, 2, 6, 5)],
     (1e-5, 1e-5)),
]


def run_case(name, fn, make, tol, target, compile_aten_graph, device=None):
    """Compile, then compare with eager on the compile-time inputs and on fresh ones.
    ``device``: the inputs moved there, or placed by ``make(device=...)`` where it
    takes one (inputs eager wants elsewhere, such as a foreach op's CPU scalars)."""
    if device is not None:
        if "device" in inspect.signature(make).parameters:
            make = functools.partial(make, device=device)
        else:
            make = (lambda mk: lambda: [t.to(device) for t in mk()])(make)
    torch.manual_seed(sum(map(ord, name)))
    inputs = make()
    gm = fn if isinstance(fn, fx.GraphModule) else fx.symbolic_trace(fn)
    snapshot = [t.clone() for t in inputs]
    compiled = compile_aten_graph(gm, inputs, target=target)
    for s, t in zip(snapshot, inputs):          # compiling must not touch the inputs
        assert torch.equal(s, t) or (s.is_floating_point() and torch.allclose(s, t, equal_nan=True))
    for trial in range(2):
        if trial:
            torch.manual_seed(1 + sum(map(ord, name)))
            inputs = make()
        expect = gm(*inputs)
        got = compiled(*inputs)
        assert len(got) == len(expect)
        for k, (g, e) in enumerate(zip(got, expect)):
            assert g.shape == e.shape, (name, k, g.shape, e.shape)
            assert g.dtype == e.dtype, (name, k, g.dtype, e.dtype)
            if e.dtype.is_floating_point:
                torch.testing.assert_close(g, e, rtol=tol[0], atol=tol[1], equal_nan=True,
                                           msg=lambda m: f"{name} output {k}: {m}")
            else:
                assert torch.equal(g, e), (name, k, g, e)
    return compiled
