"""Every op ``fast_meta`` answers for, over varied shapes, strides and dtypes: its
result has the shape, strides, dtype (and the meta device) of PyTorch's own meta
kernel and of eager on real CPU tensors; where either raises, the shortcut declines
(None) or raises too. Arguments are made from each op's schema, so an op that gains
the pointwise tag is swept without a change here."""
import random

import pytest
import torch

from kiln import fast_meta
from kiln.fast_meta import meta_result

aten = torch.ops.aten
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
          torch.int32, torch.int16, torch.uint8, torch.int8, torch.bool,
          torch.complex64]
SCALARS = [2, -1, 0.5, True, False, 3.0]
STRINGS = {"rounding_mode": [None, "floor", "trunc"], "approximate": ["none", "tanh"]}


def _pointwise_ops():
    """Every registered aten overload fast_meta answers for as pointwise, in name order
    (all of them, not ``dir(aten)``: that lists only the packets touched so far, so the
    cases drawn would depend on which tests ran before)."""
    ops = []
    for full in torch._C._dispatch_get_all_op_names():
        if not full.startswith("aten::"):
            continue
        name, _, ov = full[len("aten::"):].partition(".")
        packet = getattr(aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        op = getattr(packet, ov or "default", None)
        if op is not None and fast_meta._is_pointwise(op):
            ops.append(op)
    return sorted(set(ops), key=str)


def _layout(rng, shape, dtype):
    """A meta tensor of ``shape``: contiguous mostly, else transposed, strided,
    offset or expanded."""
    kind = rng.choice(["plain"] * 5 + ["t", "step", "offset", "expand"])
    if kind == "t" and len(shape) >= 2:
        return torch.empty(shape[:-2] + [shape[-1], shape[-2]], dtype=dtype,
                           device="meta").transpose(-1, -2)
    if kind == "step" and shape:
        return torch.empty(shape[:-1] + [shape[-1] * 2], dtype=dtype,
                           device="meta")[..., ::2]
    if kind == "offset":
        n = 1
        for s in shape:
            n *= s
        return torch.empty(n + 1, dtype=dtype, device="meta")[1:].view(shape)
    if kind == "expand" and shape:
        return torch.empty(shape[:-1] + [1], dtype=dtype, device="meta").expand(shape)
    return torch.empty(shape, dtype=dtype, device="meta")


def _shape(rng, out):
    k = rng.randint(0, len(out))
    sub = out[len(out) - k:]
    return [d if rng.random() < 0.7 else 1 for d in sub]


def _args(rng, op):
    nd = rng.randint(0, 3)
    out = [rng.choice([0, 1, 2, 3]) for _ in range(nd)]
    args, kwargs = [], {}
    for a in op._schema.arguments:
        t = str(a.type)
        if a.kwarg_only and a.has_default_value() and rng.random() < 0.5:
            continue
        if t in ("Tensor", "Optional[Tensor]"):
            if t.startswith("Optional") and rng.random() < 0.3:
                v = None
            else:
                shape = out if not args else _shape(rng, out)
                if rng.random() < 0.05:
                    shape = [4] + shape             # does not broadcast, mostly
                v = _layout(rng, shape, rng.choice(DTYPES))
        elif t in ("number", "Optional[number]"):
            v = rng.choice(SCALARS + ([None] if t.startswith("Optional") else []))
        elif t in ("int", "Optional[int]"):
            v = rng.choice([0, 1, 2])
        elif t in ("float", "Optional[float]"):
            v = rng.choice([0.5, 1e-6] + ([None] if t.startswith("Optional") else []))
        elif t in ("str", "Optional[str]"):
            v = rng.choice(STRINGS.get(a.name, [a.default_value if a.has_default_value()
                                                else None]))
        else:
            return None
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


def _real(x):
    """A CPU tensor laid out as meta tensor ``x`` (strides and offset: expanded too)."""
    if isinstance(x, torch.Tensor):
        n = x.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))
        if x.dtype.is_floating_point or x.dtype.is_complex:
            base = torch.rand(max(n, 1), dtype=torch.float64).add_(0.5).to(x.dtype)
        else:
            base = torch.ones(max(n, 1), dtype=x.dtype)
        return base.as_strided(x.shape, x.stride(), x.storage_offset())
    return x


def _run(op, args, kwargs):
    try:
        return op(*args, **kwargs)
    except Exception:                      # noqa: BLE001
        return None


def _meta_desc(t):
    return (tuple(t.shape), tuple(t.stride()), t.dtype)


