"""kiln.CompileProfiler: a backend that counts graphs, breaks by ID, frames run eagerly
and recompiles over a run, while a real backend compiles (results are eager's)."""
from __future__ import annotations

import inspect

import torch

import kiln
from kiln import config


def _inner(x):
    return x.relu() * 2


def _two_breaks(x):
    y = x.sin()
    print("profiled")
    if y.sum() > 0:
        y = y + 1
    return _inner(y).cos()


def _line_of(fn, text):
    src, first = inspect.getsourcelines(fn)
    k = next(i for i, s in enumerate(src) if text in s)
    return f"{fn.__code__.co_filename}:{first + k}"


def test_breaks_by_id_and_recompiles(capsys):
    prof = kiln.CompileProfiler()
    f = kiln.compile(_two_breaks, backend=prof)
    for n in (4, 5):
        x = torch.randn(n)
        torch.testing.assert_close(f(x), _two_breaks(x))
    assert prof.graph_count >= 3 and prof.op_count >= 6
    groups = prof.breaks_by_id()
    assert set(groups) == {"K0006", "K0018"}
    assert all(b.user_stack for bs in groups.values() for b in bs)
    assert len(prof.recompiles) >= 1
    where, guard = prof.recompiles[0]
    assert "_two_breaks" in where and "shape" in guard
    report = prof.report()
    assert "[K0006] data-dependent control flow" in report
    assert "[K0018] side effect outside the graph" in report
    assert _line_of(_two_breaks, 'print("profiled")') in report
    assert _line_of(_two_breaks, "if y.sum() > 0") in report
    assert "Recompiles: " in report and "guard failed" in report and "was 4, now 5" in report
    m = prof.get_metrics()
    assert m["graph_breaks"] == len(prof.breaks) and m["break_ids"]["K0018"] >= 1
    assert m["recompiles"] == len(prof.recompiles)


def test_no_break_no_recompile():
    prof = kiln.CompileProfiler()
    f = kiln.compile(_inner, backend=prof)
    x = torch.randn(3)
    torch.testing.assert_close(f(x), _inner(x))
    f(torch.randn(3))
    assert prof.graph_count == prof.frame_count == 1 and prof.op_count == 2
    assert not prof.breaks and not prof.recompiles and not prof.frames_run_eagerly
    assert "Graph breaks: 0" in prof.report() and "Recompiles: 0" in prof.report()


def _gen(x):
    yield x * 2


def test_frames_run_eagerly_have_ids():
    prof = kiln.CompileProfiler()
    g = kiln.compile(_gen, backend=prof)
    x = torch.randn(2)
    assert torch.equal(next(g(x)), x * 2)
    (name, bid, reason), = prof.frames_run_eagerly
    assert name == "_gen" and bid == "K0004"
    assert "_gen: [K0004] " in prof.report()


def test_recompile_limit_is_a_frame_run_eagerly(caplog):
    prof = kiln.CompileProfiler()
    f = kiln.compile(_inner, backend=prof)
    with config.patch(recompile_limit=1), caplog.at_level("WARNING", logger="kiln.recompiles"):
        for n in (2, 3):
            x = torch.randn(n)
            torch.testing.assert_close(f(x), _inner(x))
    assert [bid for _, bid, _ in prof.frames_run_eagerly] == ["K0053"]
    assert "[K0053]" in caplog.text and "recompile_limit" in caplog.text


def _bump_selected(b):
    b.select(0, 2).add_(1)
    return b * 1


def test_real_backend_underneath_and_its_fallbacks():
    """aot_eager compiles the graphs; a graph the autograd stage runs eagerly (a write
    into a tensor whose elements share memory) is listed with its ID."""
    prof = kiln.CompileProfiler(backend="aot_eager")
    f = kiln.compile(_bump_selected, backend=prof)
    b, ref = torch.zeros(1).expand(4), torch.zeros(1).expand(4)
    out = f(b)
    expect = _bump_selected(ref)
    assert torch.equal(out, expect) and torch.equal(b, ref)
    assert prof.graph_count == 1
    assert any(r.startswith("[K0104]") for r in prof.graph_fallbacks())
    assert "Graphs run eagerly: 1" in prof.report()


def test_custom_backend_and_module():
    seen = []

    def backend(gm, example_inputs):
        seen.append(len(example_inputs))
        return gm.forward

    prof = kiln.CompileProfiler(backend=backend)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    cm = kiln.compile(m, backend=prof)
    x = torch.randn(2, 3)
    torch.testing.assert_close(cm(x), m(x))
    assert seen and prof.graph_count == len(seen)
    assert "linear" in prof.report()


def test_exported():
    assert "CompileProfiler" in kiln.__all__ and kiln.CompileProfiler is not None


def test_failing_backend_is_a_frame_run_eagerly(caplog):
    def broken(gm, example_inputs):
        raise RuntimeError("backend cannot")

    prof = kiln.CompileProfiler(backend=broken)
    f = kiln.compile(_inner, backend=prof)
    x = torch.randn(3)
    with config.patch(suppress_errors=True), caplog.at_level("WARNING", logger="kiln"):
        torch.testing.assert_close(f(x), _inner(x))
    (name, bid, reason), = prof.frames_run_eagerly
    assert bid == "K0055" and "backend cannot" in reason
    assert "[K0055]" in caplog.text


def test_backend_failing_at_first_run_warns_with_id(caplog):
    def wrong_at_run(gm, example_inputs):
        def run(*args):
            raise RuntimeError("kernel exploded")
        return run

    f = kiln.compile(_inner, backend=wrong_at_run)
    x = torch.randn(3)
    with config.patch(suppress_errors=True), caplog.at_level("WARNING", logger="kiln"):
        torch.testing.assert_close(f(x), _inner(x))
    assert "[K0055] kiln: backend" in caplog.text and "kernel exploded" in caplog.text
