"""An optimizer's per-parameter update over parameters of several sizes: the graph
shared by ``test_size_args_dedupe.py`` (its kernels counted, in process) and
``size_dedupe_triton_cases.py`` (run by Triton's interpreter against eager)."""
from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

aten = torch.ops.aten

#: numels of one size class: more than 512 (one XBLOCK, 1024, for all), multiples of 16
FIVE = [528, 640, 704, 832, 960]


def adam_update(n):
    """Adam's foreach update (as ``test_foreach._adam_like``) over ``n`` parameters:
    args params, grads, moments, second moments, then the step counter."""
    def f(*a):
        ps, gs, ms, vs, step = a[:n], a[n:2 * n], a[2 * n:3 * n], a[3 * n:4 * n], a[4 * n]
        st = aten._foreach_add.Scalar([step], 1)
        m = aten._foreach_lerp.Scalar(list(ms), list(gs), 0.1)
        v = aten._foreach_addcmul.Scalar(aten._foreach_mul.Scalar(list(vs), 0.999),
                                         list(gs), list(gs), 0.001)
        bc = aten._foreach_pow.ScalarAndTensor(0.999, [st[0]] * n)
        denom = aten._foreach_add.Scalar(
            aten._foreach_div.List(aten._foreach_sqrt.default(list(v)),
                                   aten._foreach_sqrt.default(aten._foreach_neg.default(
                                       aten._foreach_sub.Scalar(list(bc), 1)))), 1e-8)
        p = aten._foreach_addcdiv.Scalar(list(ps), list(m), list(denom), -0.01)
        return (*p, *m, *v, st[0])
    return f


def inputs(numels, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = len(numels)
    out = [torch.randn(k, generator=g) for k in numels * 3]
    out += [torch.rand(k, generator=g) for k in numels]
    return out + [torch.tensor(3.0)] if n else out


def graph(numels):
    return make_fx(adam_update(len(numels)))(*inputs(numels))


def column_sums(a, b, c):
    """Two column sums of one class (their accumulators are named after their
    buffers: the dedupe key renames those with the parameters) and a row sum."""
    return (a * 2).sum(0), (b * 2).sum(0), (c * 2).sum(-1)


SUM_SHAPES = [(64, 1040), (96, 1072), (33, 700)]


def sum_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SUM_SHAPES]


def sum_graph():
    return make_fx(column_sums)(*sum_inputs())


def residual_norms(x, a, m, w, bias):
    """Two residual blocks of a transformer (a residual add then LayerNorm, with a
    matrix product between them): each block's kernel keeps its mean and variance
    inside, named after buffers that differ between the blocks (``acc_buf4`` in one,
    ``acc_buf9`` in the other)."""
    h = x + a
    y = torch.nn.functional.layer_norm(h, (h.shape[-1],), w, bias)
    h2 = h + y @ m
    return torch.nn.functional.layer_norm(h2, (h2.shape[-1],), w, bias), h2


def norm_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 8, 96, generator=g) for _ in range(2)] + \
        [torch.randn(96, 96, generator=g), torch.randn(96, generator=g), torch.randn(96, generator=g)]


def norm_graph():
    return make_fx(residual_norms)(*norm_inputs())
