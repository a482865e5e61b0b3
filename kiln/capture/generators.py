"""Generators during a trace: a suspended child Frame, run step by step as its consumer
pulls, as CPython runs one.

Calling a generator function runs none of its body: it makes a ``GeneratorValue`` that
holds the bound frame. Each ``next``, ``send``, ``throw`` or ``close`` resumes that
frame until its next ``yield`` (``YieldSignal``), its return (``ReturnSignal``), or an
exception, so the code after the last value the consumer asked for never runs, values
sent in arrive where the ``yield`` was, and ``yield from`` delegates one item at a time.

A generator that has not started is rebuilt at a graph break by calling its function
again (which runs nothing either); a finished one as a finished generator; one
suspended at a ``yield`` cannot be rebuilt (kiln cannot make a running Python frame),
so it is Unsupported and the frame runs eagerly.

The generator opcodes are here too (``HANDLERS``, merged into the interpreter's table).
"""
from __future__ import annotations

import types

from kiln.capture import values as V
from kiln.capture.bytecode_info import PY312
from kiln.capture.errors import ReturnSignal, Unsupported, UserException, YieldSignal
from kiln.capture.iterators import LazyIterator, get_iter, is_iterator, is_none, next_of


def _exc(cls, msg):
    return V.ExceptionValue(cls, [V.ConstantValue(msg)])


_NONE = V.ConstantValue(None)


class GeneratorValue(LazyIterator):
    def __init__(self, frame, fn_value, args, kwargs):
        super().__init__()
        self.frame = frame
        self.fn_value = fn_value
        self.args = list(args)
        self.kwargs = dict(kwargs)
        self.state = "created"  # created | suspended | running | done
        self.return_value = None  # set when the body returns; next() hands it on once
        self.delegate = None  # the iterator a `yield from` is suspended in

    def python_type(self):
        return types.GeneratorType

    # --- running the frame ---------------------------------------------------------------
    def resume(self, tx, sent=_NONE, exc=None):
        """Run to the next yield: ("yield", value) or ("return", value); an exception
        the body raises (or does not catch) propagates to the consumer."""
        if self.state == "running":
            raise UserException(_exc(ValueError, "generator already executing"))
        if self.state == "done":
            if exc is not None:
                raise UserException(exc)
            return "return", None
        f = self.frame
        if self.state == "created":
            if exc is not None:  # thrown in before the first instruction: nothing catches it
                self.state = "done"
                raise UserException(exc)
            if not is_none(sent):
                raise UserException(_exc(TypeError, "can't send non-None value to a just-started generator"))
        else:  # the value of the suspended `yield` (None under a throw, as in CPython)
            f.push(sent if exc is None else _NONE)
        f.parent = tx  # the consumer is the frame's caller now (user stacks, depth)
        self.state = "running"
        self.delegate = None
        try:
            if exc is not None:
                f.raise_user(UserException(exc))
            while True:
                f.step()
        except YieldSignal as y:
            self.state = "suspended"
            self.delegate = y.delegate
            return "yield", y.value
        except ReturnSignal as r:
            self.state = "done"
            self.return_value = r.value
            return "return", r.value
        except UserException as e:
            self.state = "done"
            if issubclass(e.value.python_type(), StopIteration):  # PEP 479
                raise UserException(_exc(RuntimeError, "generator raised StopIteration")) from None
            raise
        except Unsupported as e:
            if getattr(e, "_kiln_stack", None) is None:
                e._kiln_stack = f.user_stack()
            raise

    def next(self, tx):
        kind, v = self.resume(tx)
        return v if kind == "yield" else None

    def take_return_value(self):
        v, self.return_value = self.return_value, None
        return v

    def send(self, tx, value):
        kind, v = self.resume(tx, value)
        if kind == "yield":
            return v
        from kiln.capture.iterators import stop_iteration

        raise UserException(stop_iteration(self))

    def throw(self, tx, exc):
        if self.delegate is not None:
            raise Unsupported("K0005", "throw() into a generator suspended in `yield from`")
        kind, v = self.resume(tx, exc=exc)
        if kind == "yield":
            return v
        from kiln.capture.iterators import stop_iteration

        raise UserException(stop_iteration(self))

    def close(self, tx):
        if self.state in ("created", "done"):
            self.state = "done"
            return _NONE
        if isinstance(self.delegate, GeneratorValue):
            self.delegate.close(tx)
        elif self.delegate is not None and not isinstance(self.delegate, V.IteratorValue):
            raise Unsupported("K0005", "close() of a generator delegating to a user iterator")
        try:
            kind, _ = self.resume(tx, exc=V.ExceptionValue(GeneratorExit, []))
        except UserException as e:
            if issubclass(e.value.python_type(), (GeneratorExit, StopIteration)):
                return _NONE
            raise
        if kind == "yield":
            raise UserException(_exc(RuntimeError, "generator ignored GeneratorExit"))
        return _NONE

    # --- the Python object ----------------------------------------------------------------
    def getattr(self, tx, name):
        if name == "gi_running":
            return V.ConstantValue(self.state == "running")
        if name.startswith("gi_"):
            raise Unsupported("K0005", f"generator attribute {name!r}")
        return V._container_getattr(self, tx, name)

    def call_method(self, tx, name, args, kwargs):
        if name == "send":
            return self.send(tx, args[0])
        if name == "throw":
            if len(args) != 1 or kwargs:
                raise Unsupported("K0005", "generator.throw() with a traceback (deprecated form)")
            exc = args[0]
            if isinstance(exc, V.ClassValue):
                exc = V.ExceptionValue(exc.cls, [])
            if not isinstance(exc, V.ExceptionValue):
                raise Unsupported("K0005", f"throw({exc})")
            return self.throw(tx, exc)
        if name == "close":
            return self.close(tx)
        from kiln.capture.iterators import iterator_method

        return iterator_method(tx, self, name, args, kwargs)

    # --- after the graph ------------------------------------------------------------------
    def referenced(self):
        if self.state != "created":
            return []
        return [self.fn_value] + self.args + list(self.kwargs.values())

    def rebuild(self, cg):
        if self.state == "done":
            return f"{cg.ref(finished_generator, 'f')}()"
        if self.state != "created":
            raise Unsupported("K0005", "a generator suspended at a yield is live at a graph break "
                              "(kiln cannot rebuild a running Python frame)")
        args = [cg.expr(a) for a in self.args] + [f"{k}={cg.expr(a)}" for k, a in self.kwargs.items()]
        return f"{cg.expr(self.fn_value)}({', '.join(args)})"

    def __repr__(self):
        return f"Generator({self.frame.code.co_qualname}, {self.state})"


