"""The fuzzer's CI slice: fixed seeds, every kiln mode, compared with eager.

Every (seed, mode) must match eager, except the pairs in ``KNOWN_FAILURES``: bugs found
by the fuzzer that are being fixed (tests/fuzz/README.md). The list is exactly what fails today: when a fix lands, the slow
``test_known_failures_still_fail`` names the pairs that pass now and they are removed;
a new failure outside the list is a regression. The programs behind the seeds change
whenever the generator does: re-run both slices and rewrite the list with it.
"""
from __future__ import annotations

import pytest

from .generator import generate
from .modes import lookup
from .runner import run_case

MODES = ("eager", "aot_eager", "kiln", "train")
FAST_SEEDS = range(0, 20)
SLOW_SEEDS = range(20, 150)
TIMEOUT = 300.0

#: (seed, mode) -> reason: every failing pair of FAST_SEEDS and SLOW_SEEDS today (short
#: reasons, by bug class; generator and comparator of this commit).
KNOWN_FAILURES: dict[tuple[int, str], str] = {}


def _failures(seed: int, modes) -> list[str]:
    program = generate(seed)
    bad = []
    for mode in modes:
        if (seed, mode) in KNOWN_FAILURES:
            continue
        r = run_case(program, lookup(mode), timeout=TIMEOUT)
        if r.status not in ("ok", "skipped"):
            detail = "\n      ".join(str(m) for m in r.mismatches[:4]) or r.error[:400]
            bad.append(f"  {mode}: {r.status}\n      {detail}")
    if bad:
        bad.insert(0, f"seed {seed} (python -m tests.fuzz --seeds {seed}:{seed + 1} writes a reproducer):")
        bad.append(program.source)
    return bad


@pytest.mark.parametrize("seed", FAST_SEEDS)
def test_fuzz_slice(seed):
    bad = _failures(seed, MODES)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_fuzz_slice_large(seed):
    bad = _failures(seed, MODES)
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_known_failures_still_fail():
    """Keeps KNOWN_FAILURES exact: a listed pair that passes now must leave the list."""
    fixed = []
    for (seed, mode), reason in sorted(KNOWN_FAILURES.items()):
        r = run_case(generate(seed), lookup(mode), timeout=TIMEOUT)
        if r.status in ("ok", "skipped"):
            fixed.append(f"({seed}, {mode!r}): {reason}")
    assert not fixed, "these pass now; remove them from KNOWN_FAILURES:\n" + "\n".join(fixed)
