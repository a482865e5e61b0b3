"""The backend registry: names to ``backend(gm, example_inputs) -> callable``.

The contract is PyTorch's: a backend receives a torch-level ``fx.GraphModule`` and
example inputs (real tensors, or the meta stand-ins capture traced with) and returns a
callable taking the graph's inputs positionally and returning what ``gm`` returns.
Built-in backends that live in heavier packages are registered by a dotted path and
imported on first use, so ``import kiln`` stays cheap.
"""
# Names torch.compile only as the reference for the contract and semantics kiln
# follows (DESIGN.md); nothing here imports or calls torch's compiler stack.
from __future__ import annotations

import importlib
from typing import Callable

from kiln import gc_pause

Backend = Callable  # (gm: torch.fx.GraphModule, example_inputs: list) -> callable

_registry: dict[str, Backend | str] = {}


def register_backend(name: str | None = None, fn: Backend | None = None):
    """Register ``fn`` under ``name``; usable as ``@register_backend`` or
    ``@register_backend("name")`` or ``register_backend("name", fn)``."""
    if callable(name) and fn is None:
        f = name
        _registry[f.__name__] = f
        return f
    if fn is None:
        def deco(f):
            _registry[name or f.__name__] = f
            return f
        return deco
    _registry[name or fn.__name__] = fn
    return fn


def list_backends() -> list[str]:
    return sorted(_registry)


def lookup_backend(backend) -> Backend:
    """A callable backend from a name or a callable; unknown names raise with the list."""
    if callable(backend):
        return backend
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a name or a callable, not {type(backend).__name__}")
    try:
        entry = _registry[backend]
    except KeyError:
        raise ValueError(
            f"unknown kiln backend {backend!r}; registered: {', '.join(list_backends())}"
        ) from None
    if isinstance(entry, str):
        mod, _, attr = entry.rpartition(".")
        # the backend's modules are imported at the first compile: an import of many
        # modules can set off a full collection, which walks the user's whole heap (a
        # resnet18 program's: 0.15 s of a 0.38 s warm first call); paused, as compiles are
        with gc_pause.paused():
            entry = getattr(importlib.import_module(mod), attr)
        _registry[backend] = entry
    return entry


def eager(gm, example_inputs):
    """Run the captured torch-level graph as it is: tests capture alone."""
    return gm.forward


register_backend("eager", eager)
register_backend("aot_eager", "kiln.autograd.backend.aot_eager")
register_backend("kiln", "kiln.kernels.backend.kiln_backend")
