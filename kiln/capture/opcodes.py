"""The interpreter's opcode table: opcode name -> handler ``(frame, instruction)``. The
handlers register themselves by family (interpreter.py, opcodes_calls.py,
opcodes_blocks.py, generators.py); ``Frame.step`` looks them up here."""
from __future__ import annotations

HANDLERS: dict = {}


def handles(*names):
    """Register the decorated function as the handler of opcodes ``names``."""
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco
