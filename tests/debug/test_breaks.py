"""Break IDs: every reason kiln gives up for names a registered ID, every ID is used, the
doc is current, and the ID reaches explain, logs, fullgraph errors and fallback warnings."""
from __future__ import annotations

import ast
import inspect
import logging
import pathlib
import re

import pytest
import torch

import kiln
from kiln.debug import breaks

ROOT = pathlib.Path(__file__).resolve().parents[2]
KILN = ROOT / "kiln"

#: Constructors of a reason, and the position of the ID among their positional
#: arguments (or ``break_id=``); ``Unsupported`` is capture's and the kernels' own
#: (``lowering.Unsupported``: a node left to its aten op).
REASON_CALLS = {"Unsupported": 0, "SkipFrame": 0, "AotUnsupported": 0,
                "EagerGraph": 1, "_eager": 0, "_run_eagerly": 1, "_BreakingFunction": 1}
_ID = re.compile(r"K\d{4}\Z")


def _sources():
    for p in sorted(KILN.rglob("*.py")):
        if p.name != "breaks.py" or p.parent.name != "debug":
            yield p, p.read_text()


def _call_name(node):
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _site_id(node, pos):
    """The ID a reason constructor call gives: a literal, a forwarded value (an
    expression: checked where it was made), or None when missing."""
    for kw in node.keywords:
        if kw.arg == "break_id":
            return kw.value
    if len(node.args) > pos:
        a = node.args[pos]
        if isinstance(a, ast.Constant) and isinstance(a.value, str) and _ID.match(a.value):
            return a.value
        if isinstance(a, (ast.Name, ast.Attribute)) and ast.unparse(a).endswith("break_id"):
            return a                           # a forwarded ID (e.break_id, break_id)
    return None


def _reason_sites():
    for path, src in _sources():
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(src)):
            if not isinstance(node, ast.Call):
                continue
            name = _call_name(node)
            if name not in REASON_CALLS:
                continue
            yield f"{rel}:{node.lineno}", name, _site_id(node, REASON_CALLS[name])


def test_every_reason_names_an_id():
    missing = [f"{where} {name}(...)" for where, name, bid in _reason_sites() if bid is None]
    assert not missing, "reasons without a break ID (add one from kiln/debug/breaks.py):\n" + \
        "\n".join(missing)


def test_ids_used_exist_and_every_id_is_used():
    used = set()
    for _, src in _sources():
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ID.match(node.value):
                used.add(node.value)
    unknown = used - set(breaks.BREAKS)
    assert not unknown, f"IDs used in kiln/ but not in the registry: {sorted(unknown)}"
    live = {k for k, b in breaks.BREAKS.items() if not b.retired}
    unused = live - used
    assert not unused, f"registry IDs no code uses (retire them, never renumber): {sorted(unused)}"


def test_sites_are_counted():
    """The scan sees the raise sites (a scan that finds nothing would pass vacuously)."""
    sites = list(_reason_sites())
    assert len(sites) > 300
    assert sum(1 for *_, bid in sites if isinstance(bid, str)) > 300


def test_registry_well_formed():
    assert all(_ID.match(k) for k in breaks.BREAKS)
    for k, b in breaks.BREAKS.items():
        assert b.title and b.explanation and b.hint, k
        assert "\n" not in b.title + b.hint, k
        assert b.kind in ("graph break", "frame runs eagerly", "graph runs eagerly",
                          "op runs as an aten call"), k


def test_docs_are_current():
    doc = (ROOT / "docs" / "breaks.md").read_text()
    assert doc == breaks.markdown(), "run: python -m kiln.debug.breaks --write"
    for k in breaks.BREAKS:
        assert f"| {k} |" in doc


def test_split_id():
    assert breaks.split_id(("K0006", "why")) == ("K0006", ("why",))
    assert breaks.split_id(("why",)) == (None, ("why",))
    assert breaks.tag("K0006", "why") == "[K0006] why"
    assert breaks.describe("K0006", "why").startswith("[K0006] why\n  hint: ")


# --- the ID where the user sees a reason --------------------------------------------
def _printing(x):
    y = x.sin()
    print("a side effect")
    return y.cos()


def _branching(x):
    y = x.sin()
    if y.sum() > 0:
        y = y + 1
    return y * 2


def test_explain_shows_ids_and_hints(capsys):
    out = kiln.explain(_branching)(torch.randn(4))
    assert [b.break_id for b in out.break_reasons] == ["K0006"]
    text = str(out)
    assert "Reason: [K0006] branching on a tensor's value" in text
    assert f"Hint: {breaks.BREAKS['K0006'].hint}" in text
    out = kiln.explain(_printing)(torch.randn(4))
    assert [b.break_id for b in out.break_reasons] == ["K0018"]


