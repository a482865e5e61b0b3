"""The minifier: a failing graph shrinks to the op that fails, and the repro.py it
writes fails the same way when run alone (KILN_INJECT_BUG plants a known bug)."""
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

from kiln.debug import minifier, repro_runtime, repro_writer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent("""
    import torch, kiln

    def f(x, y):
        a = x * 2
        b = a + y
        c = b.sin()
        d = c - x
        e = torch.relu(d)
        g = e * y
        h = g.exp()
        i = h + 1
        j = i.cos()
        return j * 3

    x, y = torch.randn(8, 4), torch.randn(8, 4)
    out = kiln.compile(f)(x, y)
    assert torch.allclose(out, f(x, y)), "the compiled program's result differs from eager"
    print("PROGRAM OK")
""")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env["PYTHONPATH"] = ROOT
    env["KILN_CACHE_DIR"] = os.environ.get("KILN_CACHE_DIR", os.path.join(ROOT, ".pytest-kiln-cache"))
    env.update(extra)
    return env


def _run(args, cwd, **env):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=600)


def _ops(source: str) -> int:
    return len(re.findall(r"= g\.call_(function|method)\(", source))


def _minify_program(tmp_path, stage, bug, level):
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = _run(["prog.py"], tmp_path, KILN_INJECT_BUG=bug, KILN_REPRO_AFTER=stage,
             KILN_REPRO_LEVEL=level, KILN_SUPPRESS_ERRORS="1")
    assert r.returncode == 0 and "PROGRAM OK" in r.stdout, r.stderr[-3000:]
    repro = tmp_path / "kiln_repro" / "repro.py"
    assert repro.exists(), r.stderr[-3000:]
    source = repro.read_text()
    assert "minified repro written" in r.stderr
    # standalone: only torch and kiln (no user module), the bug's setting recorded in
    # the file (the environment of the run alone does not name it)
    imports = [ln for ln in source.splitlines() if re.match(r"\s*(import|from) ", ln)]
    assert all(re.match(r"\s*(import torch|from kiln|import kiln|import _operator)", ln)
               for ln in imports), imports
    assert "prog" not in "".join(imports)
    assert 1 <= _ops(source) <= 2, source
    assert "relu" in source
    alone = _run([str(repro)], tmp_path / "kiln_repro")
    return source, alone


@pytest.mark.slow
def test_compile_error_minified_to_relu_and_repro_fails_alone(tmp_path):
    source, alone = _minify_program(tmp_path, "autograd", "relu_compile_error", "error")
    assert alone.returncode != 0, alone.stdout + alone.stderr
    assert "InjectedCompileError" in alone.stderr.splitlines()[-1]


@pytest.mark.slow
def test_accuracy_minified_to_relu_and_repro_fails_alone(tmp_path):
    source, alone = _minify_program(tmp_path, "autograd", "relu_accuracy", "accuracy")
    assert alone.returncode != 0, alone.stdout + alone.stderr
    assert "differs from eager" in alone.stderr
    # the same file without the planted bug runs clean: the repro tests kiln, not itself
    fixed = source.replace("'inject_bug': 'relu_accuracy'", "'inject_bug': ''")
    (tmp_path / "fixed.py").write_text(fixed)
    ok = _run(["fixed.py"], tmp_path)
    assert ok.returncode == 0 and "not reproduced" in ok.stdout, ok.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["capture", "kernels"])
def test_other_stages(tmp_path, stage):
    source, alone = _minify_program(tmp_path, stage, "relu_compile_error", "error")
    assert f"{stage!r}, 'error'" in source
    assert alone.returncode != 0 and "InjectedCompileError" in alone.stderr


