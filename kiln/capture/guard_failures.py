"""Why a call missed a compiled entry: every guard that fails, in plain words.

``first_failure`` (guards.py) stops at the first failing guard; a recompile is easier
to fix when all of them are listed with what the entry was compiled for and what the
call brought ("L['x'].shape[0] was 4, now 8"), as JAX's explain-cache-misses does.
This runs on the slow path only (a miss), never on the guarded fast path.

The value an entry was compiled for is read back from the guard's own code: guards
compare an expression (``Guard.lhs``, or the left side of the code) with a constant
that lives in the entry's namespace or is a literal (``x.shape == (4, 3)``,
``x.dtype is __dt3``, ``__same0(x, __v4)``), so the right-hand side evaluated alone
is the old value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.capture import global_state

_MAX_REPR = 80


@dataclass
class GuardFailure:
    """One failed guard: its description, the old and new values where known."""

    description: str        # the guard, in the user's names
    subject: str            # what it reads, in the user's names ("L['x'].shape")
    was: object = None
    now: object = None
    known: bool = False     # was/now are both known
    error: str | None = None  # the guard could not be evaluated

    def plain(self) -> list[str]:
        """Plain-word lines: one per differing item of a shape/stride/state."""
        if self.error is not None:
            return [f"{self.description} could not be checked ({self.error})"]
        if not self.known:
            now = f" (now {_short(self.now)})" if self.now is not None else ""
            return [f"failed: {self.description}{now}"]
        for rule in _PLAIN_RULES:
            lines = rule(self)
            if lines:
                return lines
        return [f"{self.subject} was {_short(self.was)}, now {_short(self.now)}"]


def explain(guards, namespace: dict, args: dict) -> list[GuardFailure]:
    """Every guard of an entry that fails on these arguments. A guard that cannot be
    evaluated after an earlier one failed (``x.shape`` once ``x`` is no tensor) is a
    consequence of that one and is left out."""
    env = dict(namespace)
    env.update(args)
    consts = {"__builtins__": {}, **namespace}
    out: list[GuardFailure] = []
    for g in guards:
        try:
            ok = eval(g.code, env)
        except Exception as ex:  # noqa: BLE001  (the source no longer resolves)
            if not out:
                out.append(GuardFailure(g.description, _subject(g.description),
                                        error=f"{type(ex).__name__}: {ex}"))
            continue
        if ok:
            continue
        f = GuardFailure(g.description, _subject(g.description))
        now = _eval(g.lhs, env) if g.lhs is not None else _MISSING
        was = _expected(g.code, consts)
        if now is not _MISSING:
            f.now = now
        if now is not _MISSING and was is not _MISSING:
            f.was, f.known = was, True
        out.append(f)
    return out


def plain_lines(failures: list[GuardFailure]) -> list[str]:
    return [line for f in failures for line in f.plain()]


# --- reading the old value back from the guard's code ------------------------------
_MISSING = object()
_SAME_CALL = re.compile(r"^(?:.* and )?__same\d+\((?P<lhs>.+), (?P<rhs>__\w+)\)$")
_NAME_OR_LITERAL = re.compile(r"^(__\w+|True|False|None|\(.*\)|-?[\w.]+|'.*'|\".*\")$")


def _expected(code: str, consts: dict):
    m = _SAME_CALL.match(code)
    if m:
        rhs = m.group("rhs")
    else:
        rhs = None
        for op in (" == ", " is "):
            if op in code:
                rhs = code.rsplit(op, 1)[1]
                break
        if rhs is None or not _NAME_OR_LITERAL.match(rhs.strip()):
            return _MISSING
    # only the entry's constants: a right side that reads the call's arguments is no
    # stored value
    return _eval(rhs, consts)


def _eval(expr: str, env: dict):
    try:
        return eval(expr, env)
    except Exception:  # noqa: BLE001
        return _MISSING


def _subject(description: str) -> str:
    for op in (" == ", " is the same object", " is "):
        if op in description:
            return description.split(op, 1)[0]
    return description


# --- plain words per kind of value ---------------------------------------------------
def _items(f: GuardFailure) -> list[str]:
    """Shapes and strides item by item: ``L['x'].shape[0] was 4, now 8``."""
    was, now = f.was, f.now
    if not (isinstance(was, tuple) and isinstance(now, tuple)):
        return []
    if not all(isinstance(v, int) for v in was + now):
        return []
    if len(was) != len(now):
        return [f"{f.subject} had {len(was)} dims {was}, now {len(now)} dims {now}"]
    return [f"{f.subject}[{i}] was {a}, now {b}" for i, (a, b) in enumerate(zip(was, now)) if a != b]


def _state(f: GuardFailure) -> list[str]:
    """The global torch state, only the parts that changed."""
    if not f.description.startswith("global torch state"):
        return []
    try:
        old = global_state.describe(f.was).split(", ")
        new = global_state.describe(f.now).split(", ")
    except Exception:  # noqa: BLE001
        return []
    if len(old) != len(new):
        return [f"global torch state was ({', '.join(old)}), now ({', '.join(new)})"]
    return [f"global torch state: {a} before, now {b}" for a, b in zip(old, new) if a != b]


def _identity(f: GuardFailure) -> list[str]:
    if "is the same object as when compiled" not in f.description:
        return []
    return [f"{f.subject} is another object than when compiled "
            f"(was {_short(f.was)}, now {_short(f.now)})"]


def _types(f: GuardFailure) -> list[str]:
    if isinstance(f.was, type) and isinstance(f.now, type):
        return [f"{f.subject} was {f.was.__qualname__}, now {f.now.__qualname__}"]
    return []


_PLAIN_RULES = (_state, _identity, _items, _types)


def _short(v) -> str:
    r = repr(v)
    return r if len(r) <= _MAX_REPR else r[:_MAX_REPR - 3] + "..."
