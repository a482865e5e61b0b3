"""Opcode handlers of calls: KW_NAMES, CALL, CALL_FUNCTION_EX, MAKE_FUNCTION,
RETURN_GENERATOR; and ``decode_call``, the one reading of CALL's operands (the tracer
uses it too, to write the call at a graph break)."""
from __future__ import annotations

from kiln.capture import values as V
from kiln.capture.opcodes import handles


def decode_call(operands, kw_names):
    """CALL's operands as the stack holds them (``[callable or NULL, self or callable,
    *args]``, the last ``len(kw_names)`` args named) -> ``(fn, args, kwargs)``."""
    a, b, *args = operands
    if a is V.NULL:
        fn = b
    else:
        fn, args = a, [b] + args
    names = kw_names or ()
    n = len(args) - len(names)
    return fn, args[:n], dict(zip(names, args[n:]))


@handles("KW_NAMES")
def KW_NAMES(tx, inst):
    tx.kw_names = tx.code.co_consts[inst.arg]


@handles("CALL")
def CALL(tx, inst):
    fn, args, kwargs = decode_call(tx.popn(inst.arg + 2), tx.kw_names)
    tx.kw_names = None
    tx.push(tx.call(fn, args, kwargs))


@handles("CALL_FUNCTION_EX")
def CALL_FUNCTION_EX(tx, inst):
    kwargs = {}
    if inst.arg & 1:
        from kiln.capture.containers import dict_items_of

        kwargs = dict(dict_items_of(tx, tx.pop()))
    args = tx.pop().unpack(tx)
    fn = tx.pop()
    if tx.stack and tx.stack[-1] is V.NULL:
        tx.pop()
    tx.push(tx.call(fn, args, kwargs))


@handles("MAKE_FUNCTION")
def MAKE_FUNCTION(tx, inst):
    code = tx.pop().value  # 3.11 and 3.12 push only the code object
    qualname = code.co_qualname
    flags = inst.arg
    closure = tx.pop().items if flags & 0x08 else None
    if flags & 0x04:
        tx.pop()  # annotations
    kwdefaults = tx.pop().items if flags & 0x02 else None
    defaults = tuple(tx.pop().items) if flags & 0x01 else None
    fv = V.NestedFunctionValue(code, tx.f_globals, defaults, kwdefaults,
                               tuple(closure) if closure else None, qualname)
    fv.has_annotations = bool(flags & 0x04)
    tx.push(fv)


@handles("RETURN_GENERATOR")
def RETURN_GENERATOR(tx, inst):
    tx.push(V.ConstantValue(None))
