"""Keeping PyTorch's own compiler out of kiln's process: the base of kiln's dispatch
modes, and ``spare_compiler_import``.

PyTorch marks some of its functions "not to be traced by its compiler" with a wrapper
that loads that compiler at its first call: every ``TorchDispatchMode`` subclass's
``__torch_dispatch__``, and the Python meta kernels of elementwise ops
(``torch._prims_common.wrappers``). kiln's capture calls both, so without care its first
capture loads the compiler — 1.7 to 3.7 s, most of a small function's compile time, for
a compiler kiln never uses (DESIGN.md).
"""
from __future__ import annotations

import gc
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Compatibility name: the attribute PyTorch's "do not trace" wrapper caches its
# wrapped function under (``torch._compile``, a small helper module, not the compiler).
_WRAPPER_CACHE_ATTR = "__dynamo_disable"


class KilnDispatchMode(TorchDispatchMode):
    """kiln's modes are never traced by PyTorch's compiler, so they opt out of the
    wrapper (the classmethod PyTorch provides for this; a no-op where it does not),
    and the meta kernels they run are spared it too."""

    def __init__(self, *args, **kwargs):
        spare_compiler_import()
        super().__init__(*args, **kwargs)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:     # PyTorch's opt-out hook, by its name
        return False


class _UntilCompilerLoaded:
    """What a wrapped function runs instead of the wrapper's import: the function
    itself, unless PyTorch's compiler is tracing the caller's program (then "do not
    trace" means something), in which case PyTorch's own wrapper again, so behaviour
    is PyTorch's from then on. kiln never uses that compiler: it only reads whether it
    is active, to stay compatible with programs that also use it (below)."""

    __slots__ = ("fn", "wrapper")

    def __init__(self, fn, wrapper):
        self.fn, self.wrapper = fn, wrapper

    def __call__(self, *args, **kwargs):
        # Compatibility read only: the public flag PyTorch sets while its compiler
        # traces; kiln calls nothing of that compiler (DESIGN.md).
        if not torch.compiler.is_compiling():
            return self.fn(*args, **kwargs)
        try:
            delattr(self.fn, _WRAPPER_CACHE_ATTR)
        except AttributeError:
            pass
        return self.wrapper(*args, **kwargs)


_installed = False


def _probe():
    pass


def spare_compiler_import() -> None:
    """Pre-fill the cache attribute the wrapper reads (``_WRAPPER_CACHE_ATTR``) of every
    wrapped function that exists now with ``_UntilCompilerLoaded``, once per process.
    Wrappers are found as the functions that share the wrapper's code object; anything
    unexpected (another PyTorch) leaves PyTorch's behaviour in place."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        import torch._compile   # compatibility read: the wrapper's code object, to find it
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
        if getattr(fn, _WRAPPER_CACHE_ATTR, None) is None:
            try:
                setattr(fn, _WRAPPER_CACHE_ATTR, _UntilCompilerLoaded(fn, wrapper))
            except (AttributeError, TypeError):
                pass
