"""The min-cut partitioner: saved sets are minimal, recomputation is honoured."""
from __future__ import annotations

import logging

import torch
import torch.fx as fx

from kiln.autograd.backend import aot_eager
from kiln.autograd.partition import nbytes, partition
from kiln.autograd.trace import trace_joint
from kiln.autograd.verify import verify_aten_graph


def _part(f, inputs, recompute):
    tr = trace_joint(fx.symbolic_trace(f), inputs, train=True)
    return partition(tr.graph, tr.num_fw_outputs, recompute=recompute)


def test_pointwise_chain_saves_only_the_input():
    def f(x):
        return (torch.exp(torch.cos(torch.sin(x)) * 3).tanh(),)
    x = torch.randn(1000, requires_grad=True)
    p = _part(f, [x], recompute=True)
    assert [n.op for n in p.saved] == ["placeholder"]
    assert p.saved_bytes == 4000
    # Without recomputation every intermediate the backward reads is saved.
    q = _part(f, [x], recompute=False)
    assert q.saved_bytes > 4000 * 3
    # ... and the chain is recomputed in the backward instead.
    assert any(n.target == torch.ops.aten.sin.default for n in p.backward.nodes)


def test_cut_picks_the_smaller_tensor():
    # The backward needs only the float16 copy; saving it (2 bytes/elem) beats
    # saving x (4 bytes/elem) and recomputing the cast.
    def f(x):
        return (x.to(torch.float16).sin().float(),)
    x = torch.randn(1000, requires_grad=True)
    p = _part(f, [x], recompute=True)
    assert len(p.saved) == 1 and p.saved[0].meta["val"].dtype == torch.float16
    assert p.saved_bytes == 2000


def test_reductions_and_matmuls_are_saved_not_recomputed():
    def f(x, w):
        h = x @ w
        return ((h * h.sum(1, keepdim=True)).sin(),)
    x, w = torch.randn(16, 8, requires_grad=True), torch.randn(8, 32, requires_grad=True)
    p = _part(f, [x, w], recompute=True)
    bw_ops = {n.target for n in p.backward.nodes if n.op == "call_function"}
    fw_ops = [n.target for n in p.forward.nodes if n.op == "call_function"]
    assert torch.ops.aten.sum.dim_IntList in fw_ops
    assert fw_ops.count(torch.ops.aten.mm.default) == 1
    # the forward matmul is not recomputed in the backward (2 mms there: grads)
    assert sum(1 for n in p.backward.nodes if n.target == torch.ops.aten.mm.default) == 2
    verify_aten_graph(p.forward)
    verify_aten_graph(p.backward)
    assert bw_ops


def test_min_cut_is_minimal_on_a_diamond():
    # Two branches off one product: saving the inputs (needed for a = x*y's
    # gradients anyway) and recomputing a, b, c is the minimum; without
    # recomputation at least four 400-byte tensors are saved.
    def f(x, y):
        a = x * y
        b = a.sin()
        c = (a + 1).cos()
        return ((b * c).exp(),)
    x, y = torch.randn(100, requires_grad=True), torch.randn(100, requires_grad=True)
    p = _part(f, [x, y], recompute=True)
    # x and y (needed for a's gradients anyway) are enough to recompute everything.
    assert p.saved_bytes == 800
    assert _part(f, [x, y], recompute=False).saved_bytes >= 1600


def test_random_ops_never_recomputed():
    def f(x):
        return (torch.nn.functional.dropout(x.sin(), 0.5, training=True).cos(),)
    x = torch.randn(100, requires_grad=True)
    p = _part(f, [x], recompute=True)
    for n in p.backward.nodes:
        if isinstance(n.target, torch._ops.OpOverload):
            assert torch.Tag.nondeterministic_seeded not in n.target.tags


def test_saved_bytes_nbytes():
    def f(x):
        return (x.sin(),)
    p = _part(f, [torch.randn(10, 10, requires_grad=True)], recompute=True)
    assert sum(nbytes(n) for n in p.saved) == p.saved_bytes == 400


def test_aot_graphs_log(caplog):
    logger = logging.getLogger("kiln.aot_graphs")
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="kiln.aot_graphs"):
            aot_eager(fx.symbolic_trace(lambda x: (x.sin(),)),
                      [torch.randn(3, requires_grad=True)])
    finally:
        logger.setLevel(old)
    text = caplog.text
    assert "forward graph" in text and "backward graph" in text
    assert "torch.ops.aten.sin.default" in text and "torch.ops.aten.cos.default" in text
