"""KILN_TRACE / kiln.config.trace_dir: artefact files per compile and one index.html."""
import html
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

import kiln
from kiln.debug import logs, trace_dir
from kiln.debug.logs import log_for
from tests.debug import trace_program as prog

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _traced(tmp_path, fn, *args, **kw):
    """Run ``fn`` with the trace on (ended afterwards, so later tests run untraced)."""
    try:
        with kiln.config.patch(trace_dir=str(tmp_path)):
            return fn(*args, **kw)
    finally:
        trace_dir.sync()


def _page(tmp_path) -> str:
    return html.unescape((tmp_path / "index.html").read_text())


def _break_locations():
    first = prog.line_of('print("kiln trace test: first break")')
    second = prog.line_of('print("kiln trace test: second break")')
    return f"{prog.__file__}:{first}", f"{prog.__file__}:{second}"


def test_report_names_breaks_recompile_and_kernels(tmp_path):
    outs = _traced(tmp_path, prog.run, kiln.compile(prog.two_breaks, backend="kiln"))
    for got, want in outs:
        torch.testing.assert_close(got, want)
    page = _page(tmp_path)
    first, second = _break_locations()
    assert first in page and second in page
    assert 'print("kiln trace test: first break")' in page       # the source line
    assert "print() has a side effect" in page                   # the reason
    assert "K0018" in page                                       # its stable break ID
    assert "L['x'].shape[0] was 4, now 8" in page                # the recompile's guard
    assert "L['y'].shape[0] was 4, now 8" in page
    assert 'extern "C" void kiln_seg0' in page                   # a C++ kernel, inline
    assert "cache hits / misses" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page

    data = json.loads((tmp_path / "trace.json").read_text())
    compiles = data["compiles"]
    # f, its two resume functions; then f again (recompile) and its resumes
    assert [c["frame"] for c in compiles].count("two_breaks") == 2
    assert sum(len(c["breaks"]) for c in compiles) == 4
    recompiled = [c for c in compiles if c["recompile"]]
    assert len(recompiled) == 1 and recompiled[0]["frame"] == "two_breaks"
    assert recompiled[0]["index"] == 1
    by_id = {c["id"]: c for c in compiles}
    resumes = [c for c in compiles if c["frame"].startswith("__resume")]
    assert resumes and all(c["parent"] in by_id for c in resumes)
    for c in compiles:
        names = {os.path.basename(a["path"]) for a in c["artefacts"]}
        assert {"graph.py", "guards.txt", "entry.py", "aot_inference.py", "loop_ir.txt",
                "kernels.cpp"} <= names, (c["frame"], names)
        for a in c["artefacts"]:
            assert (tmp_path / a["path"]).is_file()
        assert c["stages"] and c["seconds"] > 0
        assert any("graph cache" in line for line in c["cache"])
    kernels = next(a for a in compiles[0]["artefacts"] if a["path"].endswith("kernels.cpp"))
    source = (tmp_path / kernels["path"]).read_text()
    assert 'extern "C"' in source
    # under the kernel's header, the user line it computes
    line = prog.line_of("a = x.sin() + y")
    assert f"//   {prog.__file__}:{line} in two_breaks: a = x.sin() + y" in source
    for graph in ("graph.py", "aot_inference.py"):     # the graphs name them too
        a = next(a for a in compiles[0]["artefacts"] if a["path"].endswith(graph))
        assert f"{prog.__file__}:{line} in two_breaks: a = x.sin() + y" in \
            (tmp_path / a["path"]).read_text()
    entry = next(a for a in compiles[0]["artefacts"] if a["path"].endswith("entry.py"))
    assert "__resume" in (tmp_path / entry["path"]).read_text()   # the call into the resume
    listing = next(a for a in compiles[0]["artefacts"] if a["path"].endswith(".dis.txt"))
    assert "RESUME" in (tmp_path / listing["path"]).read_text()    # the resume's bytecode
    assert not data["outside"]["artefacts"]


