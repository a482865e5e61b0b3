"""Exceptions that steer capture.

``Unsupported`` (public, re-exported as ``kiln.Unsupported``) means "this cannot go in a
graph": the interpreter turns it into a graph break, or raises it to the user under
``fullgraph=True``. ``UserException`` carries an exception that the *user's* code raised
while being traced, so the interpreter can route it to the user's own ``except``.
"""
from __future__ import annotations

from kiln.debug.breaks import describe, split_id, tag


class Unsupported(RuntimeError):
    """Raised when code cannot be captured into a graph (and the user asked for one).

    ``Unsupported("K0042", "why", user_stack=None)``: the first argument is the reason's
    ID in ``kiln/debug/breaks.py`` (``break_id``); the message says what was met."""

    def __init__(self, *args, user_stack=None, break_id=None):
        found, (msg, *rest) = split_id(args)
        super().__init__(msg)
        self.reason = msg
        self.break_id = found or break_id
        self.user_stack = (rest[0] if rest else user_stack) or []

    def __str__(self):
        return with_user_lines(describe(self.break_id, self.reason), self.user_stack)


class SkipFrame(Exception):
    """The whole frame must run eagerly (nothing can be compiled for it):
    ``SkipFrame("K0049", "why")``, as ``Unsupported``."""

    def __init__(self, *args, break_id=None):
        found, (msg,) = split_id(args)
        super().__init__(msg)
        self.reason = msg
        self.break_id = found or break_id

    def __str__(self):
        return tag(self.break_id, self.reason)


class UserException(Exception):
    """The traced program raised ``value`` (a Value of an exception)."""

    def __init__(self, value, from_fake=False):
        super().__init__(repr(value))
        self.value = value
        # raised by an op run on fake tensors: a handler in the program cannot trust it
        self.from_fake = from_fake


class RestartWithBreak(Exception):
    """Trace the root frame again, breaking the graph at ``ip`` (an instruction index)."""

    def __init__(self, ip: int, reason: str, user_stack, break_id=None):
        self.ip = ip
        self.reason = reason
        self.user_stack = user_stack
        self.break_id = break_id


class ReturnSignal(Exception):
    """A frame being interpreted returned ``value``."""

    def __init__(self, value):
        self.value = value


class YieldSignal(Exception):
    """A generator frame being interpreted yielded ``value``; ``delegate`` is the
    sub-iterator when the yield is a ``yield from``'s."""

    def __init__(self, value, delegate=None):
        self.value = value
        self.delegate = delegate


class InternalError(Exception):
    """A failure of kiln's own machinery while tracing (not an error of the user's
    program): it follows ``suppress_errors`` (eager fallback, logged) and is never
    replayed as the program's exception. Its message ends with the user's lines being
    traced when it happened (``_kiln_stack``, set where it passed through a frame)."""

    def __str__(self):
        return with_user_lines(super().__str__(), getattr(self, "_kiln_stack", None))


class BackendCompilerFailed(RuntimeError):
    """The backend failed on a graph kiln captured: while compiling it (``phase``
    "compiling"), or at its first run where the captured graph run eagerly does not
    fail ("running"). The backend's exception is ``__cause__``."""

    def __init__(self, backend: str, phase: str, cause: BaseException, where=None):
        super().__init__(f"kiln: backend {backend!r} raised {type(cause).__name__} while {phase} "
                         f"the graph captured up to the line below: {cause}")
        self.backend = backend
        self.phase = phase
        self._kiln_stack = list(where or [])

    def __str__(self):
        return with_user_lines(super().__str__(), self._kiln_stack)


def with_user_lines(message: str, user_stack) -> str:
    """``message``, then the user's code it concerns: one "file:line in fn: source"
    per frame, outermost first."""
    if not user_stack:
        return message
    return message + "\n" + "\n".join(f"  {fr}" for fr in user_stack)
