"""Real models through aot_eager: torchvision resnet18 training step."""
from __future__ import annotations

import pytest
import torch

from kiln.autograd.backend import aot_eager
from kiln.autograd.verify import verify_aten_graph
from tests.autograd.helpers import compare_module

torchvision = pytest.importorskip("torchvision")


@pytest.mark.slow
def test_resnet18_training_step():
    torch.manual_seed(0)
    # float64: with batch statistics over a batch of 2, float32 gradients of resnet18
    # differ from float64 ones by O(10) in eager itself, so compare where the
    # arithmetic allows a tight tolerance.
    m = torchvision.models.resnet18(num_classes=10).train().double()
    fn = compare_module(m, [torch.randn(2, 3, 64, 64, dtype=torch.float64)], aot_eager,
                        rtol=1e-7, atol=1e-8)
    for entry in fn._training.values():
        verify_aten_graph(entry.fw_module, fn.ops)
        verify_aten_graph(entry.bw_module, fn.ops)


def test_gpt2_blocks_training_step():
    pytest.importorskip("transformers")
    from kiln.autograd.lift import lift_whole
    from kiln.autograd.report import gpt2_blocks
    from tests.autograd.helpers import assert_close, clone_inputs, grads_of
    torch.manual_seed(0)
    m = gpt2_blocks(n_layer=2, n_embd=32, n_head=4).double()
    gm, state = lift_whole(m)
    x = torch.randn(2, 8, 32, dtype=torch.float64, requires_grad=True)
    (xa,), (xb,) = clone_inputs([x]), clone_inputs([x])
    fn = aot_eager(gm, [*state, xa])
    out, = fn(*state, xa)
    ref = m(xb)
    assert_close(out, ref, rtol=1e-7, atol=1e-8)
    for a, b in zip(grads_of([out], [*state, xa]), grads_of([ref], [*m.parameters(), xb])):
        assert_close(a, b, rtol=1e-7, atol=1e-8)
    for entry in fn._training.values():
        verify_aten_graph(entry.fw_module, fn.ops)
        verify_aten_graph(entry.bw_module, fn.ops)


def test_gpt2_lm_head_model_through_capture_and_aot_eager():
    # The full GPT2LMHeadModel (embeddings, blocks with whole attention, tied LM head)
    # through kiln.compile(backend="aot_eager"): logits, loss, every parameter's grad.
    pytest.importorskip("transformers")
    import copy

    import kiln
    from kiln.autograd.report import _lm_loss, gpt2_lm
    torch.manual_seed(0)
    m = gpt2_lm(n_layer=2, n_embd=32, n_head=4, vocab=64).double()
    ref = copy.deepcopy(m)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(aot_eager(gm, example_inputs))
        return graphs[-1]
    opt = kiln.compile(m, backend=backend)
    ids = torch.randint(0, 64, (2, 16))
    loss, r = _lm_loss(opt, ids), _lm_loss(ref, ids)
    torch.testing.assert_close(loss, r, rtol=1e-9, atol=1e-10)
    loss.backward()
    r.backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-7, atol=1e-9, msg=n)
    assert graphs and any(
        n.target in (torch.ops.kiln.sdpa.default, torch.ops.kiln.sdpa_fused.default)
        for f in graphs for e in f._training.values() for n in e.fw_module.graph.nodes)
