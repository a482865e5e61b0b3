"""``fast_meta``'s shortcuts give exactly what PyTorch's meta kernels give (shape,
strides, dtype), over random contiguous shapes with broadcasting, size-1 and size-0
dims, 0-d tensors, Python scalars and mixed dtypes; pointwise ops on other layouts get
eager's layout; anything else is left to the kernels (None)."""
import random

import pytest
import torch

from kiln.fast_meta import meta_result

aten = torch.ops.aten
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.int32, torch.uint8, torch.bool]
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def meta(shape, dtype):
    return torch.empty(shape, dtype=dtype, device="meta")


def same(fast, ref):
    if isinstance(ref, tuple):
        assert isinstance(fast, tuple) and len(fast) == len(ref)
        for f, r in zip(fast, ref):
            same(f, r)
        return
    assert fast.device.type == "meta"
    assert (tuple(fast.shape), fast.stride(), fast.dtype) == \
        (tuple(ref.shape), ref.stride(), ref.dtype)


def check(func, *args, **kwargs):
    """Returns whether the shortcut answered; when it does it must match the kernel."""
    fast = meta_result(func, args, kwargs)
    try:
        ref = func(*args, **kwargs)
    except Exception:                  # noqa: BLE001
        assert fast is None, (func, args, kwargs)
        return False
    if fast is not None:
        same(fast, ref)
    return fast is not None


def shapes(rng):
    nd = rng.randint(0, 4)
    out = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(nd)]
    k = rng.randint(0, nd)
    a = [d if rng.random() < 0.7 else 1 for d in out]
    b = [d if rng.random() < 0.7 else 1 for d in out[nd - k:]]
    if rng.random() < 0.05:
        b = [7] + b                     # does not broadcast, mostly
    return a, b


UNARY = [aten.sin.default, aten.cos.default, aten.exp.default, aten.rsqrt.default,
         aten.relu.default, aten.neg.default, aten.abs.default, aten.sigmoid.default,
         aten.gelu.default, aten.clone.default, aten.bitwise_not.default,
         aten.logical_not.default, aten.isnan.default, aten.reciprocal.default]
BINARY = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor,
          aten.eq.Tensor, aten.lt.Tensor, aten.maximum.default, aten.pow.Tensor_Tensor,
          aten.bitwise_and.Tensor, aten.remainder.Tensor, aten.atan2.default,
          aten.logical_and.default]
SCALAR = [(aten.add.Tensor, 2), (aten.mul.Tensor, 0.5), (aten.pow.Tensor_Scalar, 2),
          (aten.pow.Tensor_Scalar, 0.5), (aten.lt.Scalar, 1), (aten.div.Tensor, 3),
          (aten.remainder.Scalar, 2), (aten.masked_fill.Scalar, 1.5)]


def test_pointwise_matches_meta_kernels():
    rng = random.Random(0)
    answered = 0
    for _ in range(150):
        a, b = shapes(rng)
        da, db = rng.choice(DTYPES), rng.choice(DTYPES)
        x, y = meta(a, da), meta(b, db)
        for f in UNARY:
            answered += check(f, x)
        answered += check(aten.gelu.default, x, approximate="tanh")
        for f in BINARY:
            answered += check(f, x, y)
            answered += check(f, y, x)
        answered += check(aten.add.Tensor, x, y, alpha=2)
        answered += check(aten.where.self, meta(b, torch.bool), x, y)
        answered += check(aten.div.Tensor_mode, x, y, rounding_mode="floor")
        for f, s in SCALAR:
            args = (x, meta(b, torch.bool), s) if f is aten.masked_fill.Scalar else (x, s)
            answered += check(f, *args)
    assert answered > 2000        # the shortcut is taken, not just declined


def test_pointwise_other_layouts_as_eager_and_declines_random_ops():
    """On other layouts the meta kernel runs, its result laid out as eager's (several
    meta kernels are references that lay it out otherwise: ``copysign``)."""
    x = meta((4, 6), torch.float32)
    e = torch.empty(4, 6)
    for op, args, real in [
            (aten.sin.default, (x.t(),), (e.t(),)),                                 # transposed
            (aten.sin.default, (x[:, ::2],), (e[:, ::2],)),                         # strided
            (aten.sin.default, (meta((4, 1), torch.float32).expand(4, 3),),
             (torch.empty(4, 1).expand(4, 3),)),                                    # expanded
            (aten.copysign.Tensor, (x.t(), meta((1,), torch.float64)),
             (e.t(), torch.empty(1, dtype=torch.float64))),
            (aten.div.Tensor_mode, (x.t(), x.t().contiguous()),
             (e.t(), e.t().contiguous()))]:
        got = meta_result(op, args, {"rounding_mode": "floor"} if op is aten.div.Tensor_mode
                          else {})
        want = op(*real, **({"rounding_mode": "floor"} if op is aten.div.Tensor_mode else {}))
        assert (got.device.type, got.shape, got.stride(), got.dtype) == \
            ("meta", want.shape, want.stride(), want.dtype), op
    assert meta_result(aten.add.Tensor, (x.t(), meta((5,), torch.float32)), {}) is None  # raises
    assert meta_result(aten.bernoulli.p, (x, 0.5), {}) is None          # random
    assert meta_result(aten.add_.Tensor, (x, x), {}) is None            # in place
    assert meta_result(aten.clone.default, (x,), {"memory_format": torch.channels_last}) is None
    assert meta_result(aten.sum.default, (x,), {}) is None              # not handled


@pytest.mark.parametrize("dtype", FLOATS)
def test_softmax_layer_norm_matmuls_match_meta_kernels(dtype):
    rng = random.Random(1)
    for _ in range(25):
        nd = rng.randint(0, 4)
        shape = [rng.choice([0, 1, 2, 3, 5, 8]) for _ in range(nd)]
        x = meta(shape, dtype)
        for dim in range(-nd - 1, nd + 1):
            for f in (aten._softmax.default, aten._log_softmax.default):
                check(f, x, dim, False)
        for n in range(0, nd + 2):
            ns = shape[nd - n:] if n <= nd else [3] + shape
            w, b = meta(ns, dtype), meta(ns, dtype)
            check(aten.native_layer_norm.default, x, ns, w, b, 1e-5)
            check(aten.native_layer_norm.default, x, ns, None, None, 1e-5)
            check(aten.native_layer_norm.default, x, ns, w, meta(ns, torch.float64), 1e-5)
        m, k, n = (rng.choice([1, 2, 3, 7]) for _ in range(3))
        a, bb = meta((m, k), dtype), meta((k, n), dtype)
        assert check(aten.mm.default, a, bb)
        check(aten.mm.default, a, meta((k + 1, n), dtype))
        assert check(aten.mm.default, meta((k, m), dtype).t(), bb)
        assert check(aten.addmm.default, meta((n,), dtype), a, bb)
        check(aten.addmm.default, meta((m, 1), dtype), a, bb, beta=0.5, alpha=2)
        check(aten.addmm.default, meta((m + 1, n), dtype), a, bb)
        assert check(aten.bmm.default, meta((2, m, k), dtype), meta((2, k, n), dtype))
        check(aten.bmm.default, meta((2, m, k), dtype), meta((3, k, n), dtype))
