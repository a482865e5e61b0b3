"""``kiln.elementwise_layout``: the memory order eager gives elementwise results.

The rule against eager on every functional pointwise op of the aten namespace (random
layouts: permuted, sliced with steps, broadcast, size-1 dims, 0-d and number operands),
and kiln's results on ops whose meta kernel lays them out otherwise."""
import random

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.elementwise_layout import elementwise_strides, follows_rule, operands

aten = torch.ops.aten


def _pointwise_ops():
    out = []
    for name in dir(aten):
        packet = getattr(aten, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            s = op._schema
            if (torch.Tag.pointwise in op.tags and not s.is_mutable and len(s.returns) == 1
                    and str(s.returns[0].type) == "Tensor"
                    and torch.Tag.nondeterministic_seeded not in op.tags
                    and s.returns[0].alias_info is None
                    and all(a.alias_info is None for a in s.arguments) and follows_rule(op)):
                out.append(op)
    return out


def _signature(op):
    """A way to call ``op``: each required argument a tensor (float, bool or int64) or
    a number, or None when none of these works."""
    required = [a for a in op._schema.arguments if not a.has_default_value() and not a.kwarg_only]
    if not 1 <= len(required) <= 3:
        return None
    choices = []
    for a in required:
        t = str(a.type)
        if t.startswith("Tensor"):
            choices.append([torch.float32, torch.bool, torch.int64])
        elif t in ("Scalar", "float", "int", "number"):
            choices.append([2])
        else:
            return None
    for combo in __import__("itertools").product(*choices):
        args = [torch.rand(3, 4).add(0.5).to(c) if isinstance(c, torch.dtype) else c
                for c in combo]
        try:
            op(*args)
            return combo
        except Exception:         # noqa: BLE001
            continue
    return None


def _layout(rng, shape, dtype):
    n = len(shape)
    kind = rng.choice(["contiguous", "permuted", "permuted", "stepped"])
    if kind == "contiguous" or n == 0:
        return torch.rand(shape).add(0.5).to(dtype)
    if kind == "permuted":
        p = list(range(n))
        rng.shuffle(p)
        base = torch.rand([shape[i] for i in p]).add(0.5).to(dtype)
        return base.permute([p.index(i) for i in range(n)])
    big = torch.rand([s * 2 for s in shape]).add(0.5).to(dtype)
    return big[tuple(slice(None, None, 2) for _ in shape)]


SHAPES = [(3, 4), (4, 1, 5), (2, 3, 4), (1, 4), (5, 1), (2, 3, 4, 5), (3,)]


def test_rule_matches_eager_on_every_pointwise_op():
    rng = random.Random(0)
    wrong, tried = [], 0
    for op in _pointwise_ops():
        sig = _signature(op)
        if sig is None:
            continue
        for _ in range(12):
            shape = rng.choice(SHAPES)
            args = []
            for j, c in enumerate(sig):
                if not isinstance(c, torch.dtype):
                    args.append(c)
                    continue
                s = shape if j == 0 else rng.choice(
                    [shape, shape[1:], (1,) * len(shape), ()])
                args.append(_layout(rng, s, c) if s else torch.tensor(2).to(c))
            try:
                r = op(*args)
            except Exception:     # noqa: BLE001  (a combination the op refuses)
                continue
            tried += 1
            got = elementwise_strides(r.shape, operands(op, args, {}))
            if any(n != 1 and a != b for n, a, b in zip(r.shape, got, r.stride())):
                wrong.append((str(op), [(tuple(a.shape), a.stride()) if isinstance(
                    a, torch.Tensor) else a for a in args], r.stride(), got))
    assert tried > 1000
    assert wrong == [], "\n".join(map(str, wrong))


def _copysign(x):
    return torch.copysign(x, torch.tensor([1.0], dtype=torch.float64)) * 2


def _floor_divide(x):
    return x // x.contiguous()


def _rounding_div(x):
    return torch.div(x, 0.3, rounding_mode="trunc")


def _contiguity_branch(x):
    y = torch.copysign(x, x.contiguous())
    return y.view(-1) if y.is_contiguous() else y.reshape(-1) + 1


@pytest.mark.parametrize("fn", [_copysign, _floor_divide, _rounding_div, _contiguity_branch])
@pytest.mark.parametrize("make", [lambda: torch.randn(4, 5).t(),
                                  lambda: torch.randn(3, 4, 5).permute(2, 0, 1)],
                         ids=["transposed", "permuted"])
def test_results_laid_out_as_eager(fn, make):
    x = make()
    expect = fn(x)
    got = kiln.compile(fn, backend="kiln")(x)
    assert (got.shape, got.stride(), got.is_contiguous()) == \
        (expect.shape, expect.stride(), expect.is_contiguous())
    torch.testing.assert_close(got, expect)


def _any_layout(rng, shape, dtype):
    """``_layout``'s layouts, plus overlapping ones (a size-n dim of stride 0)."""
    if shape and rng.random() < 0.25:
        t = _layout(rng, [1 if i == 0 else s for i, s in enumerate(shape)], dtype)
        return t.expand(shape)
    return _layout(rng, shape, dtype)


_DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool]


