"""The fuzzer's own tests: the comparator must catch planted differences of every kind
(a comparator that silently passes would make the whole fuzzer worthless), the
generator must be deterministic and produce programs eager runs, and reproducers must
run."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from .compare import compare
from .generator import generate
from .modes import lookup
from .observe import differentiable_outputs
from .program import Program
from .repro import path_expr, write_repro
from .runner import CALLS, CaseResult, classify, eager_observations, observations, run_case

SOURCE = textwrap.dedent('''
    import math
    import torch
    import torch.nn.functional as F

    G_n = 0
    G_l = []

    def make_inputs(g, train=False, clone=False):
        b0 = torch.randn((3, 4), generator=g, dtype=torch.float32)
        leaves = [b0] if train else []
        for t in leaves:
            t.requires_grad_()
        if clone:
            b0 = b0.clone()
        x0 = b0.t()
        return [x0, b0[0] if not train else b0[0].detach()], [b0], leaves

    def prog(x, y):
        global G_n
        G_n += 1
        G_l.append(G_n)
        v = x[1:] * 2
        return v, x[0], y
''')


def program(train_inputs="clone"):
    return Program(0, SOURCE, train_inputs)


def run_fake(wrap, train=False, p=None):
    """Mismatches and status of a fake 'compiled' run: ``wrap(ns, prog)`` returns the
    function called instead of ``prog``."""
    p = p or program()
    eager = eager_observations(p, train)
    fake = observations(p, lambda ns: wrap(ns, ns["prog"]), train)
    torch.set_grad_enabled(True)
    found = [m for c in range(CALLS) for m in compare(c, eager[c], fake[c])]
    return found, classify(found, fake)[0]


def facets(found):
    return {(m.where, m.facet) for m in found}


def test_identical_run_passes():
    found, status = run_fake(lambda ns, f: f)
    assert found == [] and status == "ok"


def test_planted_wrong_value():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v + 1, a, b
        return g

    found, status = run_fake(wrap)
    assert status == "wrong"
    assert ("output", "values") in facets(found)


def test_grad_mode_left_off():
    def wrap(ns, f):
        def g(*args):
            out = f(*args)
            torch.set_grad_enabled(False)
            return out
        return g

    found, status = run_fake(wrap)
    assert status == "wrong" and ("grad_mode", "value") in facets(found)


def test_input_mutated_differently():
    def wrap(ns, f):
        def g(x, y):
            out = f(x, y)
            x[0, 0] += 1
            return out
        return g

    found, status = run_fake(wrap)
    assert status == "wrong" and ("mutation", "values") in facets(found)


def test_input_metadata_changed():
    def wrap(ns, f):
        def g(x, y):
            out = f(x, y)
            y.unsqueeze_(0)
            return out
        return g

    found, _ = run_fake(wrap)
    assert ("mutation", "shape") in facets(found)


def test_alias_lost():
    """eager's ``x[0]`` views the input; a copy with the same values must be caught."""
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v, a.clone(), b
        return g

    found, status = run_fake(wrap)
    assert status == "wrong" and ("output", "alias") in facets(found)


def test_identity_lost():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v, a, b.view_as(b)
        return g

    found, _ = run_fake(wrap)
    assert ("output", "identity") in facets(found)


def test_fresh_output_aliasing_input():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            x[1:].mul_(2)
            return x[1:], a, b
        return g

    found, _ = run_fake(wrap)
    assert ("output", "alias") in facets(found)


def test_contiguity_of_fresh_output():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v.contiguous(), a, b
        return g

    found, _ = run_fake(wrap)
    assert ("output", "contiguity") in facets(found)


def test_global_state_differs():
    def wrap(ns, f):
        def g(*args):
            out = f(*args)
            ns["G_n"] += 1
            return out
        return g

    found, status = run_fake(wrap)
    assert status == "wrong" and ("global", "value") in facets(found)


def test_global_container_differs():
    def wrap(ns, f):
        def g(*args):
            out = f(*args)
            ns["G_l"].append(0)
            return out
        return g

    found, _ = run_fake(wrap)
    assert ("global", "length") in facets(found)


def test_dtype_differs():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v.double(), a, b
        return g

    found, _ = run_fake(wrap)
    assert ("output", "dtype") in facets(found)


def test_exception_is_a_crash():
    def wrap(ns, f):
        def g(*args):
            raise RuntimeError("compiler bug")
        return g

    found, status = run_fake(wrap)
    assert status == "crash"


def test_missing_exception_is_wrong():
    src = SOURCE.replace("    return v, x[0], y", "    raise ValueError('user error')")
    p = Program(0, src, "clone")

    def wrap(ns, f):
        def g(x, y):
            return x
        return g

    found, status = run_fake(wrap, p=p)
    assert status == "wrong" and ("exception", "type") in facets(found)


def test_other_exception_type_is_a_crash():
    src = SOURCE.replace("    return v, x[0], y", "    raise ValueError('user error')")
    p = Program(0, src, "clone")

    def wrap(ns, f):
        def g(x, y):
            raise TypeError("compiler bug")
        return g

    _, status = run_fake(wrap, p=p)
    assert status == "crash"


def test_requires_grad_differs_in_train():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v.detach(), a, b
        return g

    found, status = run_fake(wrap, train=True)
    assert status == "wrong"
    assert ("output", "requires_grad") in facets(found)


