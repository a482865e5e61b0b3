"""The generator's live state: the program so far, executed on real tensors.

The generator writes a program one statement block at a time and runs each block at
once on live values (the arguments of call 1), so every choice it makes next — which
tensor to use, which dims exist, which dtypes combine — is made against real shapes
and dtypes, and a block that raises is simply dropped. All names of the program
(module globals, ``prog``'s locals and arguments) live in one flat namespace while
generating: locals, globals and helpers never share a name, so a ``global G_n``
statement behaves the same flattened as inside ``prog``. Dropping a block rebuilds the
namespace by replaying the accepted blocks from the start.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .program import INPUT_SEEDS, PREAMBLE

#: Largest tensor a statement may make (keeps compiled kernels and eager runs quick).
MAX_NUMEL = 512
MAX_NDIM = 6
#: Largest result any single op may make while generating: checked on meta copies
#: before the op runs, so a block that would allocate gigabytes (a repeat of a repeat in
#: a loop) is dropped before it does.
MAX_OP_NUMEL = 1 << 16


#: Most CPU time a statement may take while generating (a loop over a list it
#: extends). CPU time, not wall time: the programs must not depend on the machine's load.
STATEMENT_SECONDS = 2.0

#: How many times a statement ran over its limit in this process. The first use of an
#: op can be slow once (lazy initialization), so a step that saw an overrun is tried
#: again (``Gen.step``): only a statement slow every time is dropped, and the program of
#: a seed does not depend on what this process ran before.
_overruns = 0


def overruns() -> int:
    return _overruns


class TooLarge(RuntimeError):
    pass


class TooSlow(RuntimeError):
    pass


@contextlib.contextmanager
def _time_limit(on: bool = True):
    """Raise TooSlow in the statement after STATEMENT_SECONDS of the process's CPU time
    (main thread only), and
    again every 0.1 s until it leaves: the statement's own ``except RuntimeError`` (or
    a meta kernel's refusal, caught below) may swallow one."""
    if not on or not hasattr(signal, "setitimer") or \
            threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        global _overruns
        _overruns += 1
        raise TooSlow(f"a statement ran over {STATEMENT_SECONDS} s of CPU time")
    old = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, STATEMENT_SECONDS, 0.1)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)


class _SizeCap(TorchDispatchMode):
    """Refuses ops whose results would exceed MAX_OP_NUMEL elements."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            meta = tree_map(lambda a: a.to("meta") if isinstance(a, torch.Tensor) else a,
                            (args, kwargs))
            out = func(*meta[0], **meta[1])
        except TooSlow:
            raise
        except Exception:       # noqa: BLE001  (no meta kernel, or it raises: run it)
            out = None
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.numel() > MAX_OP_NUMEL:
                raise TooLarge(f"{func} would make {t.numel()} elements")
        return func(*args, **kwargs)


@dataclasses.dataclass
class Block:
    """A statement (possibly compound, possibly several lines) of ``prog``'s body, at
    indentation 0; ``defines`` are the locals it leaves bound for later statements."""

    text: str
    defines: tuple[str, ...] = ()
    global_writes: frozenset = frozenset()
    header: tuple[str, ...] = ()
    features: frozenset = frozenset()


def block(text, defines=(), global_writes=(), header=(), features=()) -> Block:
    return Block(text, tuple(defines), frozenset(global_writes), tuple(header), frozenset(features))


def atom(text: str) -> str:
    """``text`` parenthesized if it is not already one operand (a name, call, index or
    attribute chain): ``v1 + 2`` becomes ``(v1 + 2)``, ``-v1`` becomes ``(-v1)``."""
    if text[:1] in "-~" or text.startswith("not "):
        return f"({text})"
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            return f"({text})"
    return text


def _noop():
    pass


class State:
    """One flat namespace holding the module and ``prog``'s locals, and the names of
    the locals in the order they were bound."""

    def __init__(self, ns: dict, local_names: list[str]):
        self.ns = ns
        self.locals = local_names

    def run(self, text: str, limit: bool = True):
        """Run a statement; ``limit=False`` for one replayed (it finished before, and a
        limit could end it on a busy machine: the program would depend on the load)."""
        with warnings.catch_warnings(), _SizeCap(), _time_limit(limit):
            warnings.simplefilter("ignore")
            try:
                exec(compile(text, "<fuzzgen>", "exec"), self.ns)
            finally:
                torch.set_grad_enabled(True)

    def eval(self, text: str):
        with warnings.catch_warnings(), _SizeCap(), _time_limit():
            warnings.simplefilter("ignore")
            try:
                return eval(compile(text, "<fuzzgen>", "eval"), self.ns)
            finally:
                torch.set_grad_enabled(True)

    def value(self, name: str):
        return self.ns[name]

    def sane(self) -> bool:
        """No local is a tensor too large or too high-dimensional."""
        for name in self.locals:
            v = self.ns.get(name)
            if isinstance(v, torch.Tensor) and (v.numel() > MAX_NUMEL or v.dim() > MAX_NDIM):
                return False
            if isinstance(v, (list, tuple)) and len(v) > 64:
                return False
        return True


def value_signature(v):
    """What later statements rely on about a value: its type, and a tensor's shape and
    dtype."""
    if isinstance(v, torch.Tensor):
        return (type(v), tuple(v.shape), v.dtype)
    if isinstance(v, (list, tuple, dict)):
        return (type(v), len(v))
    return type(v)


def signature(st: State) -> dict:
    return {n: value_signature(st.ns[n]) for n in st.locals if n in st.ns}


def initial_state(inputs_text: str, params: list[str], header: list[str]) -> State:
    ns = {"__name__": "fuzzgen", "graph_break": _noop}
    st = State(ns, list(params))
    st.run(PREAMBLE, limit=False)
    for h in header:
        st.run(h, limit=False)
    st.run(inputs_text, limit=False)
    g = torch.Generator().manual_seed(INPUT_SEEDS[0])
    args, _, _ = ns["make_inputs"](g)
    for name, value in zip(params, args):
        ns[name] = value
    return st