@pytest.mark.slow
def test_no_failure_no_repro(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = _run(["prog.py"], tmp_path, KILN_REPRO_AFTER="autograd", KILN_REPRO_LEVEL="accuracy")
    assert r.returncode == 0 and "PROGRAM OK" in r.stdout, r.stderr[-2000:]
    assert not (tmp_path / "kiln_repro").exists()


@pytest.mark.slow
def test_error_raised_after_report_without_suppress(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    r = _run(["prog.py"], tmp_path, KILN_INJECT_BUG="relu_compile_error",
             KILN_REPRO_AFTER="autograd", KILN_SUPPRESS_ERRORS="0")
    assert r.returncode != 0 and "InjectedCompileError" in r.stderr
    assert (tmp_path / "kiln_repro" / "repro.py").exists()


# --- the parts, in process ---------------------------------------------------------
def test_ddmin_finds_the_culprits():
    calls = []

    def fails(items):
        calls.append(list(items))
        return 3 in items and 7 in items

    assert sorted(minifier.ddmin(list(range(10)), fails)) == [3, 7]
    assert minifier.ddmin(list(range(10)), lambda s: 4 in s) == [4]


def _graph():
    g = fx.Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    a = g.call_function(torch.ops.aten.add.Tensor, (x, y))
    mx = g.call_function(torch.ops.aten.max.dim, (a, 1, True))
    v = g.call_function(__import__("operator").getitem, (mx, 0))
    i = g.call_function(__import__("operator").getitem, (mx, 1))
    c = g.call_function(torch.ops.aten.mul.Tensor, (v, float("inf")))
    d = g.call_method("to", (i,), {"dtype": torch.float32})
    e = g.call_function(torch.ops.aten.relu.default, (c,))
    root = torch.nn.Module()
    root.register_buffer("k", torch.tensor([1.0, 2.0]))
    k = g.get_attr("k")
    s = g.call_function(torch.ops.aten.sum.default, (k,))
    g.output((e, d, s))
    return fx.GraphModule(root, g)


def test_graph_source_round_trip():
    gm = _graph()
    src = repro_writer.graph_source(gm)
    back = repro_writer.load(src)
    specs = [("tensor", (3, 4), (4, 1), "float32", "cpu", False)] * 2
    x, y = repro_runtime.make_inputs(specs)
    for a, b in zip(gm(x, y), back(x, y)):
        torch.testing.assert_close(a, b)
    assert [n.op for n in gm.graph.nodes] == [n.op for n in back.graph.nodes]


def test_unwritable_target():
    g = fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(lambda t: t + 1, (x,)))
    with pytest.raises(repro_writer.Unwritable):
        repro_writer.graph_source(fx.GraphModule({}, g))


def test_subgraph_cuts_become_inputs():
    gm = _graph()
    specs = [("tensor", (3, 4), (4, 1), "float32", "cpu", False)] * 2
    values = minifier._values(gm, specs)
    units = minifier._units(gm)
    assert [len(u) for u in units] == [1, 3, 1, 1, 1, 1]  # max with its two getitems
    relu = next(u for u in units if u[0].target is torch.ops.aten.relu.default)
    sub, sub_specs = minifier.subgraph(gm, set(relu), values, specs)
    assert [n.op for n in sub.graph.nodes] == ["placeholder", "call_function", "output"]
    assert sub_specs == [("tensor", (3, 1), (1, 1), "float32", "cpu", False)]


def test_accuracy_difference_reports():
    assert repro_runtime.difference(torch.ones(3), torch.ones(3)) is None
    assert "max abs difference" in repro_runtime.difference(torch.ones(3), torch.ones(3) + 1)
    assert "dtype" in repro_runtime.difference(torch.ones(3), torch.ones(3).double()) or \
        "float64" in repro_runtime.difference(torch.ones(3), torch.ones(3).double())
    assert repro_runtime.difference(torch.tensor([float("nan")]), torch.tensor([float("nan")])) is None


def test_bad_settings_are_rejected():
    from kiln import config
    with config.patch(repro_after="bogus"):
        with pytest.raises(ValueError, match="capture, autograd, kernels"):
            minifier.active("capture")


def _aten_graph(build):
    g = fx.Graph()
    out = build(g)
    g.output((out,))
    return fx.GraphModule({}, g)


def test_random_graphs_are_not_accuracy_checked(tmp_path, monkeypatch):
    from kiln import config
    from kiln.kernels.compile import CompiledGraph
    monkeypatch.chdir(tmp_path)
    aten = torch.ops.aten
    gm = _aten_graph(lambda g: g.call_function(aten.add.Tensor, (
        g.call_function(aten.rand_like.default, (g.placeholder("x"),)), 1)))
    x = torch.randn(4)
    with config.patch(repro_after="kernels", repro_level="accuracy"):
        c = minifier.Checked("kernels", gm, lambda: CompiledGraph(gm, [x]), [x])
        (out,) = c(x)
    assert out.shape == x.shape and ((out >= 1) & (out < 2)).all()
    assert not (tmp_path / "kiln_repro").exists()


def test_programs_own_error_is_not_reported(tmp_path, monkeypatch):
    from kiln import config
    from kiln.kernels.compile import CompiledGraph
    monkeypatch.chdir(tmp_path)
    aten = torch.ops.aten
    gm = _aten_graph(lambda g: g.call_function(aten.index_select.default, (
        g.placeholder("x"), 0, g.placeholder("i"))))
    x, bad = torch.randn(3), torch.tensor([10])
    eager_error = None
    try:
        gm(x, bad)
    except Exception as e:  # noqa: BLE001
        eager_error = type(e)
    assert eager_error is not None
    with config.patch(repro_after="kernels", repro_level="error"):
        c = minifier.Checked("kernels", gm, lambda: CompiledGraph(gm, [x, torch.tensor([0])]),
                             [x, torch.tensor([0])])
        torch.testing.assert_close(c(x, torch.tensor([1]))[0], x[[1]])
        with pytest.raises(eager_error):
            c(x, bad)
    assert not (tmp_path / "kiln_repro").exists()


TRAINING = textwrap.dedent("""
    import torch, kiln
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(5, 4)
    out = kiln.compile(m)(x)
    out.sum().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    ref = m(x)
    ref.sum().backward()
    assert torch.allclose(out, ref, atol=1e-5)
    assert all(torch.allclose(g, p.grad, atol=1e-5) for g, p in zip(grads, m.parameters()))
    print("PROGRAM OK")
""")


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["capture", "autograd", "kernels"])
def test_training_module_accuracy(tmp_path, stage):
    """Parameters that require grad, a backward graph compiled later: the repro still
    shrinks to the relu, and eager's results are what the program gets."""
    (tmp_path / "prog.py").write_text(TRAINING)
    r = _run(["prog.py"], tmp_path, KILN_INJECT_BUG="relu_accuracy", KILN_REPRO_AFTER=stage,
             KILN_REPRO_LEVEL="accuracy", KILN_SUPPRESS_ERRORS="1")
    assert r.returncode == 0 and "PROGRAM OK" in r.stdout, r.stderr[-3000:]
    source = (tmp_path / "kiln_repro" / "repro.py").read_text()
    assert _ops(source) == 1 and "relu" in source
    alone = _run([str(tmp_path / "kiln_repro" / "repro.py")], tmp_path)
    assert alone.returncode != 0 and "differs from eager" in alone.stderr


