"""A small transformers LLaMA over ten sequence lengths: automatic dynamic shapes
capture at most two graphs (torch.compile's number), and every output matches eager."""
import pytest
import torch

import kiln

transformers = pytest.importorskip("transformers")


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


LENGTHS = [5, 7, 9, 12, 16, 17, 23, 31, 40, 64]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "kiln"])
def test_llama_ten_sequence_lengths_two_graphs(backend):
    model = _model()

    def run(ids):
        return model(input_ids=ids, use_cache=False).logits

    c = kiln.compile(run, backend=backend)
    with kiln.config.patch(suppress_errors=False), torch.no_grad():
        for s in LENGTHS:
            ids = torch.randint(0, 128, (1, s))
            torch.testing.assert_close(c(ids), run(ids), rtol=1e-4, atol=1e-4)
    # one frame (no break, no callee compiled on its own), two entries of one graph each
    assert c.skip is None and not c._callees
    assert [len(e.graphs) for e in c.entries] == [1, 1]
    kiln.reset()


@pytest.mark.slow
def test_llama_graph_computes_every_length():
    """The second graph, run by a backend that runs it as it is, serves every length."""
    model = _model()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    c = kiln.compile(lambda ids: model(input_ids=ids, use_cache=False).logits, backend=counting)
    with kiln.config.patch(suppress_errors=False), torch.no_grad():
        for s in LENGTHS:
            ids = torch.randint(0, 128, (1, s))
            torch.testing.assert_close(c(ids), model(input_ids=ids, use_cache=False).logits,
                                       rtol=1e-4, atol=1e-4)
    assert len(graphs) == 2
    kiln.reset()
