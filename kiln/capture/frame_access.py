"""Calls that read the caller's own Python frame: ``inspect.currentframe()``,
``sys._getframe()``, ``locals()``, ``globals()``, ``eval``/``exec`` without namespaces,
``vars()``/``dir()`` without an argument, stack extraction.

kiln has no frame of the user's function to hand out: run as plain Python at a graph
break, such a call would see kiln's generated entry function (its locals, its globals,
its line). So the frame that makes the call runs eagerly, where it is the user's own
frame; in an inlined callee the call is Unsupported, which turns the callee into its own
compiled frame, which then runs eagerly. A frame that may read itself after a graph
break runs eagerly as a whole (``reads_own_frame``), since a resume function is not the
user's frame either. Frames above the compiled function remain kiln's (``f_back``).
"""
from __future__ import annotations

import dis
import inspect
import sys
import traceback

from kiln.capture import values as V
from kiln.capture.bytecode_info import per_code
from kiln.capture.errors import SkipFrame, Unsupported

FRAME_FUNCTIONS = {
    sys._getframe: "sys._getframe()", inspect.currentframe: "inspect.currentframe()",
    inspect.stack: "inspect.stack()", inspect.trace: "inspect.trace()",
    traceback.extract_stack: "traceback.extract_stack()", traceback.format_stack: "traceback.format_stack()",
    traceback.print_stack: "traceback.print_stack()", traceback.walk_stack: "traceback.walk_stack()",
    locals: "locals()", globals: "globals()", eval: "eval()", exec: "exec()", breakpoint: "breakpoint()",
}
if hasattr(sys, "_getframemodulename"):
    FRAME_FUNCTIONS[sys._getframemodulename] = "sys._getframemodulename()"

# names that, loaded in a frame, may reach the functions above
_GLOBAL_NAMES = {"locals", "globals", "vars", "dir", "eval", "exec", "breakpoint", "currentframe",
                 "_getframe", "extract_stack", "format_stack", "print_stack", "walk_stack"}
_ATTR_NAMES = {"currentframe", "_getframe", "_getframemodulename", "extract_stack", "format_stack",
               "print_stack", "walk_stack"}
_INSPECT_ATTRS = {"stack", "trace"}  # inspect.stack / inspect.trace (torch.stack is not)
_ONLY_WITHOUT_ARGS = {"vars", "dir"}  # vars(obj) / dir(obj) do not read the frame


def needs_own_frame(tx, what: str):
    """Raised by a call that reads its caller's frame (``tx``)."""
    why = f"{what} reads its caller's own Python frame, which kiln's compiled code does not have"
    if tx.parent is None:
        raise SkipFrame("K0030", why)
    raise Unsupported("K0030", why)


class FrameFunction(V.Value):
    """One of ``FRAME_FUNCTIONS`` read during a trace."""

    def __init__(self, fn):
        self.fn = fn

    def python_type(self):
        return type(self.fn)

    def call(self, tx, args, kwargs):
        needs_own_frame(tx, FRAME_FUNCTIONS[self.fn])


def frame_function(obj):
    try:
        return FrameFunction(obj) if obj in FRAME_FUNCTIONS else None
    except TypeError:  # unhashable
        return None


@per_code
def reads_own_frame(code) -> bool:
    """Whether ``code`` (or a function defined in it) may call one of the functions
    above: then a graph break in it would hand them a resume function's frame."""
    insts = [i for i in dis.get_instructions(code) if i.opname not in ("PRECALL", "CACHE")]
    prev = None
    for n, ins in enumerate(insts):
        name = ins.argval if isinstance(ins.argval, str) else None
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and name in _GLOBAL_NAMES:
            if name not in _ONLY_WITHOUT_ARGS or (
                    n + 1 < len(insts) and insts[n + 1].opname == "CALL" and insts[n + 1].arg == 0):
                return True
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "IMPORT_FROM") and (
                name in _ATTR_NAMES or (name in _INSPECT_ATTRS and prev == "inspect")):
            return True
        prev = name if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_DEREF") else None
    return any(reads_own_frame(c) for c in code.co_consts if inspect.iscode(c))
