"""``python -m kiln.autograd.report``: bytes saved for backward, kiln vs eager.

Each model's training step (forward + loss) runs once eagerly and once through
``kiln.compile`` (capture, then the autograd stage), after a warm-up call that
compiles. Both figures are taken the same way (``saved.eager_saved_bytes``): every
tensor packed for backward while the step runs — by eager ops, by kiln's compiled
``autograd.Function`` (what the min-cut partitioner chose) and by any eager code
between graphs — each storage once; "activations" leaves out the model's parameters
and buffers and the user inputs (alive anyway).

Models: torchvision resnet18 (batch 8, 3x224x224) and a transformers ``GPT2LMHeadModel``
from a small config (2 layers, width 256, 4 heads, sequence 128, batch 4; next-token
cross-entropy on the logits, computed outside the model), each with dropout off (so
eager and kiln draw nothing random and compute the same thing) and, for GPT-2, also with
its default dropout 0.1. Rows: kiln with ``backend="aot_eager"`` (the "eager" op set)
and with the "core" op set the kernel compiler gets
(``aot_compile(decompositions="core")``).
"""
from __future__ import annotations

import copy

import torch

from kiln.autograd.saved import eager_saved_bytes


def _backends():
    from kiln.autograd import aot_compile
    return {
        "kiln aot_eager": "aot_eager",
        "kiln core ops": lambda gm, ex: aot_compile(gm, ex, decompositions="core"),
    }


def _counted(backend, graphs):
    from kiln.backends import lookup_backend
    inner = lookup_backend(backend)

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)
    return counting


def measure(model: torch.nn.Module, make_inputs, loss) -> dict:
    """{who: (total, activations, graphs)} for one training step of ``model``:
    ``loss(model, *make_inputs())`` must return a scalar tensor."""
    import kiln
    torch.manual_seed(0)
    inputs = make_inputs()
    held = lambda m: [*m.parameters(), *m.buffers(), *inputs]  # noqa: E731
    rows = {}
    ref = copy.deepcopy(model)
    total, act = eager_saved_bytes(lambda *a: loss(ref, *a), *inputs, inputs=held(ref))
    rows["eager"] = (total, act, 0)
    for who, backend in _backends().items():
        kiln.reset()
        m = copy.deepcopy(model)
        graphs = []
        compiled = kiln.compile(m, backend=_counted(backend, graphs))
        loss(compiled, *inputs).backward()            # warm-up: compile
        total, act = eager_saved_bytes(lambda *a: loss(compiled, *a), *inputs,
                                       inputs=held(m))
        rows[who] = (total, act, len(graphs))
    return rows


def resnet18_rows():
    import torchvision
    m = torchvision.models.resnet18().train()
    return measure(m, lambda: [torch.randn(8, 3, 224, 224)], lambda m, x: m(x).sum())


def gpt2_lm(n_layer=2, n_embd=256, n_head=4, dropout=0.0, vocab=512):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab,
                     n_positions=256, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=dropout, attn_pdrop=dropout, embd_pdrop=dropout)
    return GPT2LMHeadModel(cfg).train()


def _lm_loss(m, ids):
    # The next-token loss outside the model: with ``labels=`` transformers' loss path
    # calls ``logger.warning_once`` (an lru_cache, implemented in C), a graph break
    # inside an inlined call that makes capture run the whole forward eagerly.
    logits = m(input_ids=ids).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                             ids[:, 1:].flatten())


def gpt2_rows(dropout=0.0):
    m = gpt2_lm(dropout=dropout)
    return measure(m, lambda: [torch.randint(0, 512, (4, 128))], _lm_loss)


# --- the transformer blocks alone, for tests (lift_whole-able, no capture) ---------

class _GPT2Blocks(torch.nn.Module):
    def __init__(self, transformer):
        super().__init__()
        self.h, self.ln_f = transformer.h, transformer.ln_f

    def forward(self, x):
        for block in self.h:
            x = block(x)
            x = x[0] if isinstance(x, tuple) else x
        return self.ln_f(x)


def gpt2_blocks(n_layer=2, n_embd=256, n_head=4, dropout=0.0):
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=512,
                     n_positions=256, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=dropout, attn_pdrop=dropout, embd_pdrop=dropout)
    return _GPT2Blocks(GPT2Model(cfg).train())


def format_rows(rows: dict[str, dict]) -> str:
    lines = [f"{'model':<22} {'who':<16} {'total MiB':>10} {'activations MiB':>16} "
             f"{'graphs':>7}"]
    for model, table in rows.items():
        for who, (total, act, graphs) in table.items():
            lines.append(f"{model:<22} {who:<16} {total / 2**20:10.2f} {act / 2**20:16.2f} "
                         f"{graphs if who != 'eager' else '':>7}")
    return "\n".join(lines)


def main():
    from kiln import config
    config.suppress_errors = False      # a failed compile must not pass for eager
    rows = {"resnet18 b8 224px": resnet18_rows()}
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers not importable: GPT-2 skipped")
    else:
        rows["gpt2-lm b4 s128"] = gpt2_rows(0.0)
        rows["gpt2-lm dropout 0.1"] = gpt2_rows(0.1)
    print(format_rows(rows))


if __name__ == "__main__":
    main()
