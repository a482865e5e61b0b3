"""Capture time of 12-layer transformers (issue 6's goal: under 2 s on a 2-core CPU).

    python -m benchmarks.capture_time

Builds GPT-2 (12 layers, width 768), BERT-base and a 12-layer LLaMA-style model from
transformers configs (random weights), and reports the seconds ``kiln.compile(model,
backend="eager", fullgraph=True)`` spends capturing its first call (bytecode
interpretation, fake-tensor propagation, guards and entry code; the model's own run is
not counted), with graph/break/op counts from ``kiln.explain``.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kiln  # noqa: E402
from kiln.debug import timing  # noqa: E402


def models():
    import transformers as T

    yield "GPT-2 12 layers", lambda: T.GPT2LMHeadModel(T.GPT2Config(n_layer=12))
    yield "BERT-base 12 layers", lambda: T.BertForMaskedLM(T.BertConfig())
    yield "LLaMA-style 12 layers", lambda: T.LlamaForCausalLM(T.LlamaConfig(
        num_hidden_layers=12, hidden_size=768, num_attention_heads=12, num_key_value_heads=12,
        intermediate_size=2048, vocab_size=32000))


def main():
    # warm the process (imports, first-trace initialisation) on something small
    kiln.compile(lambda x: x.sin() + 1, backend="eager")(torch.randn(3))
    print(f"{'model':24s} {'graphs':>6s} {'breaks':>6s} {'ops':>5s} {'capture s':>9s}")
    for name, build in models():
        m = build().eval()
        ids = torch.randint(0, 1000, (1, 32))
        with torch.no_grad():
            ex = kiln.explain(m)(ids)
            kiln.reset()
            timing.clear()
            kiln.compile(m, backend="eager", fullgraph=True)(ids)
        t = timing.totals()["capture (incl. backend)"]
        print(f"{name:24s} {ex.graph_count:6d} {ex.graph_break_count:6d} {ex.op_count:5d} {t:9.2f}")
        kiln.reset()


if __name__ == "__main__":
    main()
