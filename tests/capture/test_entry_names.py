"""Names in a compiled entry's namespace are never shared: the guards' constants join
the namespace after the entry code took its own names (a guard's ``__f5`` once replaced
the function a graph break calls, fuzz seed 11227)."""
import torch

import kiln
from kiln.capture.guards import GuardSet


class _Counter:
    def __init__(self, k):
        self.k = k

    def __call__(self, t):
        self.k = self.k + 1
        return t * self.k


_STATE = {"scale": 0.5, "calls": 0}
_COUNTER = _Counter(0)


def _prog(x0, x1):
    _STATE["last"] = x1
    x1.zero_()
    v7 = _Counter(1)(x1)
    v8 = _COUNTER(x1)
    v9 = v8.flip(0)
    kiln.graph_break()
    v10 = v8.view(-1)
    v10[0] = 1.5
    return x1, v7, torch.reciprocal(v9)


def _inputs():
    g = torch.Generator().manual_seed(0)
    leaves = [torch.randn(7, 2, generator=g).requires_grad_(),
              torch.randn(2, generator=g).requires_grad_()]
    return [t.clone() for t in leaves], leaves       # non-leaf inputs that require grad


def test_a_break_after_a_guard_on_autograd_standing_calls_its_own_function():
    kiln.reset()
    f = kiln.compile(_prog, backend="eager")
    for call in range(2):
        _STATE.clear(), _STATE.update(scale=0.5, calls=0)
        _COUNTER.k = 0
        args, leaves = _inputs()
        want = _prog(*args)
        _STATE.clear(), _STATE.update(scale=0.5, calls=0)
        _COUNTER.k = 0
        args2, leaves2 = _inputs()
        got = f(*args2)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b)
        sum(o.sum() for o in want).backward()
        sum(o.sum() for o in got).backward()
        torch.testing.assert_close(leaves2[1].grad, leaves[1].grad)


def test_guard_constants_keep_off_reserved_names():
    gs = GuardSet()
    gs.reserve("__f0")
    gs.reserve("__f1")
    assert gs.const(len, "f") == "__f2"
    assert gs.const(len, "f") == "__f2"          # the same object, the same name
    assert gs.const(abs, "f") == "__f3"
