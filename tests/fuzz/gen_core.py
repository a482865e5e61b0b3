"""The generator's driver object: names, pickers, and adding blocks by running them.

Rule functions (``gen_exprs``, ``gen_stmts``, ``gen_blocks``) take a ``Gen`` and return
a ``Block`` or None; ``Gen.add`` runs a block on the live state and keeps it only if
it ran. Compound statements generate their bodies with ``Gen.body`` on a private copy
of the state (so a branch not taken today is still known to run).
"""
from __future__ import annotations

import dataclasses
import os
import random

import torch

from .gen_inputs import InputPlan
from .gen_state import Block, State, initial_state, overruns, signature


@dataclasses.dataclass
class Body:
    """A compound statement's body: its statements, the module code they need, and the
    signature (type, shape, dtype) of every local after running them once."""

    blocks: list[Block]
    headers: list[str]
    sig: dict


class Gen:
    def __init__(self, rng: random.Random, plan: InputPlan):
        self.rng = rng
        self.plan = plan
        self.header: list[str] = []
        self.body: list[Block] = []
        self.global_writes: set[str] = set()
        self.features: set[str] = set()
        self.depth = 0
        self._next_id = 0
        # A body under construction: headers and statements not yet part of self.body.
        self._pending: list[tuple[str, list[str], list[Block]]] = []
        self.st = self.replay()

    # ------------------------------------------------------------------ names
    def fresh(self, prefix: str = "v") -> str:
        self._next_id += 1
        return f"{prefix}{self._next_id - 1}"

    # ------------------------------------------------------------------ state
    def replay(self) -> State:
        st = initial_state(self.plan.text, self.plan.params, self.header)
        for b in self.body:
            st.run(b.text, limit=False)
            _bind(st, b.defines)
        for setup, setup_defines, headers, blocks in self._pending:
            for h in headers:
                st.run(h, limit=False)
            if setup:
                st.run(setup, limit=False)
                _bind(st, setup_defines)
            for b in blocks:
                st.run(b.text, limit=False)
                _bind(st, b.defines)
        return st

    def _try(self, b: Block) -> bool:
        try:
            for h in b.header:
                self.st.run(h)
            self.st.run(b.text)
            _bind(self.st, b.defines)
            return self.st.sane()
        except Exception:
            return False

    def add(self, b: Block | None) -> bool:
        """Run ``b`` on the live state; keep it if it ran (else restore the state)."""
        if b is None:
            return False
        if self._try(b):
            if self._pending:
                _, _, headers, blocks = self._pending[-1]
                headers.extend(b.header)
                blocks.append(b)
            else:
                self.header.extend(b.header)
                self.body.append(b)
                self.global_writes |= b.global_writes
            self.features |= b.features
            return True
        self.st = self.replay()
        return False

    def step(self, rules) -> bool:
        """Add one statement drawn from ``rules``. A rule that raises (it met a value
        it did not expect) just adds nothing; FUZZ_DEBUG=1 lets the error through.

        A step during which a statement ran over its time limit is undone and made
        again from the same random state: a first use of an op can be slow once, and
        the program must not depend on that (only a statement slow twice is dropped)."""
        mark, before = self._mark(), overruns()
        added = self._step(rules)
        if overruns() == before:
            return added
        self._restore(mark)
        return self._step(rules)

    def _mark(self):
        pending = self._pending[-1] if self._pending else None
        return (self.rng.getstate(), self._next_id, len(self.header), len(self.body),
                set(self.global_writes), set(self.features),
                (len(pending[2]), len(pending[3])) if pending else None)

    def _restore(self, mark) -> None:
        rng_state, self._next_id, n_header, n_body, writes, feats, pending = mark
        self.rng.setstate(rng_state)
        del self.header[n_header:], self.body[n_body:]
        self.global_writes, self.features = writes, feats
        if pending is not None:
            del self._pending[-1][2][pending[0]:], self._pending[-1][3][pending[1]:]
        self.st = self.replay()

    def _step(self, rules) -> bool:
        try:
            b = self.choose(rules)(self)
        except Exception:
            if os.environ.get("FUZZ_DEBUG"):
                raise
            return False
        return self.add(b)

    def gen_body(self, rules, n: int, setup: str = "", setup_defines=()) -> Body | None:
        """Up to ``n`` statements for a compound statement's body, generated and run on
        a copy of the state after ``setup`` (``i = 0`` for a loop, say); None if none
        could be made."""
        saved = self.st
        self._pending.append((setup, setup_defines, [], []))
        self.depth += 1
        try:
            self.st = self.replay()
            for _ in range(3 * n):
                if len(self._pending[-1][3]) >= n:
                    break
                self.step(rules)
            _, _, headers, blocks = self._pending[-1]
            if not blocks:
                return None
            return Body(list(blocks), list(headers), signature(self.st))
        except Exception:
            return None
        finally:
            self.depth -= 1
            self._pending.pop()
            self.st = saved

    # ------------------------------------------------------------------ picking
    def choose(self, table):
        """A rule from a table of (weight, rule)."""
        return self.rng.choices([r for _, r in table], weights=[w for w, _ in table])[0]

    def locals_of(self, kind, pred=None) -> list[str]:
        out = []
        for name in self.st.locals:
            v = self.st.ns.get(name, _MISSING)
            if isinstance(v, kind) and not (kind is int and isinstance(v, bool)):
                if pred is None or pred(v):
                    out.append(name)
        return out

    def pick(self, names: list[str]) -> str | None:
        """A name, the later-bound ones likelier."""
        if not names:
            return None
        return self.rng.choices(names, weights=[1 + i for i in range(len(names))])[0]

    def tensor(self, pred=None) -> str | None:
        return self.pick(self.locals_of(torch.Tensor, pred))

    def value(self, name: str):
        return self.st.ns[name]

    def dim(self, t: torch.Tensor) -> int:
        """A valid dim of ``t`` (0-d tensors accept 0 and -1), sometimes negative."""
        nd = max(t.dim(), 1)
        d = self.rng.randrange(nd)
        return d - nd if self.rng.random() < 0.3 else d


_MISSING = object()


def _bind(st: State, names) -> None:
    for d in names:
        if d not in st.locals:
            st.locals.append(d)
