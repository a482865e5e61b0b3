"""The bucket plan and the graph cutting, in one process (no process group): where cuts
go, where they are refused, and that the cut graph computes what the whole one does,
gradients included."""
import pytest
import torch
import torch.nn as nn

import kiln
from kiln.distributed.buckets import Plan, _assign_like_ddp, assign
from kiln.distributed.split import SplitGraph

from . import models


def _capture(module, *args):
    """The graph kiln captures for ``module(*args)`` and its example inputs."""
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    kiln.compile(module._call_impl, backend=backend)(*args)
    assert len(seen) == 1
    return seen[0]


def _ids(module):
    return {id(p) for p in module.parameters()}


@pytest.mark.parametrize("caps", [(4096, 4096), (100, 9000), (1 << 20, 1 << 20)])
def test_assignment_matches_ddp_rule(caps):
    torch.manual_seed(0)
    tensors = [torch.empty(int(n)) for n in torch.randint(1, 3000, (12,))]
    tensors[3] = tensors[3].double()
    limits = [caps[0], caps[1]] if caps[0] < caps[1] else [caps[1]]
    assert assign(tensors, caps) == _assign_like_ddp(tensors, limits)


def test_one_piece_per_bucket_of_a_chain():
    m = models.chain()
    gm, ex = _capture(m, torch.randn(3, models.WIDTH))
    plan = Plan(gm, ex, _ids(m), (4096, 4096))
    assert len(plan.buckets) == 4 and len(plan.cuts) == 3, plan.describe()
    # the first bucket (ready first) holds the last layer's weight
    assert plan.buckets[0] == ["l_self__modules_6__parameters_weight"]
    whole = Plan(gm, ex, _ids(m), (1 << 30, 1 << 30))
    assert len(whole.buckets) == 1 and whole.cuts == []


class _Awkward(nn.Module):
    """A tuple (split) and a no_grad block where bucket boundaries would fall."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = (nn.Linear(16, 16, bias=False) for _ in range(3))

    def forward(self, x):
        h = self.a(x)
        with torch.no_grad():
            s = h.detach() * 0.5
        y = self.b(h)
        return self.c(y + s).tanh()


class _Tuple(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 32, bias=False), nn.Linear(16, 16, bias=False)

    def forward(self, x):
        p, q = torch.split(self.a(x), 16, dim=1)
        return self.b(p) * q


def test_cut_refused_across_a_tuple():
    m = _Tuple()
    gm, ex = _capture(m, torch.randn(2, 16))
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    split_at = next(i for i, n in enumerate(nodes) if n.op == "call_function" and n.target is torch.split)
    from kiln.distributed.split import cut_allowed

    assert "not a tensor" in cut_allowed(nodes, split_at + 1)
    assert cut_allowed(nodes, split_at) is None


def test_cut_refused_inside_no_grad():
    m = _Awkward()
    gm, ex = _capture(m, torch.randn(2, 16))
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    enter = next(i for i, n in enumerate(nodes) if n.target is torch._C._set_grad_enabled)
    from kiln.distributed.split import cut_allowed

    assert cut_allowed(nodes, enter + 1) == "a grad-mode block is open there"


@pytest.mark.parametrize("make,shape", [(_Awkward, (2, 16)), (_Tuple, (2, 16)), (models.Stack, (3, 8))])
def test_cut_graph_computes_the_same(make, shape):
    m = make()
    x = torch.randn(*shape)
    gm, ex = _capture(m, x)
    plan = Plan(gm, ex, _ids(m), (256, 256))
    assert plan.cuts, plan.describe()
    pieces = []

    def backend(g, example_inputs):
        pieces.append(g)
        return kiln.lookup_backend("aot_eager")(g, example_inputs)

    run = SplitGraph(gm, plan.cuts, backend)
    ref = make()
    out, want = run(*ex)[0], ref(x)
    assert len(pieces) == len(plan.cuts) + 1
    assert torch.equal(out, want)
    out.sum().backward()
    want.sum().backward()
    for (name, p), q in zip(ref.named_parameters(), m.parameters()):
        assert torch.equal(p.grad, q.grad), name
