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
FAST_SEEDS = range(0, 50)
SLOW_SEEDS = range(50, 150)
TIMEOUT = 300.0

# Short reasons, by bug class (generator and comparator of this commit).
GRAD_MODE = "G1: grad mode after the call (set_grad_enabled without compute, or around a break)"
INPLACE_NONLEAF = "C1: in-place on a non-leaf input that requires grad raises at trace time"
OUT_FRESH = "A1: out= into a fresh tensor: no out-of-place twin"
SHAPE_INPLACE = "A2: shape-changing in-place op on an input (t_/squeeze_/unsqueeze_)"
RESHAPE_COPY = "A3: a reshape that copies, written to, replayed as a view"
STRIDED_SETITEM = "K1: write into a strided-view input: StorageLayoutError"
POW_0D = "A4: pow_ on a 0-d half tensor"
VERSION_AT_TRACE = "A5: backward-time version-counter error raised at compile time"
GRAD_NONE = "A6: a gradient None in eager is a tensor"
AUTOGRAD_META = "A7: requires_grad/is_leaf of values made under no_grad or by detach"
NONDIFF_TRACED = "A8: an op eager never differentiates (unique, floor_divide) differentiated"
SECOND_BACKWARD = "A9: a value kept across calls cannot be backpropagated again"
WRONG_SHAPE = "W1/W2: wrong output shape (1-d @ 2-d; squeeze_ of an intermediate)"
LAYOUT = "S1: layout (contiguity) of an intermediate returned differs from eager's"

#: (seed, mode) -> reason: every failing pair of FAST_SEEDS and SLOW_SEEDS today.
KNOWN_FAILURES: dict[tuple[int, str], str] = {
    **dict.fromkeys([(13, "eager"), (20, "aot_eager"), (20, "kiln"), (21, "aot_eager"), (21, "kiln"),
        (21, "train"), (26, "aot_eager"), (26, "kiln"), (32, "eager"), (32, "aot_eager"), (36, "eager"),
        (37, "eager"), (37, "aot_eager"), (37, "kiln"), (37, "train"), (60, "aot_eager"), (60, "kiln"),
        (60, "train"), (68, "eager"), (72, "eager"), (72, "aot_eager"), (72, "kiln"), (72, "train"),
        (77, "aot_eager"), (77, "kiln"), (78, "eager"), (78, "aot_eager"), (78, "kiln"), (84, "eager"),
        (92, "aot_eager"), (92, "kiln"), (115, "aot_eager"), (115, "kiln"), (115, "train"), (116, "eager"),
        (116, "aot_eager"), (116, "kiln"), (118, "aot_eager"), (118, "kiln"), (118, "train"), (119, "eager"),
        (120, "aot_eager"), (120, "kiln"), (120, "train"), (122, "aot_eager"), (122, "kiln"), (129, "eager"),
        (130, "aot_eager"), (130, "kiln"), (131, "eager"), (131, "aot_eager"), (131, "kiln"), (131, "train"),
        (134, "aot_eager"), (134, "kiln"), (143, "eager")], GRAD_MODE),
    **dict.fromkeys([(1, "train"), (2, "train"), (5, "train"), (6, "train"), (7, "train"), (8, "train"),
        (10, "train"), (13, "train"), (14, "train"), (16, "train"), (18, "train"), (20, "train"),
        (25, "train"), (26, "train"), (27, "train"), (28, "train"), (30, "train"), (31, "train"),
        (32, "train"), (33, "train"), (34, "train"), (38, "train"), (40, "train"), (41, "train"),
        (43, "train"), (55, "train"), (56, "train"), (59, "train"), (63, "train"), (65, "train"),
        (66, "train"), (67, "train"), (69, "train"), (75, "train"), (76, "train"), (77, "train"),
        (82, "train"), (93, "train"), (94, "train"), (96, "train"), (97, "train"), (102, "train"),
        (103, "train"), (105, "train"), (107, "train"), (108, "train"), (112, "train"), (121, "train"),
        (122, "train"), (130, "train"), (132, "train"), (136, "train"), (138, "train"), (140, "train"),
        (143, "train")], INPLACE_NONLEAF),
    **dict.fromkeys([(0, "aot_eager"), (0, "kiln"), (0, "train"), (48, "aot_eager"), (48, "kiln"),
        (48, "train"), (84, "aot_eager"), (84, "kiln"), (84, "train"), (95, "aot_eager"), (95, "kiln"),
        (95, "train"), (126, "aot_eager"), (126, "kiln"), (126, "train"), (145, "aot_eager"), (145, "kiln"),
        (145, "train")], OUT_FRESH),
    **dict.fromkeys([(12, "train"), (13, "aot_eager"), (13, "kiln"), (78, "train"), (92, "train"),
        (98, "train"), (106, "train"), (116, "train"), (134, "train")], AUTOGRAD_META),
    **dict.fromkeys([(59, "aot_eager"), (59, "kiln"), (68, "aot_eager"), (68, "kiln"), (68, "train"),
        (140, "aot_eager"), (140, "kiln")], SHAPE_INPLACE),
    **dict.fromkeys([(8, "aot_eager"), (8, "kiln"), (55, "aot_eager"), (55, "kiln"), (75, "aot_eager"),
        (75, "kiln")], POW_0D),
    **dict.fromkeys([(14, "aot_eager"), (14, "kiln"), (52, "train"), (111, "train")], RESHAPE_COPY),
    **dict.fromkeys([(49, "train"), (64, "train"), (88, "train"), (123, "train")], GRAD_NONE),
    **dict.fromkeys([(76, "kiln"), (129, "kiln"), (129, "train")], LAYOUT),
    **dict.fromkeys([(89, "aot_eager"), (89, "kiln"), (89, "train")], WRONG_SHAPE),
    **dict.fromkeys([(79, "train"), (128, "train")], NONDIFF_TRACED),
    **dict.fromkeys([(91, "train"), (139, "train")], SECOND_BACKWARD),
    **dict.fromkeys([(108, "aot_eager"), (108, "kiln")], VERSION_AT_TRACE),
    **dict.fromkeys([(32, "kiln")], STRIDED_SETITEM),
}


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
