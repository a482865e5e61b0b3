"""The strides eager gives the result of an elementwise op: TensorIterator's rule.

Eager's pointwise kernels allocate their output through TensorIterator, which follows
the memory order of the inputs (``x.t() + 1`` is laid out as ``x.t()``). Several of
PyTorch's meta kernels are Python references that build the result from other ops
(``copysign``, ``xlogy``, ``div`` with a rounding mode, ``floor_divide``…) and return
another layout; traced values would then disagree with eager's about ``stride()``,
``is_contiguous()`` and whether ``.view()`` works. ``elementwise_strides`` computes the
layout as TensorIterator does (``TensorIteratorBase::fast_set_up``,
``compute_strides``, ``reorder_dimensions``, ``allocate_or_resize_outputs``) and
``relayout`` gives a meta result those strides where its memory order differs (strides
of size-1 dims, which vary between eager's kernels and address nothing, are left as
the meta kernel gives them). Only ops whose eager result follows the rule are relaid
(``follows_rule``; a test checks the rule against eager on every pointwise op).

On the CPU, TensorIterator first converts each input whose dtype is not the common
dtype with ``.to(common_dtype)`` (``compute_types``; dense inputs keep their strides,
others are made dense) and lays the result out from those temporaries; CUDA casts
inside the kernel. ``cpu_promoted`` models that step (``.to`` on a meta tensor gives
the temporary's strides), so the rule needs the result's device and dtype.
"""
from __future__ import annotations

import torch

_META = torch.device("meta")
_CPU = torch.device("cpu")
#: pointwise-tagged ops (or single overloads) whose eager result is not laid out by the
#: rule: ``mvlgamma``, ``masked_fill`` and ``pow`` of a number are contiguous;
#: ``conj_physical`` of a real tensor keeps its input's layout, dense or not;
#: ``threshold_backward`` iterates its operands in another order than its schema's.
#: tests/test_elementwise_layout.py checks every other one against eager.
_NOT_BY_RULE = frozenset({"aten::conj_physical", "aten::_conj_physical", "aten::mvlgamma",
                          "aten::isin", "aten::masked_fill", "aten::pow.Scalar",
                          "aten::threshold_backward"})


def follows_rule(func) -> bool:
    """Is ``func`` (a functional, pointwise-tagged op) laid out by the rule in eager?"""
    name = func._schema.name
    return name not in _NOT_BY_RULE and f"{name}.{func._overloadname}" not in _NOT_BY_RULE


def _contiguous(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(out))


def elementwise_strides(shape, tensors) -> tuple:
    """The strides of an elementwise result of broadcast ``shape`` computed from the
    input ``tensors`` (in argument order; 0-d ones included)."""
    shape = tuple(int(s) for s in shape)
    n = len(shape)
    if n == 0:
        return ()
    same_shape = all(tuple(t.shape) == shape for t in tensors)
    if tensors and same_shape:
        if all(t.is_contiguous() for t in tensors):
            return _contiguous(shape)
        if all(t.is_contiguous(memory_format=torch.channels_last) for t in tensors):
            return tuple(torch.empty(shape, device=_META,
                                     memory_format=torch.channels_last).stride())
        if all(_non_overlapping_and_dense(t) for t in tensors) and \
                len({tuple(t.stride()) for t in tensors}) == 1:
            return tuple(tensors[-1].stride())
    # each input's strides broadcast to ``shape`` (0 where broadcast)
    strides = []
    for t in tensors:
        off = n - t.dim()
        st = [0] * n
        for i, (s, d) in enumerate(zip(t.shape, t.stride())):
            st[off + i] = 0 if (s == 1 and shape[off + i] != 1) else d
        strides.append(st)

    def should_swap(d0, d1) -> int:
        for st in strides:
            s0, s1 = st[d0], st[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(n - 1, -1, -1))        # perm[0]: the innermost dim
    if n > 1:
        for i in range(1, n):
            d1 = i
            for d0 in range(i - 1, -1, -1):
                c = should_swap(perm[d0], perm[d1])
                if c > 0:
                    perm[d0], perm[d1] = perm[d1], perm[d0]
                    d1 = d0
                elif c < 0:
                    break
    if perm == list(range(n - 1, -1, -1)):
        return _contiguous(shape)
    out = [0] * n
    acc = 1
    for d in perm:
        out[d] = acc
        acc *= shape[d]
    return tuple(out)


def _non_overlapping_and_dense(t) -> bool:
    return torch._C._is_non_overlapping_and_dense(t) if hasattr(
        torch._C, "_is_non_overlapping_and_dense") else _nod(t)