def finished_generator():
    """A generator object that has run to its end."""
    def gen():
        yield
    g = gen()
    g.close()
    return g


# --- opcodes ------------------------------------------------------------------------------
def YIELD_VALUE(tx, inst):
    if not tx.is_generator:
        raise Unsupported("K0005", "yield outside an inlined generator")
    value = tx.pop()
    prev = tx.insts[inst.index - 1] if inst.index else None
    delegate = tx.stack[-1] if prev is not None and prev.opname == "SEND" else None
    raise YieldSignal(value, delegate)


def GET_YIELD_FROM_ITER(tx, inst):
    v = tx.pop()
    tx.push(get_iter(tx, v))


def SEND(tx, inst):
    """``yield from``: send the value into the sub-iterator; its next item goes on to
    our own YIELD_VALUE, its return value ends the loop."""
    sent = tx.pop()
    recv = tx.stack[-1]
    if isinstance(recv, GeneratorValue):
        kind, v = recv.resume(tx, sent)
        if kind == "return":
            v = v if v is not None else _NONE
    elif is_iterator(recv):
        if not is_none(sent):
            raise Unsupported("K0005", "send() into a non-generator iterator")
        v = next_of(tx, recv)
        kind = "yield" if v is not None else "return"
        v = v if v is not None else _NONE
    else:
        raise Unsupported("K0005", f"yield from {recv}")
    if kind == "yield":
        tx.push(v)
        return
    if not PY312:
        tx.pop()  # 3.11 drops the sub-iterator here; 3.12's END_SEND does it
    tx.push(v)
    tx.ip = inst.target


def END_SEND(tx, inst):
    v = tx.pop()
    tx.pop()
    tx.push(v)


def CLEANUP_THROW(tx, inst):
    """3.12: an exception thrown into a ``yield from``: StopIteration ends the loop
    with its value, anything else propagates."""
    exc = tx.pop()
    if issubclass(exc.python_type(), StopIteration):
        del tx.stack[-2:]  # the sub-iterator and the last value sent
        args = getattr(exc, "args", [])
        tx.push(_NONE)  # END_SEND, next, drops it
        tx.push(args[0] if args else _NONE)
        return
    raise UserException(exc)


def stopiteration_error(tx):
    """3.12's INTRINSIC_STOPITERATION_ERROR (PEP 479): a StopIteration escaping a
    generator body becomes a RuntimeError."""
    exc = tx.pop()
    if issubclass(exc.python_type(), StopIteration):
        exc = _exc(RuntimeError, "generator raised StopIteration")
    tx.push(exc)


HANDLERS = {"YIELD_VALUE": YIELD_VALUE, "GET_YIELD_FROM_ITER": GET_YIELD_FROM_ITER,
            "SEND": SEND, "END_SEND": END_SEND, "CLEANUP_THROW": CLEANUP_THROW}
