"""Keeping PyTorch's own compiler out of kiln's process: the base of kiln's dispatch
modes, and ``spare_compiler_import``.

PyTorch marks some of its functions "not to be traced by its compiler" with a wrapper
that imports ``torch._dynamo`` at its first call: every ``TorchDispatchMode``
subclass's ``__torch_dispatch__``, and the Python meta kernels of elementwise ops
(``torch._prims_common.wrappers``). kiln's capture calls both, so without care its first
capture imports that compiler — 1.7 to 3.7 s, most of a small function's compile time,
for a compiler kiln never uses. (DESIGN.md: kiln does not use ``torch._dynamo``.)
"""
from __future__ import annotations

import gc
import sys
import types

from torch.utils._python_dispatch import TorchDispatchMode


class KilnDispatchMode(TorchDispatchMode):
    """kiln's modes are never traced by PyTorch's compiler, so they opt out of the
    wrapper (the classmethod PyTorch provides for this; a no-op where it does not),
    and the meta kernels they run are spared it too."""

    def __init__(self, *args, **kwargs):
        spare_compiler_import()
        super().__init__(*args, **kwargs)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


class _UntilCompilerLoaded:
    """What a wrapped function runs instead of the wrapper's import: the function
    itself while ``torch._dynamo`` is not imported (then no frame can be under its
    tracing, and "disable tracing" changes nothing); once something else has imported
    it, PyTorch's own wrapper again, so behaviour is PyTorch's from then on."""

    __slots__ = ("fn", "wrapper")

    def __init__(self, fn, wrapper):
        self.fn, self.wrapper = fn, wrapper

    def __call__(self, *args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return self.fn(*args, **kwargs)
        try:
            delattr(self.fn, "__dynamo_disable")
        except AttributeError:
            pass
        return self.wrapper(*args, **kwargs)


_installed = False


def _probe():
    pass


def spare_compiler_import() -> None:
    """Pre-fill the cache attribute the wrapper reads (``fn.__dynamo_disable``) of every
    wrapped function that exists now with ``_UntilCompilerLoaded``, once per process.
    Wrappers are found as the functions that share the wrapper's code object; anything
    unexpected (another PyTorch) leaves PyTorch's behaviour in place."""
    global _installed
    if _installed or "torch._dynamo" in sys.modules:
        return
    _installed = True
    try:
        import torch._compile
        code = torch._compile._disable_dynamo(_probe).__code__
    except (ImportError, AttributeError, TypeError):
        return
    for wrapper in gc.get_referrers(code):
        if type(wrapper) is not types.FunctionType or wrapper.__closure__ is None:
            continue
        cells = dict(zip(wrapper.__code__.co_freevars, wrapper.__closure__))
        try:
            fn = cells["fn"].cell_contents
        except (KeyError, ValueError):
            continue
        if getattr(fn, "__dynamo_disable", None) is None:
            try:
                setattr(fn, "__dynamo_disable", _UntilCompilerLoaded(fn, wrapper))
            except (AttributeError, TypeError):
                pass