def _eager_desc(t):
    """What eager's strides pin down: none of an empty tensor, none of a size-1 dim
    (eager's own kernels and its meta kernels differ there)."""
    strides = () if t.numel() == 0 else tuple(
        st for st, n in zip(t.stride(), t.shape) if n != 1)
    return (tuple(t.shape), strides, t.dtype)


def _agrees(fast, ref, eager, what):
    """``fast`` is what eager gives on real tensors (strides as far as eager pins them
    down), and exactly the meta kernel's result where that agrees with eager (PyTorch's
    meta kernel is not always eager: ``bool_tensor ** True`` is bool in eager, int64
    in the meta kernel). One of them must run. Empty results' strides are free."""
    assert fast.device.type == "meta", what
    assert ref is not None or eager is not None, (what, "both raise")
    if eager is not None:
        assert _eager_desc(fast) == _eager_desc(eager), what
    if ref is not None and (eager is None or _eager_desc(ref) == _eager_desc(eager)):
        if fast.numel():                # meta kernels' strides of empty tensors vary
            assert _meta_desc(fast) == _meta_desc(ref), what
        assert _eager_desc(fast) == _eager_desc(ref), what


@pytest.mark.parametrize("seed", range(3))
def test_pointwise_shortcuts_match_meta_and_eager(seed):
    rng = random.Random(seed)
    answered = 0
    for op in _pointwise_ops():
        for _ in range(12):
            made = _args(rng, op)
            if made is None:
                continue
            args, kwargs = made
            fast = meta_result(op, args, kwargs)
            if fast is None:
                continue
            answered += 1
            ref = _run(op, args, kwargs)
            eager = _run(op, [_real(a) for a in args], {k: _real(v) for k, v in kwargs.items()})
            _agrees(fast, ref, eager, (op, [_meta_desc(a) if isinstance(a, torch.Tensor) else a
                                             for a in args], kwargs))
    assert answered > 500


def _matrices(rng, dtype):
    m, k, n = (rng.choice([0, 1, 2, 5]) for _ in range(3))
    a = _layout(rng, [m, k], dtype)
    b = _layout(rng, [k if rng.random() < 0.9 else k + 1, n],
                dtype if rng.random() < 0.9 else torch.float64)
    return a, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64,
                                   torch.bfloat16])
def test_special_shortcuts_match_meta_and_eager(dtype):
    """mm / addmm / bmm, softmax, LayerNorm, including arguments of the wrong rank."""
    rng = random.Random(7)
    for _ in range(120):
        a, b = _matrices(rng, dtype)
        batch = rng.choice([1, 2])
        bias = _layout(rng, rng.choice([[b.shape[1]], [a.shape[0], 1], [1, 1], [3]]),
                       rng.choice([dtype, dtype, torch.float64]))
        odd = _layout(rng, [2] + list(a.shape), dtype)
        cases = [
            (aten.mm.default, (a, b), {}), (aten.mm.default, (odd, b), {}),
            (aten.mm.default, (a, odd), {}), (aten.mm.default, (odd.flatten()[:a.shape[1]], b), {}),
            (aten.addmm.default, (bias, a, b), {}),
            (aten.addmm.default, (bias, a, b), {"beta": 0.5, "alpha": 2}),
            (aten.bmm.default, (a.expand([batch] + list(a.shape)),
                                b.expand([batch] + list(b.shape))), {}),
            (aten.bmm.default, (a, b), {}),
            (aten._softmax.default, (odd, rng.randint(-4, 3), False), {}),
            (aten._log_softmax.default, (a, rng.randint(-3, 2), False), {}),
            (aten.native_layer_norm.default, (odd, list(odd.shape[-1:]), bias, bias, 1e-5),
             {}),
            (aten.native_layer_norm.default, (odd, list(odd.shape[1:]), None, None, 1e-5),
             {}),
        ]
        for op, args, kwargs in cases:
            try:
                fast = meta_result(op, args, kwargs)
            except Exception as e:         # noqa: BLE001
                pytest.fail(f"{op} raised {e!r} instead of declining")
            if fast is None:
                continue
            ref = _run(op, args, kwargs)
            eager = _run(op, [_real(x) for x in args], kwargs)
            as_tuple = (lambda v: v if isinstance(v, tuple) or v is None else (v,))
            fast, ref, eager = as_tuple(fast), as_tuple(ref), as_tuple(eager)
            for k, f in enumerate(fast):
                if op is aten.native_layer_norm.default and k:
                    # the statistics' dtype is the device's: float32 for half inputs on
                    # CUDA (and in the meta kernel), the input's on the CPU
                    _agrees(f, ref and ref[k], None, (op, args, kwargs))
                else:
                    _agrees(f, ref and ref[k], eager and eager[k], (op, args, kwargs))