def _nod(t) -> bool:
    if t.dim() == 1:
        return t.shape[0] < 2 or t.stride(0) == 1
    dims = sorted(range(t.dim()), key=lambda d: (t.shape[d] == 1, t.stride(d)))
    expect = 1
    for d in dims:
        if t.shape[d] == 1:
            continue
        if t.stride(d) != expect:
            return False
        expect *= t.shape[d]
    return True


def operands(func, args, kwargs) -> list:
    """The tensors TensorIterator iterates over for ``func(*args, **kwargs)``, in
    argument order: tensor arguments, and numbers passed where the schema takes a
    tensor (eager wraps them as 0-d tensors)."""
    return [t for t, _ in _operands(func, args, kwargs)]


def _operands(func, args, kwargs) -> list:
    """(tensor, what promotion ranks it as) per operand: a number passed where the
    schema takes a tensor is a 0-d meta tensor of its wrapped dtype, ranked "number"."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(v, torch.Tensor):
            out.append((v, _DIM if v.dim() else _ZERO_DIM))
        elif isinstance(v, (int, float, bool, complex)) and str(a.type).startswith("Tensor"):
            out.append((torch.empty((), dtype=_number_dtype(v), device=_META), _NUMBER))
    return out


_DIM, _ZERO_DIM, _NUMBER = range(3)


def _number_dtype(v) -> torch.dtype:
    """The dtype a Python number is wrapped as (its kind; floats the default dtype)."""
    if isinstance(v, bool):
        return torch.bool
    if isinstance(v, int):
        return torch.int64
    if isinstance(v, float):
        return torch.get_default_dtype()
    return torch.complex128 if torch.get_default_dtype() == torch.float64 else torch.complex64


def _kind(dt) -> int:
    return 3 if dt.is_complex else 2 if dt.is_floating_point else 0 if dt == torch.bool else 1


def _combine(higher, lower):
    """c10's ``combine_categories``: a lower-ranked operand (0-d, then numbers) counts
    only where it is of a higher kind (bool < integer < floating < complex)."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return higher.to_complex() if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher == torch.bool or lower.is_floating_point:
        return torch.promote_types(higher, lower)
    return higher


def result_type(ranked) -> torch.dtype | None:
    """Type promotion of (tensor, rank) operands, as TensorIterator computes it."""
    per = [None, None, None]
    for t, rank in ranked:
        per[rank] = t.dtype if per[rank] is None else torch.promote_types(per[rank], t.dtype)
    return _combine(per[_DIM], _combine(per[_ZERO_DIM], per[_NUMBER]))


def common_dtype(ranked, out_dtype) -> torch.dtype | None:
    """The dtype TensorIterator computes in for operands giving a result of
    ``out_dtype``: the promoted one, or the result's where integer operands give a
    floating result (ops that promote integers to float)."""
    promoted = result_type(ranked)
    if promoted is not None and _kind(promoted) <= 1 and out_dtype.is_floating_point:
        return out_dtype
    return promoted


def cpu_promoted(ranked, out_dtype) -> list:
    """The tensors the CPU's TensorIterator lays the result out from: each operand of
    another dtype than the common one replaced by its ``.to(common)`` temporary."""
    common = common_dtype(ranked, out_dtype)
    return [t if common is None or t.dtype == common else t.to(common) for t, _ in ranked]


def eager_strides(func, args, kwargs, shape, dtype, device=_CPU):
    """The strides eager's TensorIterator gives ``func``'s result of ``shape`` and
    ``dtype`` on ``device``; None where an operand is not strided."""
    ranked = _operands(func, args, kwargs)
    if not ranked or any(t.layout != torch.strided for t, _ in ranked):
        return None
    tensors = cpu_promoted(ranked, dtype) if torch.device(device).type == "cpu" \
        else [t for t, _ in ranked]
    return elementwise_strides(shape, tensors)


def relayout(func, args, kwargs, out, dtype=None, device=_CPU):
    """``out`` (``func``'s meta result) with the strides eager gives it on ``device``
    (for a result of eager's ``dtype``, ``out``'s by default), when ``func`` is laid out
    by the rule and they differ; else ``out`` itself."""
    if not isinstance(out, torch.Tensor) or out.device.type != "meta" or \
            out.layout != torch.strided or out.numel() == 0 or not follows_rule(func) or \
            kwargs.get("memory_format") is not None:
        return out
    strides = eager_strides(func, args, kwargs, out.shape, dtype or out.dtype, device)
    if strides is None or all(n == 1 or a == b
                              for n, a, b in zip(out.shape, strides, out.stride())):
        return out        # the same memory order (size-1 dims' strides address nothing)
    return torch.empty_strided(tuple(out.shape), strides, dtype=out.dtype, device=_META)
