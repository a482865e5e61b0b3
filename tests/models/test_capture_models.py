"""Real models through capture: torchvision resnet18 as one graph (fullgraph=True) in
eval and train mode, and a transformers GPT-2 from a small config, each compared with
eager on fresh inputs — outputs, BatchNorm running stats, gradients."""
import copy

import pytest
import torch

import kiln


def _assert_same_state(a, b):
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb
        torch.testing.assert_close(ta, tb, rtol=0, atol=0, msg=f"state {na}")


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["eval", "train"])
def test_resnet18_fullgraph_matches_eager(train):
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = tv.models.resnet18()
    ref = copy.deepcopy(m)
    m.train(train)
    ref.train(train)
    cnt = []

    def backend(gm, example_inputs):
        cnt.append(gm)
        return gm.forward

    opt = kiln.compile(m, backend=backend, fullgraph=True)
    for _ in range(2):
        x = torch.randn(2, 3, 64, 64)
        out, r = opt(x), ref(x)
        torch.testing.assert_close(out, r, rtol=0, atol=0)
        _assert_same_state(m, ref)
        if train:
            out.sum().backward()
            r.sum().backward()
            for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=n)
    assert len(cnt) == 1  # one graph, reused on the second call


@pytest.mark.slow
def test_resnet18_train_step_through_aot_eager():
    tv = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    m = tv.models.resnet18()
    ref = copy.deepcopy(m)
    opt = kiln.compile(m, backend="aot_eager", fullgraph=True)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    m.double(); ref.double()
    out, r = opt(x), ref(x)
    torch.testing.assert_close(out, r, rtol=1e-7, atol=1e-7)
    out.sum().backward()
    r.sum().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-6, msg=n)
    torch.testing.assert_close(m.bn1.running_mean, ref.bn1.running_mean, rtol=1e-7, atol=1e-7)


def test_gpt2_small_config_runs_correctly():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=128,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    opt = kiln.compile(m, backend="eager", fullgraph=True)
    for _ in range(2):
        ids = torch.randint(0, 128, (2, 16))
        torch.testing.assert_close(opt(ids).logits, m(ids).logits, rtol=0, atol=0)
    ex = kiln.explain(m)(torch.randint(0, 128, (2, 16)))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), str(ex)