def _meta(t):
    """A meta tensor of ``t``'s dtype, shape and strides (``.to("meta")`` would make an
    overlapping one dense)."""
    n = t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return torch.empty(n, dtype=t.dtype, device="meta").as_strided(
        t.shape, t.stride(), t.storage_offset())


def _mixed_cases(rng, op, sig, count):
    """Calls of ``op`` whose tensor operands have random dtypes and layouts."""
    from kiln.elementwise_layout import eager_strides
    for _ in range(count):
        shape = rng.choice(SHAPES)
        args = []
        for j, c in enumerate(sig):
            if not isinstance(c, torch.dtype):
                args.append(rng.choice([c, 2.5, True]))
                continue
            dt = rng.choice(_DTYPES)
            s = shape if j == 0 else rng.choice([shape, shape, shape[1:], ()])
            args.append(_any_layout(rng, s, dt) if s else torch.tensor(2).to(dt))
        try:
            r = op(*args)
        except Exception:     # noqa: BLE001  (a combination the op refuses)
            continue
        metas = [_meta(a) if isinstance(a, torch.Tensor) else a for a in args]
        yield args, r, eager_strides(op, metas, {}, r.shape, r.dtype, "cpu")


def test_cpu_rule_with_inputs_of_other_dtypes():
    """CPU TensorIterator converts inputs of another dtype than the common one before
    laying the result out (a non-dense input becomes dense): the rule models it."""
    rng = random.Random(1)
    wrong, tried = [], 0
    for op in _pointwise_ops():
        sig = _signature(op)
        if sig is None or sum(isinstance(c, torch.dtype) for c in sig) < 1:
            continue
        for args, r, got in _mixed_cases(rng, op, sig, 8):
            tried += 1
            if any(n != 1 and a != b for n, a, b in zip(r.shape, got, r.stride())):
                wrong.append((str(op), [(tuple(a.shape), a.stride(), a.dtype) if isinstance(
                    a, torch.Tensor) else a for a in args], r.stride(), got))
    assert tried > 500
    assert wrong == [], "\n".join(map(str, wrong))


@pytest.mark.parametrize("case", [
    # torch 2.11's sweep case: the bool input (overlapping) is converted contiguous first
    (torch.ops.aten.special_zeta.default, [((1, 2, 3), (2, 1, 0), torch.bool),
                                          ((1, 2, 3), (6, 1, 2), torch.int32)]),
    (torch.ops.aten.add.Tensor, [((3, 4), (1, 3), torch.float32),
                                 ((3, 4), (8, 2), torch.int64)]),
    (torch.ops.aten.sin.default, [((4, 5), (2, 10), torch.int64)]),
    (torch.ops.aten.mul.Tensor, [((2, 3, 4), (0, 1, 3), torch.int32),
                                 ((2, 3, 4), (1, 8, 2), torch.float64)]),
], ids=["zeta_bool_int32", "add_int_scattered", "sin_int_scattered", "mul_expanded"])
def test_fast_meta_layout_of_converted_inputs(case):
    """fast_meta's pointwise results on such inputs have eager's CPU strides."""
    from kiln.fast_meta import meta_result
    op, specs = case
    args = [torch.zeros(64, dtype=dt).as_strided(shape, stride) for shape, stride, dt in specs]
    expect = op(*args)
    got = meta_result(op, [_meta(a) for a in args], {}, torch.device("cpu"))
    assert got is not None
    assert (got.shape, got.dtype) == (expect.shape, expect.dtype)
    assert all(n == 1 or a == b for n, a, b in zip(got.shape, got.stride(), expect.stride())), \
        (got.stride(), expect.stride())