def test_gradient_differs_in_train():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v * 1.5, a, b
        return g

    found, _ = run_fake(wrap, train=True)
    assert ("grad", "values") in facets(found)


def test_gradient_none_vs_zeros():
    def wrap(ns, f):
        def g(x, y):
            v, a, b = f(x, y)
            return v + 0 * x.sum(), a, b
        return g

    p = Program(0, SOURCE.replace("v = x[1:] * 2", "v = (x[1:] * 2).detach()"), "clone")
    found, _ = run_fake(wrap, train=True, p=p)
    assert ("grad", "type") in facets(found) or ("output", "requires_grad") in facets(found)


def test_stale_output_buffer():
    """A compiled run that hands out one buffer and overwrites it on the next call."""
    def wrap(ns, f):
        buf = {}

        def g(x, y):
            v, a, b = f(x, y)
            out = buf.setdefault("v", torch.empty_like(v))
            out.copy_(v)
            return out, a, b
        return g

    found, _ = run_fake(wrap)
    assert ("stale_output", "values") in facets(found)


def test_differentiable_outputs_walk_containers():
    a = torch.ones(2, requires_grad=True) * 2
    b = torch.ones(2)
    assert differentiable_outputs({"k": [a, b, (a,)]}) == [a]


@pytest.mark.parametrize("seed", range(8))
def test_generator_is_deterministic_and_eager_runs(seed):
    p, q = generate(seed), generate(seed)
    assert p == q
    for o in eager_observations(p, False):
        assert o.exc is None
    compile(p.source, "<fuzz>", "exec")


@pytest.mark.parametrize("slow_call", [0, 7, 25, 50])
def test_a_statement_slow_once_does_not_change_the_program(monkeypatch, slow_call):
    """A first use of an op can run over the statement time limit once (lazy
    initialization, a busy machine): the seed's program must be the same as without it."""
    from . import gen_state

    expected = generate(3)
    calls = {"n": 0}

    def maybe_overrun():
        calls["n"] += 1
        if calls["n"] == slow_call + 1:
            gen_state._overruns += 1
            raise gen_state.TooSlow("simulated")

    real_run, real_eval = gen_state.State.run, gen_state.State.eval

    def run(self, text, limit=True):
        if limit:                  # not a replay of a statement that finished before
            maybe_overrun()
        return real_run(self, text, limit)

    def eval_(self, text):
        maybe_overrun()
        return real_eval(self, text)

    monkeypatch.setattr(gen_state.State, "run", run)
    monkeypatch.setattr(gen_state.State, "eval", eval_)
    assert generate(3) == expected
    assert calls["n"] > slow_call


def test_path_expressions():
    assert path_expr("out[0]['a'].t", "E") == "E[\"out\"][0]['a'].t"
    assert path_expr("grads[1]", "C") == 'C["leaves"][1].grad'
    assert path_expr("G_c3.cell0", "E") == 'E["ns"]["G_c3"].__closure__[0].cell_contents'
    assert path_expr("stale[2]", "C") == 'PREV[1]["out"][2]'


@pytest.mark.slow
def test_repro_runs_and_checks(tmp_path):
    """A reproducer of a planted failure: kiln's eager backend is right on this program,
    so the planted 'values differ at out[0]' check must report it is not reproduced —
    and a check over a fact that does differ must raise."""
    p = program()
    mode = lookup("eager")
    r = run_case(p, mode, timeout=120)
    assert r.status == "ok", r.mismatches
    from .compare import Mismatch

    r = CaseResult(0, "eager", "wrong", [Mismatch(0, "output", "values", "out[0]", "planted")])
    path = write_repro(str(tmp_path), p, mode, r)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and "not reproduced" in done.stdout, done.stderr
    text = open(path).read().replace("check(close(E[\"out\"][0], C[\"out\"][0], grad=False)", "check(False")
    open(path, "w").write(text)
    done = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode != 0 and "compiled differs from eager" in done.stderr


def test_tolerances():
    from .compare import value_difference

    a = torch.tensor([1.0, 2.0])
    assert value_difference(a, a + 1e-6) == ""
    assert value_difference(a, a * (1 + 1e-3)) != ""
    assert value_difference(a, a * (1 + 1e-3), loose=True) == ""
    assert value_difference(torch.tensor([1, 2]), torch.tensor([1, 3])) != ""
    nan = torch.tensor([float("nan"), 1.0])
    assert value_difference(nan, nan.clone()) == ""
    assert value_difference(nan, torch.tensor([0.0, 1.0])) != ""


@pytest.mark.slow
def test_pool_reports_segfault_and_timeout(tmp_path):
    """Subprocess mode: a dying worker is a segfault, a hanging case a timeout, and
    the pool goes on with the next case in a fresh worker."""
    from .pool import Pool

    crash = Program(1, SOURCE.replace("    return v, x[0], y", "    import ctypes\n    ctypes.string_at(0)"))
    hang = Program(2, SOURCE.replace("    return v, x[0], y", "    import time\n    time.sleep(60)"))
    fine = program()
    mode = lookup("eager")
    tasks = [(crash, mode), (hang, mode), (fine, mode)]
    got = {t[0].seed: r.status for t, r in Pool(1, timeout=8, log_dir=str(tmp_path)).run(tasks)}
    assert got == {1: "segfault", 2: "timeout", 0: "ok"}
