"""Running an op on fakes whose sizes are symbolic.

Many of PyTorch's C++ kernels for meta tensors take plain int sizes (``expand``,
``native_layer_norm``'s composite, ``slice``'s storage offset) and refuse symbolic
ones. As PyTorch's own fake tensors do, such an op runs as its Python decomposition
(``torch._decomp``) or its CompositeImplicit decomposition, on the fakes, where every
step is an op whose meta kernel takes symbolic sizes; ops with a Python meta kernel,
and view-copy ops, run as they are.
"""
from __future__ import annotations

import sys
import threading

import torch

from kiln.shapes import view_meta

aten = torch.ops.aten

_CPP_SYMINT = {aten.empty.memory_format, aten.empty_strided.default, aten.as_strided.default,
               aten.as_strided_.default, aten.zeros.default, aten.detach.default,
               aten.view_as_real.default, aten.view_as_complex.default, aten.stack.default}


# C++ kernels that take symbolic sizes and give simpler expressions than a decomposition
_AS_IS = {aten.reshape.default, aten.mm.default, aten.bmm.default, aten.addmm.default}

# kiln's own, where PyTorch's C++ kernel does not take SymInts in every version and its
# Python reference asks more questions (more guards)
_OWN = {aten.view.default: view_meta.view, aten._unsafe_view.default: view_meta.view}

# What a C++ kernel whose signature takes only int sizes says when given SymInts (some
# versions of PyTorch take SymInts in a kernel that others do not: ``view``'s meta
# kernel, ``stack``): such an op is remembered and runs as its decomposition from then on.
_REFUSALS = ("expected to contain only concrete integers",
             "on tensor with symbolic sizes/strides")
_refused: set = set()


# What a C++ CompositeImplicit kernel (``matmul`` of 3-d by 2-d in 2.11) says when it
# reads int sizes (``numel()``, ``sizes()``) of a tensor whose sizes are symbolic; the
# last is the same read reaching a wrapper subclass's ``aten.size``
_COMPOSITE_REFUSALS = _REFUSALS + ("dispatch_on_subclass called with NO overloaded args",)


