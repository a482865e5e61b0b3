"""Recompile explanations: every failed guard, old and new value, in plain words."""
import logging

import pytest
import torch

import kiln
from kiln.capture import guard_failures
from kiln.capture.guards import GuardSet
from kiln.capture.sources import LocalSource


def _recompile_log(caplog, fn, calls):
    """Compile ``fn`` (eager backend), make each call; the recompiles log and results."""
    c = kiln.compile(fn, backend="eager")
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        for args in calls:
            got, want = c(*args), fn(*args)
            torch.testing.assert_close(got, want)
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.recompiles")


def test_every_failed_guard_with_old_and_new_values(caplog):
    def f(x, y, n):
        return x * n + y

    text = _recompile_log(caplog, f, [
        (torch.randn(4, 3), torch.randn(4, 3), 2),
        (torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 5), 3),
    ])
    assert "recompiling f" in text
    for words in ["L['x'].shape[0] was 4, now 8", "L['x'].shape[1] was 3, now 5",
                  "L['x'].dtype was torch.float32, now torch.float64",
                  "L['x'].stride()[0] was 3, now 5",
                  "L['y'].shape[0] was 4, now 8", "L['y'].shape[1] was 3, now 5",
                  "L['n'] was 2, now 3"]:
        assert words in text, (words, text)
    assert "L['y'].dtype" not in text      # unchanged: not listed


def test_global_state_and_grad_mode_in_words(caplog):
    def f(x):
        return x + 1

    c = kiln.compile(f, backend="eager")
    x = torch.randn(3)
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        c(x)
        with torch.no_grad():
            c(x)
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            c(x)
        finally:
            torch.set_default_dtype(old)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "torch.is_grad_enabled() was True, now False" in text
    assert "default dtype=torch.float32 before, now default dtype=torch.float64" in text
    assert "entry 0:" in text and "entry 1:" in text     # checked against both entries


def test_limit_warning_names_the_failed_guards(caplog):
    def f(x, n):
        return x + n

    c = kiln.compile(f, backend="eager")
    x = torch.randn(2)
    with kiln.config.patch(recompile_limit=1), caplog.at_level(logging.WARNING, logger="kiln"):
        c(x, 1)
        torch.testing.assert_close(c(x, 2), f(x, 2))
    text = caplog.text
    assert "hit recompile_limit (1)" in text and "L['n'] was 1, now 2" in text


def _guards_for(t, n):
    gs = GuardSet()
    gs.tensor(LocalSource("x"), t)
    gs.constant(LocalSource("n"), n)
    ns = dict(gs.consts)
    ns["__torch"] = torch
    return gs.guards, ns


def test_a_type_change_is_not_followed_by_its_consequences():
    guards, ns = _guards_for(torch.randn(2, 3), 7)
    failures = guard_failures.explain(guards, ns, {"x": 5, "n": 7})
    lines = guard_failures.plain_lines(failures)
    assert lines == ["type(L['x']) was Tensor, now int"], lines


def test_first_guard_that_cannot_be_checked_is_reported():
    guards, ns = _guards_for(torch.randn(2, 3), 7)
    failures = guard_failures.explain(guards[1:], ns, {"x": 5, "n": 7})   # no type guard
    assert failures and failures[0].error is not None
    assert "could not be checked" in failures[0].plain()[0]


def test_passing_guards_explain_nothing():
    t = torch.randn(2, 3)
    guards, ns = _guards_for(t, 7)
    assert guard_failures.explain(guards, ns, {"x": torch.randn(2, 3), "n": 7}) == []


@pytest.mark.parametrize("was,now,words", [
    ((2, 3), (2, 3, 1), "L['x'].shape had 2 dims (2, 3), now 3 dims (2, 3, 1)"),
    ((2, 3), (2, 4), "L['x'].shape[1] was 3, now 4"),
])
def test_shape_words(was, now, words):
    guards, ns = _guards_for(torch.randn(*was), 7)
    failures = guard_failures.explain(guards, ns, {"x": torch.randn(*now), "n": 7})
    assert words in guard_failures.plain_lines(failures)
