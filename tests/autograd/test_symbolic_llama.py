"""A small transformers LLaMA training step over five sequence lengths with aot_eager:
one autograd trace after the length becomes dynamic (two in all: the first length's
static graph, then the symbolic one), loss and every parameter's gradient as eager's."""
import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")

LENGTHS = [5, 7, 9, 12, 16]


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).train()


@pytest.mark.slow
def test_llama_training_step_one_autograd_trace_once_dynamic(traces):
    model = _model()

    def step(ids):
        return model(input_ids=ids, labels=ids, use_cache=False).loss

    c = kiln.compile(step, backend="aot_eager")
    params = list(model.parameters())
    try:
        with kiln.config.patch(suppress_errors=False):
            for k, s in enumerate(LENGTHS):
                ids = torch.randint(0, 128, (2, s), generator=torch.Generator().manual_seed(k))
                ref = step(ids)
                ref.backward()
                ref_grads = [p.grad.clone() for p in params]
                model.zero_grad(set_to_none=True)
                got = c(ids)
                got.backward()
                torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)
                for p, r in zip(params, ref_grads):
                    torch.testing.assert_close(p.grad, r, rtol=1e-4, atol=1e-5)
                model.zero_grad(set_to_none=True)
        assert c.skip is None
        graphs = sum(len(e.graphs) for e in c.entries)
        assert traces[0] == graphs == 2, (traces[0], graphs)
    finally:
        kiln.reset()