def test_minifier_failure_does_not_mask_the_error(tmp_path, monkeypatch):
    """A bug in the minifier itself is logged; the stage's own failure goes on."""
    from kiln import config
    from kiln.debug import inject
    from kiln.kernels.compile import CompiledGraph
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(minifier, "minify", lambda *a, **k: 1 / 0)
    aten = torch.ops.aten
    gm = _aten_graph(lambda g: g.call_function(aten.relu.default, (g.placeholder("x"),)))
    x = torch.randn(4)
    with config.patch(repro_after="kernels", inject_bug="relu_compile_error",
                      suppress_errors=False):
        with pytest.raises(inject.InjectedCompileError):
            minifier.Checked("kernels", gm, lambda: CompiledGraph(gm, [x]), [x])
    assert not (tmp_path / "kiln_repro").exists()


MUTATING = textwrap.dedent("""
    import torch, kiln

    def f(x, y):
        x.add_(1)
        return torch.relu(x * y) + 2

    x, y = torch.randn(8, 4), torch.randn(8, 4)
    x2 = x.clone()
    out = kiln.compile(f)(x, y)
    ref = f(x2, y)
    assert torch.allclose(out, ref) and torch.equal(x, x2), "mutated once, as eager"
    print("PROGRAM OK")
""")


@pytest.mark.slow
@pytest.mark.parametrize("level,bug", [("error", "relu_compile_error"),
                                       ("accuracy", "relu_accuracy")])
def test_capture_stage_with_a_mutated_input(tmp_path, level, bug):
    """Checking the graph never applies the program's write twice."""
    (tmp_path / "prog.py").write_text(MUTATING)
    r = _run(["prog.py"], tmp_path, KILN_INJECT_BUG=bug, KILN_REPRO_AFTER="capture",
             KILN_REPRO_LEVEL=level, KILN_SUPPRESS_ERRORS="1")
    assert r.returncode == 0 and "PROGRAM OK" in r.stdout, r.stderr[-3000:]
    source = (tmp_path / "kiln_repro" / "repro.py").read_text()
    assert _ops(source) <= 2 and "relu" in source
