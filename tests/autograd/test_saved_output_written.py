"""An output the compiled backward saves, written in place after the call: eager's
backward fails only where it reads that tensor; the compiled one must do the same (it
saved the output for a gradient path the loss may not take), and must never read the
written value."""
from __future__ import annotations

import pytest
import torch

import kiln


def f(x):
    y = (x * 2).sum()
    y.exp_()             # exp_ saves its result (the output), in eager and compiled
    z = x.sin()          # its backward reads a saved value too
    return y, z


def _run(fn, backend=None):
    x = torch.randn(4, requires_grad=True)
    g = kiln.compile(fn, backend=backend) if backend else fn
    return x, g(x)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_backward_not_reading_the_written_output_runs(backend):
    for run in (lambda: _run(f), lambda: _run(f, backend)):
        x, (y, z) = run()
        y.add_(1)                       # eager's exp backward would now refuse
        z.sum().backward()              # ... but this backward never reaches it
        torch.testing.assert_close(x.grad, x.detach().cos())


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_backward_reading_the_written_output_raises_as_eager(backend):
    errors = []
    for run in (lambda: _run(f), lambda: _run(f, backend)):
        x, (y, z) = run()
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as e:
            (y.sum() + z.sum()).backward()
        errors.append(type(e.value))
    assert errors[0] is errors[1]
