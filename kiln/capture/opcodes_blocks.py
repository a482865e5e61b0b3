"""Opcode handlers of blocks and the exceptions that leave them: with-statements,
try/except, raise, assert; imports; structural pattern matching (match/case)."""
from __future__ import annotations

from kiln.capture import values as V
from kiln.capture.builder import wrap
from kiln.capture.errors import Unsupported, UserException
from kiln.capture.opcodes import handles


@handles("BEFORE_WITH")
def BEFORE_WITH(tx, inst):
    ctx = tx.pop()
    if isinstance(ctx, V.ContextValue):
        tx.push(V.ExitValue(ctx))
        tx.push(ctx.enter(tx))
        return
    # a user context manager: inline __enter__, remember __exit__
    from kiln.capture.objects import call_dunder

    if isinstance(ctx, V.ObjectValue):
        tx.push(V.ExitValue(ctx))
        tx.push(call_dunder(tx, ctx, "__enter__", [], {}))
        return
    raise Unsupported("K0032", f"with-statement over {ctx}")


@handles("WITH_EXCEPT_START")
def WITH_EXCEPT_START(tx, inst):
    exc = tx.stack[-1]
    exit_fn = tx.stack[-4]
    r = exit_fn.call(tx, [V.ClassValue(exc.python_type()), exc, V.ConstantValue(None)], {})
    tx.push(r)


@handles("PUSH_EXC_INFO")
def PUSH_EXC_INFO(tx, inst):
    exc = tx.pop()
    tx.push(tx.exc_stack[-1] if tx.exc_stack else V.ConstantValue(None))
    tx.exc_stack.append(exc)
    tx.push(exc)


@handles("POP_EXCEPT")
def POP_EXCEPT(tx, inst):
    tx.pop()
    if tx.exc_stack:
        tx.exc_stack.pop()


@handles("CHECK_EXC_MATCH")
def CHECK_EXC_MATCH(tx, inst):
    match = tx.pop()
    exc = tx.stack[-1]
    types_ = match.const()
    tx.push(V.ConstantValue(issubclass(exc.python_type(), types_)))


@handles("RERAISE")
def RERAISE(tx, inst):
    exc = tx.pop()
    if inst.arg:
        tx.pop()  # lasti
    raise UserException(exc)


@handles("RAISE_VARARGS")
def RAISE_VARARGS(tx, inst):
    if inst.arg == 0:
        if not tx.exc_stack:
            raise Unsupported("K0031", "bare raise outside except")
        raise UserException(tx.exc_stack[-1])
    if inst.arg == 2:
        tx.pop()  # cause
    exc = tx.pop()
    if isinstance(exc, V.ClassValue):
        exc = V.ExceptionValue(exc.cls, [])
    if not isinstance(exc, V.ExceptionValue):
        raise Unsupported("K0031", f"raise {exc}")
    raise UserException(exc)


@handles("LOAD_ASSERTION_ERROR")
def LOAD_ASSERTION_ERROR(tx, inst):
    tx.push(V.ClassValue(AssertionError))


@handles("IMPORT_NAME")
def IMPORT_NAME(tx, inst):
    """``import a.b`` pushes package ``a``; ``from a.b import c`` and ``import a.b as c``
    (then IMPORT_FROM) the module named: exactly what ``__import__`` returns."""
    fromlist = tx.pop().const()
    level = tx.pop().const()
    try:
        mod = __import__(inst.argval, tx.f_globals, None, fromlist, level)
    except ImportError as e:
        raise UserException(V.ExceptionValue(type(e), [V.ConstantValue(a) for a in e.args]))
    from kiln.capture.sources import RefSource

    tx.push(V.PythonModuleValue(mod, RefSource(tx.output.guards.const(mod, "mod"))))


@handles("IMPORT_FROM")
def IMPORT_FROM(tx, inst):
    mod = tx.stack[-1]
    name = inst.argval
    if not hasattr(mod.mod, name):  # a submodule not bound on its package: sys.modules has it
        import sys

        full = f"{mod.mod.__name__}.{name}"
        if full not in sys.modules:
            raise UserException(V.ExceptionValue(ImportError, [V.ConstantValue(
                f"cannot import name {name!r} from {mod.mod.__name__!r}")]))
        tx.push(wrap(tx, sys.modules[full], None))
        return
    tx.push(mod.getattr(tx, name))


@handles("GET_LEN")
def GET_LEN(tx, inst):
    tx.push(V.ConstantValue(len(tx.stack[-1].unpack(tx))))


# --- structural pattern matching (match/case) ------------------------------------------
@handles("MATCH_SEQUENCE")
def MATCH_SEQUENCE(tx, inst):
    v = tx.stack[-1]
    is_seq = isinstance(v, (V.ListValue, V.TupleValue)) or (
        isinstance(v, V.ConstantValue) and isinstance(v.value, (tuple, list, range)))
    tx.push(V.ConstantValue(is_seq))


@handles("MATCH_MAPPING")
def MATCH_MAPPING(tx, inst):
    tx.push(V.ConstantValue(isinstance(tx.stack[-1], V.DictValue)))


@handles("MATCH_KEYS")
def MATCH_KEYS(tx, inst):
    keys = tx.stack[-1].const()
    subject = tx.stack[-2]
    if not all(k in subject.items for k in keys):
        tx.push(V.ConstantValue(None))
    else:
        tx.push(V.TupleValue([subject.items[k] for k in keys]))
