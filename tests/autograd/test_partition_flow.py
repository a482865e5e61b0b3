"""The partitioner's max-flow algorithm (Boykov-Kolmogorov, for speed) picks the same
saved set as networkx's default one (preflow-push) on a transformer block's joint graph."""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx

from kiln.autograd import partition
from kiln.autograd.trace import trace_joint


class Block(torch.nn.Module):
    def __init__(self, h=32):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.attn = torch.nn.MultiheadAttention(h, 4, batch_first=True)
        self.fc, self.proj = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x):
        y = self.ln1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return (x + self.proj(torch.nn.functional.gelu(self.fc(self.ln2(x)))),)


class Blocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)[0]
        return (x.softmax(-1),)


@pytest.mark.parametrize("recompute", [True, False])
def test_same_cut_as_preflow_push(monkeypatch, recompute):
    nx = pytest.importorskip("networkx")
    from networkx.algorithms.flow import preflow_push

    m = Blocks()
    x = torch.randn(2, 8, 32, requires_grad=True)
    tr = trace_joint(fx.symbolic_trace(m), [x], train=True)
    ours = partition.choose_saved(tr.graph, recompute)
    flows = []
    real = nx.minimum_cut

    def with_preflow(g, s, t, **kw):
        flows.append(kw.get("flow_func"))
        kw["flow_func"] = preflow_push
        return real(g, s, t, **kw)

    monkeypatch.setattr(nx, "minimum_cut", with_preflow)
    theirs = partition.choose_saved(tr.graph, recompute)
    assert flows and flows[0] is not None and flows[0] is not preflow_push
    assert [n.name for n in ours] == [n.name for n in theirs]
    assert len(ours) > 1


def _whole_graph_cut(joint, recompute, copied=frozenset()):
    """The cut over the whole joint graph, backward nodes included as vertices: what
    ``choose_saved`` computes with the backward merged into the sink."""
    import networkx as nx
    from networkx.algorithms.flow import boykov_kolmogorov
    out = next(n for n in reversed(joint.nodes) if n.op == "output")
    g = nx.DiGraph()
    for n in joint.nodes:
        if n.op == "output":
            continue
        if partition._is_backward(n):
            g.add_edge(f"{n.name}_in", "sink")
            g.add_edge(f"{n.name}_in", f"{n.name}_out")
        else:
            if n.op in ("placeholder", "get_attr") or not recompute or \
                    not partition.is_recomputable(n.target):
                g.add_edge("source", f"{n.name}_in")
            cap = partition.nbytes(n) + (0 if n.op == "placeholder" else 1) + \
                (2 if n in copied else 0) + partition._store_cost(n, recompute)
            g.add_edge(f"{n.name}_in", f"{n.name}_out",
                       **({} if cap == partition.INF else {"capacity": cap}))
        for u in n.users:
            if u is not out:
                g.add_edge(f"{n.name}_out", f"{u.name}_in")
    _, (reach, _) = nx.minimum_cut(g, "source", "sink", flow_func=boykov_kolmogorov)
    return [n for n in joint.nodes if n.op != "output" and not partition._is_backward(n)
            and f"{n.name}_in" in reach and f"{n.name}_out" not in reach]


class Mixed(torch.nn.Module):
    """Views, a cast, a reduction and a value both outputs and saved: cuts of several
    shapes, some through the forward's inputs."""
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x, w):
        h = self.lin(x).view(4, 2, 16).transpose(0, 1)
        s = (h.half().float() * w).sum(-1, keepdim=True)
        return (torch.tanh(h - s).exp(), s.sin())


@pytest.mark.parametrize("recompute", [True, False])
@pytest.mark.parametrize("model", ["blocks", "mixed"])
def test_backward_merged_into_the_sink_keeps_the_cut(recompute, model):
    pytest.importorskip("networkx")
    if model == "blocks":
        m, xs = Blocks(), [torch.randn(2, 8, 32, requires_grad=True)]
    else:
        m, xs = Mixed(), [torch.randn(8, 16, requires_grad=True),
                          torch.randn(16, requires_grad=True)]
    tr = trace_joint(fx.symbolic_trace(m), xs, train=True)
    ours = partition.choose_saved(tr.graph, recompute)
    assert [n.name for n in ours] == [n.name for n in _whole_graph_cut(tr.graph, recompute)]
    assert ours
    # marking values as copies moves the cut: both ways alike
    copied = frozenset(n for n in ours if n.op != "placeholder")
    ours_c = partition.choose_saved(tr.graph, recompute, copied)
    theirs_c = _whole_graph_cut(tr.graph, recompute, copied)
    assert [n.name for n in ours_c] == [n.name for n in theirs_c]
