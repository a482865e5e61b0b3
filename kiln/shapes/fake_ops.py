"""Running an op on fakes whose sizes are symbolic.

Many of PyTorch's C++ kernels for meta tensors take plain int sizes (``expand``,
``native_layer_norm``'s composite, ``slice``'s storage offset) and refuse symbolic
ones. As PyTorch's own fake tensors do, such an op runs as its Python decomposition
(``torch._decomp``) or its CompositeImplicit decomposition, on the fakes, where every
step is an op whose meta kernel takes symbolic sizes; ops with a Python meta kernel,
and view-copy ops, run as they are.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

_CPP_SYMINT = {aten.empty.memory_format, aten.empty_strided.default, aten.as_strided.default,
               aten.as_strided_.default, aten.zeros.default, aten.detach.default,
               aten.view_as_real.default, aten.view_as_complex.default, aten.stack.default}


# C++ kernels that take symbolic sizes and give simpler expressions than a decomposition
_AS_IS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.mm.default, aten.bmm.default, aten.addmm.default}


def is_symbolic(x) -> bool:
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(x, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in x.shape) or \
            any(isinstance(s, torch.SymInt) for s in x.stride())
    if isinstance(x, (list, tuple)):
        return any(is_symbolic(i) for i in x)
    if isinstance(x, dict):
        return any(is_symbolic(i) for i in x.values())
    return False


def run_decomposed(func, args, kwargs, mode_cls):
    """``func`` as its decomposition under ``mode_cls`` (the fake mode, so that each
    step comes back to fake dispatch); NotImplemented where it has to run as it is."""
    from torch._decomp import decomposition_table, meta_table

    if func in _CPP_SYMINT or func in _AS_IS or torch.Tag.view_copy in func.tags:
        return NotImplemented
    meta = meta_table.get(func)
    if meta is not None:   # a Python meta kernel: on the fakes' meta tensors, wrapped again
        try:
            with mode_cls():
                return meta(*args, **kwargs)
        except Exception:  # noqa: BLE001
            return NotImplemented
    decomp = decomposition_table.get(func)
    try:
        with mode_cls():
            if decomp is not None:
                return decomp(*args, **kwargs)
            return func.decompose(*args, **kwargs)
    except Exception:  # noqa: BLE001  (the op's own kernel decides, as it is)
        return NotImplemented