def test_backward_compiled_later_is_filed_under_its_compile(tmp_path):
    def f(w, x):
        return (x @ w).tanh().sum()

    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(4, 3)
    c = kiln.compile(f, backend="kiln")

    def run():
        loss = c(w, x)
        (g,) = torch.autograd.grad(loss, w)
        return loss, g

    loss, g = _traced(tmp_path, run)
    w2 = w.detach().requires_grad_()
    ref = f(w2, x)
    (gref,) = torch.autograd.grad(ref, w2)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(g, gref)
    data = json.loads((tmp_path / "trace.json").read_text())
    (comp,) = data["compiles"]
    names = [os.path.basename(a["path"]) for a in comp["artefacts"]]
    assert "aot_forward.py" in names and "aot_backward.py" in names
    assert names.count("loop_ir.txt") + names.count("loop_ir_2.txt") == 2   # fw and bw kernels
    assert "aot_compile_bw" in comp["stages"]
    assert not data["outside"]["artefacts"]


def test_trace_records_do_not_reach_the_logs_unless_named(tmp_path):
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    h = Keep(level=logging.INFO)
    logging.getLogger("kiln").addHandler(h)
    logs.set_logs("recompiles")
    try:
        _traced(tmp_path, prog.run, kiln.compile(prog.two_breaks, backend="eager"))
    finally:
        logs.set_logs("")
        logging.getLogger("kiln").removeHandler(h)
    names = {r.name for r in seen}
    assert "kiln.recompiles" in names
    assert "kiln.graph" not in names and "kiln.bytecode" not in names
    assert (tmp_path / "index.html").is_file()
    # the trace ended: artefacts are back to their KILN_LOGS levels
    assert not log_for("graph").isEnabledFor(logging.INFO)


def test_no_trace_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert kiln.config.trace_dir == ""
    prog.run(kiln.compile(prog.two_breaks, backend="eager"))
    assert list(tmp_path.iterdir()) == []
    assert trace_dir.current() is None


@pytest.mark.slow
def test_kiln_trace_environment_variable(tmp_path):
    env = dict(os.environ, KILN_TRACE=str(tmp_path / "trace"), PYTHONPATH=ROOT)
    env.pop("KILN_LOGS", None)
    r = subprocess.run([sys.executable, "-m", "tests.debug.trace_program"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "[kiln:" not in r.stderr        # the trace alone prints nothing
    page = _page(tmp_path / "trace")
    # run as a module from ROOT: the program's file is the same one, by its plain path
    # (this process may have imported it through another sys.path entry, "tests/kernels/../..")
    for loc in _break_locations():
        assert os.path.normpath(loc) in page
    assert "L['x'].shape[0] was 4, now 8" in page
    assert 'extern "C" void kiln_seg0' in page


def test_long_frame_names_and_raising_compiles(tmp_path):
    name = "f" + "_very_long_name" * 30
    ns = {}
    exec(f"def {name}(x):\n    y = x + 1\n    print(end='')\n    return y * 2\n", ns)
    fn = ns[name]
    x = torch.randn(3)

    def run():
        torch.testing.assert_close(kiln.compile(fn, backend="eager")(x), fn(x))
        with pytest.raises(kiln.Unsupported):
            kiln.compile(fn, backend="eager", fullgraph=True)(x)

    _traced(tmp_path, run)
    data = json.loads((tmp_path / "trace.json").read_text())
    outcomes = [c["outcome"] for c in data["compiles"]]
    assert outcomes[0] == "compiled (graph break)"
    assert outcomes[-1].startswith("raised Unsupported")
    for c in data["compiles"]:
        for a in c["artefacts"]:
            assert len(os.path.basename(a["path"])) < 80 and (tmp_path / a["path"]).is_file()
    first = {os.path.basename(a["path"]) for a in data["compiles"][0]["artefacts"]}
    assert "graph.py" in first and any(n.endswith(".dis.txt") for n in first), first


def test_recompile_limit_is_a_fallback_of_the_frame(tmp_path):
    def f(x, n):
        return x + n

    c = kiln.compile(f, backend="eager")
    x = torch.randn(2)

    def run():
        with kiln.config.patch(recompile_limit=1):
            c(x, 1)
            torch.testing.assert_close(c(x, 2), f(x, 2))

    _traced(tmp_path, run)
    data = json.loads((tmp_path / "trace.json").read_text())
    (comp,) = data["compiles"]
    assert any("hit recompile_limit (1)" in f for f in comp["fallbacks"])
    page = _page(tmp_path)
    assert "hit recompile_limit (1)" in page and "L['n'] was 1, now 2" in page
