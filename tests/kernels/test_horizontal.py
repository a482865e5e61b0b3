"""A pointwise Triton group of independent outputs over few elements is spread over
programs along grid axis 1 (kernels/codegen/triton/horizontal.py); parts that read one
another, or one full-size input, stay together. Values against eager under the Triton
interpreter, in-place updates of inputs included."""
import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import compile_aten_graph
from kiln.kernels.codegen.triton import horizontal
from kiln.kernels.ir import Affine, Const, Load, Op, Pointwise

aten = torch.ops.aten


def _node(name, reads, sizes=(768,)):
    x = Affine((("x0", 1),), 0)
    body = Const(1.0, torch.float32)
    for r in reads:
        load = Load(r, x if not r.startswith("lr") else Affine(), torch.float32)
        body = Op("add", (body, load), torch.float32)
    return Pointwise(name, sizes, (1,), torch.float32, body=body)


def test_parts_join_what_reads_one_another_or_one_input():
    nodes = [_node("m0", ["g0", "lr"]), _node("p0", ["m0", "in_p0", "lr"]),
             _node("m1", ["g1", "lr"]), _node("p1", ["m1", "in_p1", "lr"]),
             _node("q", ["in_p1"])]           # reads p1's input: the same thread must
    names = {n.name for n in nodes}
    parts = horizontal.parts(nodes, names, {"m0", "p0", "m1", "p1", "q"}, (768,))
    assert [[n.name for n in p] for p in parts] == [["m0", "p0"], ["m1", "p1", "q"]]
    chunks = horizontal.chunks(nodes, names, names, 1, (768,))
    assert len(chunks) == 2
    assert horizontal.chunks(nodes, names, names, horizontal.SPREAD_BELOW, (768,)) == [nodes]


@pytest.fixture
def interpret(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(config, "graph_cache", False)


def test_small_independent_updates_spread_and_match_eager(interpret):
    def f(a, b, c, d, lr):
        shared = aten.mul.Tensor(a, 2.0)
        outs = [aten.add.Tensor(aten.mul.Tensor(x, lr), 1.0) for x in (a, b, c, d)]
        return tuple(outs) + (aten.sub.Tensor(shared, b),)
    xs = [torch.randn(768) for _ in range(4)] + [torch.tensor(0.25)]
    cg = compile_aten_graph(fx.symbolic_trace(f), xs, "triton")
    src = str(cg.artefacts["source"])
    assert src.count("if part ==") == 3, src      # {a, b, shared}, c, d
    for _ in range(2):
        for g, w in zip(cg(*xs), f(*xs)):
            torch.testing.assert_close(g, w)


def test_foreach_sgd_step_in_place_matches_eager(interpret, monkeypatch):
    """A compiled foreach SGD-with-momentum step over many small parameters (the
    parameters and buffers written in place) matches eager over three steps."""
    import kiln
    from .plan_spy import record_plans
    monkeypatch.setattr(config, "kernel_target", "triton")
    plans = record_plans(monkeypatch)
    torch.manual_seed(0)
    ps = [torch.randn(96, requires_grad=True) for _ in range(12)]
    qs = [p.detach().clone().requires_grad_() for p in ps]
    opt_a = torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)
    opt_b = torch.optim.SGD(qs, lr=0.1, momentum=0.9, foreach=True)

    @kiln.compile
    def step():
        opt_a.step()
    for i in range(3):
        for p, q in zip(ps, qs):
            p.grad = torch.full_like(p, 0.1 * (i + 1)) + p.detach() * 0.01
            q.grad = p.grad.clone()
        step()
        opt_b.step()
    for p, q in zip(ps, qs):
        torch.testing.assert_close(p, q)
    srcs = [p.source for p in plans if getattr(p, "source", None)]
    assert any("if part ==" in s for s in srcs), srcs
