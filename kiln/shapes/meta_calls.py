"""An aten op's result on plain meta tensors whose sizes are symbolic, computed
without recording anything: what kiln's autograd tracer needs for the metadata of each
op it records. Many of PyTorch's C++ meta kernels take only int sizes; as in capture's
fake dispatch (``fake_ops``), a pointwise op on row-major inputs is computed directly,
``view`` as kiln's own kernel, other ops as their Python meta kernel or decomposition
(a C++ kernel of int sizes would fix them; one refusing SymInts is decomposed from then
on), each step of which comes back here (``_SymbolicMeta``)."""
from __future__ import annotations

import sys

import torch
from torch.utils._pytree import tree_map

from kiln.dispatch_mode import KilnDispatchMode
from kiln.shapes import view_meta
from kiln.shapes.fake_ops import (_COMPOSITE_REFUSALS, _RETRY_FRAMES, META, _depth, cpp_refused,
                                  is_symbolic, pointwise_result, run_decomposed)

aten = torch.ops.aten
_META = torch.device("meta")
_device_arg: dict = {}


def _on_meta(x):
    if isinstance(x, torch.Tensor) and x.device.type != "meta":
        return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=_META)
    return x


def _device_arg_at(func):
    """The position of ``func``'s ``device`` argument (None: it has none)."""
    if func not in _device_arg:
        schema = getattr(func, "_schema", None)
        _device_arg[func] = next((i for i, a in enumerate(schema.arguments)
                                  if a.name == "device"), None) if schema is not None else None
    return _device_arg[func]

_OWN = {aten.view.default: view_meta.view, aten._unsafe_view.default: view_meta.view}


def call_meta(func, args, kwargs):
    """``func(*args, **kwargs)`` on meta tensors, symbolic sizes allowed."""
    at = _device_arg_at(func)
    if at is not None:                  # a factory inside a decomposition: on meta too
        if at < len(args):
            args = (*args[:at], _META, *args[at + 1:])
        elif kwargs.get("device") != _META:
            kwargs = {**kwargs, "device": _META}
    if not (is_symbolic(args) or is_symbolic(kwargs)):
        return func(*args, **kwargs)
    # a real tensor a decomposition made (a 0-d scalar): its metadata, on meta
    args, kwargs = tree_map(_on_meta, (args, kwargs))
    # kiln's own results: ``view``, and ops whose Python meta reads int sizes (``META``)
    own = _OWN.get(func) or META.get(func)
    if own is not None:
        return own(*args, **kwargs)
    try:
        out = pointwise_result(func, args, kwargs)
    except Exception:  # noqa: BLE001  (a shortcut; the kernel decides)
        out = None
    if out is not None:
        return out
    # a C++ kernel of int sizes may specialise them silently (guard_int) rather than
    # refuse: as capture does, the Python kernel goes first, the C++ one where none
    r = run_decomposed(func, args, kwargs, _SymbolicMeta)
    if r is not NotImplemented:
        return r
    try:
        return func(*args, **kwargs)
    except RuntimeError as e:
        if not cpp_refused(func, str(e)):
            raise
        err = e
    r = run_decomposed(func, args, kwargs, _SymbolicMeta)
    if r is NotImplemented:
        raise err
    return r


class _SymbolicMeta(KilnDispatchMode):
    """The steps of a decomposition run for metadata only."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return call_meta(func, args, kwargs or {})


#: what a C++ composite reading a symbolic tensor's int sizes says under a dispatch mode
#: on plain meta tensors (the size read reaches the mode as ``aten::size``)
_INT_SIZE_READS = _COMPOSITE_REFUSALS + ("operator aten::size does not exist",)


def reads_int_sizes(message: str) -> bool:
    return any(r in message for r in _INT_SIZE_READS)


def retry_python_composite(call):
    """``call()`` again under PyTorch's Python dispatcher, which takes the op's Python
    CompositeImplicit kernel (each step an op taking symbolic sizes), under the
    recursion limit ``fake_ops.call_on_fakes`` uses for the same retry."""
    import torch._decomp  # noqa: F401  (registers the Python composite kernels)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + _RETRY_FRAMES)
    try:
        with torch._C._EnablePythonDispatcher():
            return call()
    finally:
        sys.setrecursionlimit(limit)
