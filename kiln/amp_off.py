"""Running compiled code with autocast off: kiln's graphs carry the casts autocast would
insert as nodes of their own (``capture/autocast.py``), so autocast must not act on
their ops again — in the forward call, and in the backward, which the user may call
inside an autocast block. Shared by capture (graph calls) and autograd (backward)."""
from __future__ import annotations

import contextlib

import torch

_DEVICES = ("cpu", "cuda")
_any_enabled = torch._C._is_any_autocast_enabled
_is_enabled = torch.is_autocast_enabled
_set_enabled = torch.set_autocast_enabled


def without_autocast(fn):
    """``fn`` called with CPU and CUDA autocast off, the state restored after."""
    def call(*args):
        if not _any_enabled():
            return fn(*args)
        was = [(d, _is_enabled(d)) for d in _DEVICES]
        for d, _ in was:
            _set_enabled(d, False)
        try:
            return fn(*args)
        finally:
            for d, on in was:
                _set_enabled(d, on)

    return call


@contextlib.contextmanager
def suspended():
    """CPU and CUDA autocast off while the block runs."""
    if not _any_enabled():
        yield
        return
    was = [(d, _is_enabled(d)) for d in _DEVICES]
    for d, _ in was:
        _set_enabled(d, False)
    try:
        yield
    finally:
        for d, on in was:
            _set_enabled(d, on)
