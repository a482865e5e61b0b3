"""Result metadata of the commonest ops on contiguous meta tensors, without PyTorch's
Python meta kernels.

Every traced op runs on ``meta`` tensors (capture, the autograd stage). For pointwise
ops, softmax, LayerNorm and matmuls PyTorch's meta kernels are Python reference
implementations whose first call imports sympy and PyTorch's symbolic-shape module
(0.4-0.6 s), which alone was a third of a cold compile of a one-kernel graph. On
contiguous inputs (the common case) their results are simple, so ``meta_result``
computes them here:

* pointwise ops (``Tag.pointwise``, functional, not random): the broadcast shape,
  contiguous; the dtype is what the op itself returns for one-element CPU tensors of the
  inputs' dtypes (0-d kept 0-d, as type promotion ranks them lower), remembered per
  signature, so type promotion is eager's own;
* ``_softmax`` / ``_log_softmax``, ``native_layer_norm``, ``mm`` / ``addmm`` / ``bmm``:
  their shapes and dtypes, checked as the meta kernels check them.

Anything else returns None and the caller runs the meta kernel; but a pointwise op on
inputs not laid out contiguously runs its meta kernel here, its result given the
strides eager's TensorIterator gives it (``elementwise_layout``: several meta kernels
are references that lay the result out otherwise). A test compares every shortcut
with PyTorch's meta kernel over many shapes and dtypes.
"""
# Names torch.fx.experimental.symbolic_shapes only to say what it avoids (never imported).
from __future__ import annotations

import torch

from .elementwise_layout import relayout
from .ops import CATALOGUE

aten = torch.ops.aten
_META = torch.device("meta")
_CPU = torch.device("cpu")
_pointwise_ok: dict = {}
_dtypes: dict = {}
_SCALARS = (bool, int, float, str, type(None))


def _contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


# Not torch.broadcast_shapes: it imports symbolic_shapes (named here only; never imported).
def _broadcast(*shapes) -> tuple | None:
    """The broadcast of ``shapes``, or None if they do not broadcast (without PyTorch's
    own helper, which loads its symbolic-shape module)."""
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s, n - len(s)):
            if d != 1:
                if out[i] != 1 and out[i] != d:
                    return None
                out[i] = d
    return tuple(out)


def _plain(t) -> bool:
    """A meta tensor laid out as ``torch.empty`` would lay it out."""
    return (t.device.type == "meta" and t.layout == torch.strided
            and t.storage_offset() == 0 and t.stride() == _contiguous_strides(t.shape))


def _is_pointwise(func) -> bool:
    ok = _pointwise_ok.get(func)
    if ok is None:
        tags = getattr(func, "tags", ())
        schema = getattr(func, "_schema", None)
        ok = (schema is not None and torch.Tag.pointwise in tags
              and torch.Tag.nondeterministic_seeded not in tags
              and not schema.is_mutable and len(schema.returns) == 1
              and str(schema.returns[0].type) == "Tensor"
              and schema.returns[0].alias_info is None
              and all(a.alias_info is None for a in schema.arguments))
        _pointwise_ok[func] = ok
    return ok


def _probe(x):
    if isinstance(x, torch.Tensor):
        return torch.ones(() if x.dim() == 0 else (1,), dtype=x.dtype)
    return x


def _probe_key(x):
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim() == 0)
    return (type(x), x)


def _pointwise_dtype(func, args, kwargs):
    key = (func, tuple(_probe_key(a) for a in args),
           tuple(sorted((k, _probe_key(v)) for k, v in kwargs.items())))
    dt = _dtypes.get(key)
    if dt is None:
        with torch.no_grad():
            out = func(*[_probe(a) for a in args],
                       **{k: _probe(v) for k, v in kwargs.items()})
        dt = _dtypes[key] = out.dtype
    return dt


def _pointwise(func, args, kwargs, accepts=None):
    """A pointwise op's result: the broadcast shape, contiguous, of the dtype the op
    gives one-element tensors; None unless every tensor argument ``accepts`` (default
    ``_plain``; a symbolic caller passes its own test) and nothing asks for a layout."""
    accepts = accepts or _plain
    tensors = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            if not accepts(a):
                return None
            tensors.append(a)
        elif not isinstance(a, _SCALARS):
            return None
    if not tensors or kwargs.get("memory_format") is not None or "device" in kwargs:
        return None
    shape = _broadcast(*[t.shape for t in tensors])
    if shape is None:
        return None
    try:
        dtype = _pointwise_dtype(func, args, kwargs)
    except Exception:                # noqa: BLE001  (the meta kernel says what is wrong)
        return None
    return torch.empty(shape, dtype=dtype, device=_META)


def _softmax(x, dim, half_to_float):
    if (not _plain(x) or half_to_float or not x.dtype.is_floating_point
            or not -max(x.dim(), 1) <= dim < max(x.dim(), 1)):
        return None
    return torch.empty(x.shape, dtype=x.dtype, device=_META)