def test_fullgraph_error_shows_id_and_hint():
    with pytest.raises(kiln.Unsupported) as ei:
        kiln.compile(_branching, backend="eager", fullgraph=True)(torch.randn(4))
    assert ei.value.break_id == "K0006"
    msg = str(ei.value)
    assert msg.startswith("[K0006] ")
    assert breaks.BREAKS["K0006"].hint in msg
    line = inspect.getsource(_branching).splitlines()[2].strip()
    assert line in msg                        # the user's line is still named


def test_graph_break_log_shows_id(caplog):
    log = logging.getLogger("kiln.graph_breaks")
    old = log.level
    log.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="kiln.graph_breaks"):
            x = torch.randn(4)
            assert torch.equal(kiln.compile(_printing, backend="eager")(x), _printing(x))
    finally:
        log.setLevel(old)
    assert any("[K0018] print()" in r.getMessage() for r in caplog.records), caplog.text


def _gen(x):
    yield x + 1


def test_skipped_frame_shows_id():
    f = kiln.compile(_gen, backend="eager")
    list(f(torch.randn(2)))
    assert f.skip.startswith("[K0004] ")


def test_skip_frame_fullgraph_error_has_id():
    with pytest.raises(kiln.Unsupported) as ei:
        kiln.compile(_gen, backend="eager", fullgraph=True)(torch.randn(2))
    assert ei.value.break_id == "K0004"


class _Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _plain(x):
    return x * 2 + 1


def test_global_state_fallback_has_id():
    with _Mode(), pytest.raises(kiln.Unsupported) as ei:
        kiln.compile(_plain, backend="eager", fullgraph=True)(torch.randn(2))
    assert ei.value.break_id == "K0050" and "TorchFunctionMode" in str(ei.value)


def _bump_selected(b):
    b.select(0, 2).add_(1)
    return b


def test_autograd_fallback_warning_has_id(caplog):
    """A write into a tensor whose elements share memory: the autograd stage runs the
    graph eagerly (eager's result), naming K0104 and its hint."""
    from kiln.autograd.backend import aot_eager

    gm = torch.fx.symbolic_trace(_bump_selected)
    fn = aot_eager(gm, [torch.zeros(1).expand(4)])
    b = torch.zeros(1).expand(4)
    with caplog.at_level(logging.WARNING, logger="kiln.fallbacks"):
        out, = fn(b)
    assert torch.equal(b, torch.ones(4)) and out is b
    assert fn.eager_calls == 1 and fn.eager_reasons[0].startswith("[K0104] ")
    assert any("[K0104]" in r.getMessage() and breaks.BREAKS["K0104"].hint in r.getMessage()
               for r in caplog.records), caplog.text


def test_autograd_aot_unsupported_carries_id():
    from kiln.autograd.functionalize import AotUnsupported

    e = AotUnsupported("K0104", "why")
    assert e.break_id == "K0104" and str(e) == "why"


def test_eager_graph_carries_id():
    from kiln.kernels.compile import EagerGraph

    gm = torch.fx.symbolic_trace(_plain)
    g = EagerGraph(gm, "K0201", "boom")
    assert g.break_id == "K0201"
    x = torch.randn(3)
    assert torch.equal(g(x), _plain(x))


def test_kernel_op_fallback_has_id():
    """An aten op the kernel compiler has no lowering for is left to aten, tagged K0204;
    one whose lowering declines these arguments carries the lowering's ID."""
    from kiln.kernels.lowering import GraphLowering

    aten = torch.ops.aten

    class M(torch.nn.Module):
        def forward(self, x, i):
            return (aten.cumprod.default(x, 0), aten.sin.default(x) + 1,
                    aten.index_select.default(aten.sin.default(i), 0, torch.tensor([0])))

    gm = torch.fx.symbolic_trace(M())
    lo = GraphLowering(gm, [torch.randn(5), torch.tensor(2.0)], "cpp").run()
    msgs = dict(lo.fallback_messages)
    assert msgs["aten.cumprod.default"] == "[K0204] no lowering"
    assert msgs["aten.index_select.default"].startswith("[K0205] lowering declined: ")
    assert not any("sin" in op for op in msgs)


def _double(x):
    return x * 2


def test_sparse_input_runs_eagerly_with_id():
    prof = kiln.CompileProfiler()
    f = kiln.compile(_double, backend=prof)
    x = torch.randn(3).to_sparse()
    assert torch.equal(f(x).to_dense(), _double(x).to_dense())
    (name, bid, reason), = prof.frames_run_eagerly
    assert bid == "K0056" and "sparse" in reason
