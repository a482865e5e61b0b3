"""Running one program under one mode, in this process, and classifying the outcome.

Eager and the compiled run each load the program into a fresh namespace and call it
twice (the second call with fresh inputs of the same shapes: guards and caches are
exercised), each call on inputs made from the same seed. Outcomes:

- ``ok``: no difference;
- ``wrong``: a silent difference (values, dtype, shape, layout, aliasing, mutated
  inputs, globals, grad mode, requires_grad, gradients, or an exception eager raised
  that the compiled run did not);
- ``crash``: the compiled run raised where eager did not, or another exception type;
- ``timeout`` (here: an alarm; a subprocess worker also reports ``segfault``);
- ``skipped``: a train mode for a program that eager cannot run in train mode.
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
import time
import traceback

import torch

from .compare import Mismatch, compare
from .modes import Compiler, Mode
from .observe import observe_call, snap_values
from .program import Program

CALLS = 2
STATUSES = ("ok", "wrong", "crash", "segfault", "timeout", "skipped")


@dataclasses.dataclass
class CaseResult:
    seed: int
    mode: str
    status: str
    mismatches: list = dataclasses.field(default_factory=list)
    error: str = ""  # a crash's exception and where it was raised
    seconds: float = 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["mismatches"] = [dataclasses.asdict(m) for m in self.mismatches]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "CaseResult":
        d = dict(d)
        d["mismatches"] = [Mismatch(**m) for m in d["mismatches"]]
        return cls(**d)


class CaseTimeout(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` (the
    program's own, or kiln's) swallows it."""


@contextlib.contextmanager
def alarm(seconds: float | None):
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise CaseTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def observations(program: Program, fn_of_ns, train: bool, graph_break=None):
    """Observations of CALLS calls; ``fn_of_ns`` makes the function to call from the
    freshly loaded namespace."""
    ns = program.load(graph_break) if graph_break else program.load()
    fn = fn_of_ns(ns)
    obs, outs = [], []
    for call in range(CALLS):
        o, out = observe_call(program, ns, fn, call, train)
        if call:
            obs[-1].out_after_next = snap_values(outs[-1])
        obs.append(o)
        outs.append(out)
    return obs


def eager_observations(program: Program, train: bool):
    return observations(program, lambda ns: ns["prog"], train)


def classify(mismatches: list[Mismatch], compiled_obs) -> tuple[str, str]:
    """(status, error text) of a compared case."""
    for m, o in ((m, compiled_obs[m.call]) for m in mismatches):
        if m.where == "exception" and o.exc is not None:
            return "crash", f"{o.exc}: {o.exc_msg}\n{o.exc_where}"
        if m.where == "backward" and o.backward_exc is not None:
            return "crash", f"backward: {o.backward_exc}"
    return ("wrong", "") if mismatches else ("ok", "")


def run_case(program: Program, mode: Mode, timeout: float | None = 300.0) -> CaseResult:
    """Run ``program`` eagerly and under ``mode``; compare; classify."""
    t0 = time.perf_counter()
    result = CaseResult(program.seed, mode.name, "ok")
    if mode.train and program.train_inputs is None:
        result.status = "skipped"
        return result
    compiler = Compiler(mode)
    compiler.reset()
    try:
        with alarm(timeout):
            eager = eager_observations(program, mode.train)
            compiled = observations(program, lambda ns: compiler.compile(ns["prog"]), mode.train,
                                    compiler.graph_break)
        for call in range(CALLS):
            result.mismatches += compare(call, eager[call], compiled[call], program.uses_half)
        result.status, result.error = classify(result.mismatches, compiled)
    except CaseTimeout:
        result.status, result.error = "timeout", f"over {timeout:.0f} s"
    except Exception as e:  # raised outside the program's calls: compiling, resetting
        result.status = "crash"
        result.error = f"{type(e).__qualname__}: {str(e)[:500]}\n{''.join(traceback.format_tb(e.__traceback__)[-3:])}"
    finally:
        torch.set_grad_enabled(True)
        try:
            compiler.reset()
        except Exception:
            pass
    result.seconds = time.perf_counter() - t0
    return result
