"""``generate(seed)``: a random program, deterministic per seed, that eager runs.

A program is written by running it (``gen_core``), then checked as a whole: both
calls run eagerly without raising, two eager runs agree with each other (so nothing
nondeterministic reaches the comparison), and train mode is tried with leaf inputs,
then with cloned ones (for programs that mutate their inputs). A program that fails
is written again from the next sub-seed.
"""
from __future__ import annotations

import dataclasses
import random
import types

import torch

from .compare import compare
from .gen_blocks import TOP_RULES, _indent, deliberate_raise
from .gen_core import Gen
from .gen_inputs import plan_inputs
from .program import PREAMBLE, Program
from .runner import CALLS, eager_observations

MAX_BODY_LINES = 28
#: Share of programs that raise a ValueError of their own on some inputs.
RAISE_PROBABILITY = 0.06
#: The only exception eager may raise in a valid program (a deliberate one).
DELIBERATE = "ValueError"
ATTEMPTS = 12


class GenerationFailed(Exception):
    pass


def _returnable(v) -> bool:
    return not isinstance(v, (types.FunctionType, types.LambdaType, type, types.ModuleType, types.MethodType))


def make_return(g: Gen) -> str:
    rng = g.rng
    names = [n for n in g.st.locals if n in g.st.ns and _returnable(g.st.ns[n])]
    tensors = [n for n in names if isinstance(g.st.ns[n], torch.Tensor)]
    if not names or rng.random() < 0.04:
        return "return None"
    k = rng.choice([1, 1, 2, 2, 2, 3, 4])
    chosen: list[str] = []
    pool = tensors if tensors and rng.random() < 0.7 else names
    for _ in range(k):
        n = g.pick([x for x in pool if x not in chosen])
        if n is None:
            break
        chosen.append(n)
    if not chosen:
        return "return None"
    if len(chosen) == 1:
        return f"return {chosen[0]}"
    form = rng.random()
    if form < 0.5:
        return f"return {', '.join(chosen)}"
    if form < 0.65:
        return f"return [{', '.join(chosen)}]"
    if form < 0.8:
        return "return {" + ", ".join(f'"{n}": {n}' for n in chosen) + "}"
    return f"return {chosen[0]}, [{', '.join(chosen[1:])}]"


def assemble(g: Gen, ret: str) -> str:
    parts = [PREAMBLE]
    for h in g.header:
        parts.append("\n" + h.rstrip() + "\n")
    parts.append("\n" + g.plan.text)
    lines = [f"def prog({', '.join(g.plan.params)}):"]
    if g.global_writes:
        lines.append(f"    global {', '.join(sorted(g.global_writes))}")
    lines += [_indent(b.text) for b in g.body]
    lines.append(f"    {ret}")
    parts.append("\n" + "\n".join(lines) + "\n")
    return "".join(parts)


def _build(seed: int, rng: random.Random) -> Program:
    g = Gen(rng, plan_inputs(rng))
    steps = rng.randint(3, 12)
    for _ in range(3 * steps):
        if len(g.body) >= steps or sum(b.text.count("\n") + 1 for b in g.body) >= MAX_BODY_LINES:
            break
        g.step(TOP_RULES)
    if rng.random() < RAISE_PROBABILITY:
        b = deliberate_raise(g)  # not run now: it may raise on call 1's inputs
        if b is not None:
            g.body.append(b)
            g.features |= b.features
    return Program(seed, assemble(g, make_return(g)), "leaf", tuple(sorted(g.features)))


def _deterministic_and_clean(program: Program, train: bool) -> bool:
    first = eager_observations(program, train)
    allowed = (None, DELIBERATE) if "raise" in program.features else (None,)
    if any(o.exc not in allowed or o.backward_exc for o in first):
        return False
    second = eager_observations(program, train)
    return not any(compare(c, first[c], second[c]) for c in range(CALLS))


def validate(program: Program) -> Program | None:
    """``program`` with its train-input style settled, or None if eager cannot run it
    reproducibly."""
    try:
        if not _deterministic_and_clean(program, train=False):
            return None
        for style in ("leaf", "clone"):
            p = dataclasses.replace(program, train_inputs=style)
            if _deterministic_and_clean(p, train=True):
                return p
        return dataclasses.replace(program, train_inputs=None)
    except Exception:
        return None
    finally:
        torch.set_grad_enabled(True)


def generate(seed: int) -> Program:
    fallback = None
    for attempt in range(ATTEMPTS):
        rng = random.Random(f"kiln-fuzz:{seed}:{attempt}")
        try:
            program = _build(seed, rng)
        except Exception:
            continue
        finally:
            torch.set_grad_enabled(True)
        valid = validate(program)
        if valid is not None and (valid.train_inputs is not None or attempt >= 2):
            return valid
        fallback = fallback or valid
    if fallback is not None:
        return fallback
    raise GenerationFailed(f"no valid program for seed {seed} in {ATTEMPTS} attempts")
