"""``kiln.disable(fn, recursive=False)``: ``fn``'s own frame runs eagerly, the functions
it calls are compiled.

kiln has no frame-evaluation hook, so it cannot see the calls an eager frame makes. What
it can reach are the names the frame looks up in its module: when the wrapper is called
from inside a compiled function (found on the Python stack: a ``CompiledFunction``
call), ``fn``'s code runs over a view of its globals (``CompilingGlobals``) in which
every plain Python function of user code reads as that compiled function's callee
(``_compile_callee``: its backend, its ownership), compiled as its own frame. Globals
the frame assigns are written back to the module when it returns (reads inside the
frame see them at once). Callees reached otherwise — attributes of objects, closure
cells, arguments — run as they are, as does everything when the wrapper is called
outside compiled code (as PyTorch's does: nothing compiles there).
"""
from __future__ import annotations

import functools
import sys
import types

from kiln.capture import eval_frame, marks

#: Modules whose functions are library code: never compiled as callees.
_LIBRARIES = frozenset({"torch", "kiln", "numpy", "triton", "sympy", "networkx"}) \
    | frozenset(sys.stdlib_module_names)


def _compiled_caller(depth: int = 2):
    """The innermost CompiledFunction being called on this thread's stack, or None."""
    code = eval_frame.CompiledFunction.__call__.__code__
    f = sys._getframe(depth)
    while f is not None:
        if f.f_code is code:
            owner = f.f_locals.get("self")
            if isinstance(owner, eval_frame.CompiledFunction):
                return owner
        f = f.f_back
    return None


def _user_function(v) -> bool:
    return (isinstance(v, types.FunctionType)
            and (getattr(v, "__module__", None) or "").split(".")[0] not in _LIBRARIES
            and not v.__dict__.get("_kiln_disabled"))


class CompilingGlobals(dict):
    """A module's globals as a disabled frame sees them: user functions compiled by
    ``owner``. Holds only what the frame itself assigned (and ``__builtins__``)."""

    def __init__(self, real: dict, owner):
        super().__init__()
        self.real, self.owner = real, owner
        dict.__setitem__(self, "__builtins__", real.get("__builtins__", __builtins__))

    def __getitem__(self, name):
        if name != "__builtins__" and dict.__contains__(self, name):
            return dict.__getitem__(self, name)
        v = self.real[name]            # KeyError: Python goes on to the builtins
        return self.owner._compile_callee(v) if _user_function(v) else v

    def write_back(self):
        for k, v in dict.items(self):
            if k != "__builtins__":
                self.real[k] = v


def disable_frame(fn):
    """The ``kiln.disable(fn, recursive=False)`` wrapper."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        owner = _compiled_caller()
        if owner is None or marks.disabled_depth() \
                or not isinstance(fn, types.FunctionType):
            return fn(*args, **kwargs)
        g = CompilingGlobals(fn.__globals__, owner)
        frame_fn = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
        frame_fn.__kwdefaults__ = fn.__kwdefaults__
        try:
            return frame_fn(*args, **kwargs)
        finally:
            g.write_back()

    return marks.mark_disabled(wrapper)
