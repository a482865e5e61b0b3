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
