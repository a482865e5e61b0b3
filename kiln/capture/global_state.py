"""The global torch state a trace depends on, guarded on every call.

A trace folds what it reads of PyTorch's global state into its graph: the default
dtype decides what factories and Python scalars become, the inference-mode flag what
tensors are made, the deterministic flag which kernels eager would pick or refuse, the
torch-function mode stack (``torch.set_default_device``) where factories allocate.
All of it is one tuple, read by one cheap call (well under a microsecond: no default
device lookup, only the mode stack's shape), compared with the one the trace saw.
Grad mode has its own guard (``GuardSet.grad_mode``).

Autocast on the CPU and CUDA is part of the tuple (enabled device types with their
dtypes, the cache flag): a trace starts in it and makes autocast's casts explicit
(``autocast_state.py``). Some state kiln cannot reproduce in a graph: autocast of other
device types, torch-function and dispatch modes set by the user (other than ``torch.device`` contexts:
they would not see compiled kernels) and functorch
transforms (``vmap``, ``grad``: a trace would see one unbatched sample). A call made
under such state runs eagerly, in an entry guarded on that state (``eager_reason``).
"""
from __future__ import annotations

import torch

from kiln.capture.autocast_state import entry_key, snapshot_key as _autocast

_inference = torch.is_inference_mode_enabled
_default_dtype = torch.get_default_dtype
_deterministic = torch.are_deterministic_algorithms_enabled
_deterministic_warn = torch.is_deterministic_algorithms_warn_only_enabled
_function_stack_len = torch._C._len_torch_function_stack
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_functorch_level = torch._C._functorch.peek_interpreter_stack


def _function_modes() -> tuple:
    """The torch-function modes in force, by type and (for ``torch.device`` contexts,
    ``set_default_device``) device."""
    if not _function_stack_len():
        return ()
    from torch.overrides import _get_current_function_mode_stack

    return tuple((type(m), getattr(m, "device", None)) for m in _get_current_function_mode_stack())


def snapshot() -> tuple:
    """Everything below, as one comparable value."""
    return (_inference(), _default_dtype(), _autocast(), _deterministic(),
            _deterministic_warn(), _function_modes(), _dispatch_stack_len(),
            _functorch_level() is not None)


def traced_snapshot() -> tuple:
    """``snapshot()`` as the call being traced came in (a trace runs with the real
    autocast state off: ``autocast_state.tracing``)."""
    s = snapshot()
    return s[:2] + (entry_key(),) + s[3:]


def describe(state: tuple) -> str:
    inference, dtype, autocast, det, det_warn, modes, dispatch, functorch = state
    parts = [f"inference_mode={inference}", f"default dtype={dtype}", _describe_autocast(autocast),
             f"deterministic={det}{' (warn only)' if det_warn else ''}"]
    if modes:
        parts.append("function modes=" + ", ".join(
            t.__qualname__ + (f"({d})" if d is not None else "") for t, d in modes))
    if dispatch:
        parts.append(f"{dispatch} dispatch mode(s)")
    if functorch:
        parts.append("inside a functorch transform")
    return ", ".join(parts)


def eager_reason(state: tuple) -> tuple[str, str] | None:
    """Why a call under ``state`` must run eagerly (its break ID and the reason), or
    None when kiln can trace it."""
    _inference_on, _dtype, autocast, _det, _det_warn, modes, dispatch, functorch = state
    if any(t.__name__ != "DeviceContext" for t, _ in modes):
        return "K0050", "a TorchFunctionMode is active (compiled kernels would bypass it)"
    if autocast is not None and autocast[2]:
        return "K0034", f"autocast is enabled on {', '.join(autocast[2])} (kiln models CPU and CUDA autocast)"
    if dispatch:
        return "K0051", "a TorchDispatchMode is active (compiled kernels would bypass it)"
    if functorch:
        return "K0052", "called inside a functorch transform (vmap, grad…), which kiln does not trace"
    return None



def _describe_autocast(key) -> str:
    if key is None:
        return "autocast off"
    on, cache, other = key
    parts = [f"{d} {dtype}" for d, dtype in on] + list(other)
    return f"autocast {', '.join(parts) or 'nesting only'} (cache {'on' if cache else 'off'})"