def call_on_fakes(fn, args, kwargs):
    """``fn(*args, **kwargs)`` (a torch-level function, on fakes). Where a C++
    composite kernel refuses symbolic sizes, the call runs again under PyTorch's Python
    dispatcher, which takes the op's Python CompositeImplicit kernel (registered by
    ``torch._decomp``) instead: each of its steps an op that fake dispatch handles."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as e:
        if not (is_symbolic(args) or is_symbolic(kwargs)) or \
                not any(r in str(e) for r in _COMPOSITE_REFUSALS):
            raise
        refusal = e
    import torch._decomp  # noqa: F401  (registers the Python composite kernels)

    # Some Python kernels call their own op again on tensors that never reach the
    # requested device (``_to_copy`` -> ``prims.device_put`` -> ``_to_copy`` on meta
    # tensors): a recursion through C++ frames that overflows the C stack (a crash, not
    # an exception) unless Python's recursion limit stops it first. So the retry runs
    # under a limit a little above the current depth; hitting it raises the C++
    # kernel's own refusal, and the call is a graph break as before.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(_depth() + _RETRY_FRAMES)
    try:
        with torch._C._EnablePythonDispatcher():
            return fn(*args, **kwargs)
    except RecursionError:
        raise refusal from None
    finally:
        sys.setrecursionlimit(limit)


#: Python frames a retry under the Python dispatcher may use above its caller's
_RETRY_FRAMES = 300


def _depth() -> int:
    f, n = sys._getframe(), 0
    while f is not None:
        f, n = f.f_back, n + 1
    return n


def _addmm(self, mat1, mat2, *, beta=1, alpha=1):
    """``addmm``'s result on meta tensors of symbolic sizes: ``mm``'s (whose C++ meta
    kernel takes SymInts), after addmm's own checks. PyTorch's Python meta for it (its
    decomposition) upcasts a bf16 operand with ``Tensor.to``, whose C++ side reads int
    sizes: the batch size of a bf16 ``Linear`` became a constant."""
    out = aten.mm.default(mat1, mat2)
    if self.dtype != out.dtype:
        raise RuntimeError(f"self and mat2 must have the same dtype, but got {self.dtype} "
                           f"and {out.dtype}")
    if self.dim() > 2 or any(not (a == 1 or a == b) for a, b in
                             zip(reversed(self.shape), reversed(out.shape))):
        raise RuntimeError(f"The expanded size of the tensor must match the existing size "
                           f"(self {tuple(self.shape)}, result {tuple(out.shape)})")
    return out


def _in_place_view(view):
    """An in-place view op (``squeeze_``) on a meta tensor of symbolic sizes: the
    out-of-place view's geometry, set on ``self`` by ``as_strided_`` (whose C++ kernel
    takes SymInts). PyTorch's C++ ``squeeze_`` on such a tensor crashes the process
    (a segmentation fault, not an exception)."""
    def run(self, *args, **kwargs):
        r = view(self, *args, **kwargs)
        return aten.as_strided_.default(self, r.shape, r.stride(), r.storage_offset())
    return run


#: ops kiln computes itself on meta tensors of symbolic sizes (capture's ``capture.fake``
#: and the autograd trace's ``meta_calls``)
META = {aten.addmm.default: _addmm,
        aten.squeeze_.default: _in_place_view(aten.squeeze.default),
        aten.squeeze_.dim: _in_place_view(aten.squeeze.dim),
        aten.squeeze_.dims: _in_place_view(aten.squeeze.dims)}


def cpp_refused(func, message: str) -> bool:
    """Whether ``message`` is ``func``'s C++ kernel refusing symbolic sizes (then
    remembered: ``run_decomposed`` decomposes ``func`` from now on)."""
    if any(r in message for r in _REFUSALS):
        _refused.add(func)
        return True
    return False


def is_symbolic(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in x.shape) or \
            any(isinstance(s, torch.SymInt) for s in x.stride()) or \
            isinstance(x.storage_offset(), torch.SymInt)
    if isinstance(x, (list, tuple)):
        return any(is_symbolic(i) for i in x)
    if isinstance(x, dict):
        return any(is_symbolic(i) for i in x.values())
    return False


class _Inside(threading.local):
    depth = 0
    funcs = ()      # the ops whose decomposition is running, outermost first


inside = _Inside()   # > 0 while a decomposition runs: its ``device="meta"`` means the fakes' device


def run_decomposed(func, args, kwargs, mode_cls):
    """``func`` as its decomposition under ``mode_cls`` (the fake mode, so that each
    step comes back to fake dispatch); NotImplemented where it has to run as it is."""
    from torch._decomp import decomposition_table, meta_table

    if func not in _refused and (func in _CPP_SYMINT or func in _AS_IS
                                 or torch.Tag.view_copy in func.tags):
        return NotImplemented
    if func in inside.funcs:
        # its decomposition calls it again (``_to_copy`` through ``prims.device_put``):
        # decomposing once more would never end (a C stack overflow, not an exception)
        return NotImplemented
    fn = _OWN.get(func) or meta_table.get(func) or decomposition_table.get(func)
    inside.depth += 1
    outer, inside.funcs = inside.funcs, inside.funcs + (func,)
    try:
        with mode_cls():
            if fn is not None:    # a Python meta kernel or decomposition, on the fakes
                return fn(*args, **kwargs)
            return func.decompose(*args, **kwargs)
    except Exception:  # noqa: BLE001  (the op's own kernel decides, as it is)
        return NotImplemented
    finally:
        inside.depth -= 1
        inside.funcs = outer


def _row_major(t) -> bool:
    """Contiguous, or a broadcast (stride-0) view of a contiguous tensor: the dims
    that move are in decreasing stride order, so TensorIterator lays the result out
    contiguously."""
    if t.is_contiguous():
        return True
    if t.storage_offset() != 0:
        return False
    prev = None
    for n, st in zip(t.shape, t.stride()):
        if n == 1 or st == 0:
            continue
        if prev is not None and not prev >= st:
            return False
        prev = st
    return True


def pointwise_result(func, u_args, u_kwargs):
    """A pointwise op's result on contiguous meta tensors with symbolic sizes: the
    broadcast shape (each comparison a guard), contiguous, of the dtype the op gives
    one-element tensors; None for anything else (the op's kernel decides)."""
    from kiln.fast_meta import _is_pointwise, _pointwise

    if not _is_pointwise(func):
        return None
    return _pointwise(func, u_args, u_kwargs,
                      accepts=lambda a: a.device.type == "meta" and _row_major(a))