def _layer_norm(x, normalized_shape, weight, bias, eps):
    n = len(normalized_shape)
    if (not _plain(x) or not x.dtype.is_floating_point or n == 0 or n > x.dim()
            or tuple(x.shape[x.dim() - n:]) != tuple(normalized_shape)):
        return None
    for p in (weight, bias):
        if p is not None and (not _plain(p) or tuple(p.shape) != tuple(normalized_shape)
                              or p.dtype != x.dtype):
            return None
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    stat_shape = tuple(x.shape[:x.dim() - n]) + (1,) * n
    return (torch.empty(x.shape, dtype=x.dtype, device=_META),
            torch.empty(stat_shape, dtype=acc, device=_META),
            torch.empty(stat_shape, dtype=acc, device=_META))


def _mm(a, b):
    if (a.dim() != 2 or b.dim() != 2 or not (_plain(a) or _plain(a.t()))
            or not (_plain(b) or _plain(b.t()))
            or a.shape[1] != b.shape[0] or a.dtype != b.dtype):
        return None
    return torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=_META)


def _addmm(bias, a, b, beta=1, alpha=1):
    out = _mm(a, b)
    if (out is None or not _plain(bias) or bias.dtype != a.dtype
            or _broadcast(bias.shape, out.shape) != tuple(out.shape)):
        return None
    return out


def _bmm(a, b):
    if (not _plain(a) or not _plain(b) or a.dim() != 3 or b.dim() != 3
            or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1] or a.dtype != b.dtype):
        return None
    return torch.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=a.dtype, device=_META)


#: shortcut name (the catalogue's ``meta`` fact, ``kiln/ops``, says which ops) -> function
_SHORTCUTS = {"softmax": _softmax, "layer_norm": _layer_norm, "mm": _mm, "addmm": _addmm,
              "bmm": _bmm}
#: op -> shortcut, for every op the catalogue gives one
_SPECIAL = {op: _SHORTCUTS[i.meta] for op, i in CATALOGUE.items() if i.meta}


#: ops whose ``Tensor scalars`` argument (the last) must be a CPU tensor: eager reads its
#: values on the host, and so does their meta kernel (it converts them to a scalar list)
_HOST_SCALARS_ARG = {getattr(getattr(aten, n), "Tensor") for n in (
    "_foreach_addcdiv", "_foreach_addcdiv_", "_foreach_addcmul", "_foreach_addcmul_")
    if hasattr(aten, n) and "Tensor" in getattr(aten, n).overloads()}


def host_scalars_arg(func, meta_args, on_cpu, args=None):
    """``meta_args`` with the ``scalars`` of an op in ``_HOST_SCALARS_ARG`` that stands
    for a CPU tensor (``on_cpu`` of its argument in ``args``) given as a real CPU
    tensor of its shape: its values do not change the result's metadata."""
    args = meta_args if args is None else args
    if func not in _HOST_SCALARS_ARG or len(meta_args) != 4 or not on_cpu(args[3]):
        return meta_args
    s = meta_args[3]
    return (*meta_args[:3], torch.zeros(s.shape, dtype=s.dtype))


def meta_result(func, args, kwargs, device=_CPU):
    """``func``'s result on these meta tensors, standing for tensors on ``device`` (it
    decides some layouts: ``elementwise_layout``), or None when the meta kernel must say.
    Symbolic sizes (``kiln/shapes``) are declined: these shortcuts compare plain ints."""
    if _symbolic(args) or _symbolic(kwargs.values()):
        return None
    special = _SPECIAL.get(func)
    if special is not None:
        try:
            return special(*args, **kwargs)
        except TypeError:                # an unexpected argument: the kernel decides
            return None
    if _is_pointwise(func):
        out = _pointwise(func, args, kwargs)
        return out if out is not None else _pointwise_laid_out(func, args, kwargs, device)
    return None


def _symbolic(xs) -> bool:
    for x in xs:
        if isinstance(x, torch.Tensor):
            if any(isinstance(s, torch.SymInt) for s in x.shape):
                return True
        elif isinstance(x, (torch.SymInt, torch.SymFloat)):
            return True
        elif isinstance(x, (list, tuple)) and _symbolic(x):
            return True
    return False


def _pointwise_laid_out(func, args, kwargs, device):
    """The meta kernel's result laid out as eager lays it out (``elementwise_layout``),
    of eager's dtype (as for plain inputs); None where the kernel raises (the caller runs it again, for its error) or an input
    is not a meta tensor."""
    if any(isinstance(a, torch.Tensor) and a.device.type != "meta"
           for a in list(args) + list(kwargs.values())):
        return None
    try:
        out = func(*args, **kwargs)
        dtype = _pointwise_dtype(func, args, kwargs)      # eager's, as for plain inputs
    except Exception:                # noqa: BLE001  (the caller's call raises it)
        return None
    out = relayout(func, args, kwargs, out, dtype, device)
    if dtype == out.dtype:
        return out
    return torch.empty_strided(tuple(out.shape), out.stride(), dtype=dtype, device=_META)
