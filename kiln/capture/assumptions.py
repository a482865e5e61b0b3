"""Validation checks assumed true while tracing, and checked after the graph.

Library code validates its arguments with a data-dependent test that raises when it
fails: ``torch.distributions`` asks ``if not torch._is_all_true(valid): raise
ValueError(...)``. Branching on the data would break the graph at every construction.
Instead the trace assumes the check passes (``AssumedTrue``: its truth is True, and
the check's tensor becomes a graph output), and the entry code tests it right after
the graph call, before any of the program's side effects are applied. When it fails,
the frame runs eagerly from its start, so what the user sees — the exception, its
message, or the ``except`` that catches it — is eager's own.

That re-run is only sound if nothing observable happened before it: the graph must not
write into tensors in place (such a graph's entry runs the frame eagerly, logged), and
the random-number state the graph consumed is put back before the re-run.
"""
from __future__ import annotations

import torch

from kiln.capture import values as V
from kiln.capture.errors import Unsupported
from kiln.capture.rule_tables import CONST_FOLD
from kiln.debug.logs import log_for


class AssumedTrue(V.Value):
    """``torch._is_all_true(t)``: a bool the trace takes to be True."""

    def __init__(self, tensor):
        self.tensor = tensor

    def python_type(self):
        return bool

    def truth(self, tx):
        out = tx.output
        if getattr(out, "in_transform", False):
            raise Unsupported("K0035", "a validation check inside a torch.func or torch.cond body")
        checks = out.__dict__.setdefault("assumed_true", [])
        checks.append(self.tensor)
        return True

    def __repr__(self):
        return f"AssumedTrue({self.tensor})"


def is_all_true(tx, args, kwargs):
    if len(args) != 1 or kwargs or not isinstance(args[0], V.TensorValue):
        raise Unsupported("K0042", "torch._is_all_true with these arguments")
    t = args[0]
    if t.fake.dtype != torch.bool:
        raise Unsupported("K0042", "torch._is_all_true of a non-bool tensor")
    return AssumedTrue(tx.output.op("call_function", torch.all, [t], {}))


CONST_FOLD[torch._is_all_true] = is_all_true


def checks_of(out) -> list:
    return out.__dict__.get("assumed_true", [])


def _writes_in_place(gm) -> bool:
    """Whether the graph writes in place into one of its inputs (or a view of one);
    writes into tensors the graph made itself are invisible to a re-run."""
    import operator

    from kiln.capture.cond import _may_alias_input

    for n in gm.graph.nodes:
        if n.op not in ("call_function", "call_method") or not n.args or not hasattr(n.args[0], "op"):
            continue
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if ((name.endswith("_") and not name.endswith("__")) or n.target is operator.setitem
                or name.startswith("__i")) and _may_alias_input(n.args[0]):
            return True
        out = n.kwargs.get("out")
        if out is not None and any(_may_alias_input(o) for o in (out if isinstance(out, (tuple, list)) else (out,))
                                   if hasattr(o, "op")):
            return True
    return False


_RANDOM_WORDS = ("rand", "normal", "bernoulli", "multinomial", "dropout", "uniform", "exponential",
                 "poisson", "gamma", "dirichlet", "binomial", "cauchy", "geometric", "rrelu")


def _random(gm) -> bool:
    """Whether the graph may draw random numbers (by op name; conservative)."""
    for n in gm.graph.nodes:
        if n.op in ("call_function", "call_method"):
            name = (n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")).lower()
            if any(w in name for w in _RANDOM_WORDS):
                return True
    return False


def entry_lines(out, cg, gm, fn, code, call_lines):
    """The graph call, then the checks (None: the graph cannot be re-run safely, and the
    caller's entry runs the frame eagerly instead)."""
    from kiln.capture.codegen import call_source

    checks = checks_of(out)
    if not checks:
        return call_lines
    if gm is None or _writes_in_place(gm):
        log_for("fallbacks").info("kiln: %s runs eagerly: its graph writes in place and assumes a validation check",
                  code.co_name)
        return None
    eager = f"{cg.ref(fn, 'eager')}({call_source(code)})"
    test = " and ".join(f"{cg.expr(c)}.item()" for c in checks)
    if _random(gm):
        rng = cg.ref(_rng_state, "rng")
        restore = cg.ref(_restore_rng, "rng_restore")
        return ([f"__rng = {rng}()"] + call_lines +
                [f"if not ({test}):", f"    {restore}(__rng)", f"    return {eager}"])
    return call_lines + [f"if not ({test}):", f"    return {eager}"]


def _rng_state():
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def _restore_rng(state):
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)
