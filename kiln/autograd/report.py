"""``python -m kiln.autograd.report``: bytes saved for backward, kiln vs eager.

Models: torchvision resnet18 (batch 8, 3x224x224) and, if transformers is importable,
a small GPT-2 (2 blocks, width 256, sequence 128, batch 4). GPT-2's full model has
data-dependent Python (mask checks calling ``.item()``) that neither
``torch.fx.symbolic_trace`` nor a meta-tensor trace can follow, so its transformer
blocks + final layer norm are measured (embeddings and LM head left out).
"""
from __future__ import annotations

import torch

from kiln.autograd.lift import lift, lift_whole
from kiln.autograd.saved import format_table, saved_bytes_table


def resnet18_rows():
    import torchvision
    m = torchvision.models.resnet18().train()
    gm, state = lift(m)
    x = torch.randn(8, 3, 224, 224)
    return saved_bytes_table(gm, [*state, x], m, [x])


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


def gpt2_rows():
    m = gpt2_blocks()
    gm, state = lift_whole(m)
    x = torch.randn(4, 128, 256)
    return saved_bytes_table(gm, [*state, x], m, [x])


def main():
    rows = {"resnet18": resnet18_rows()}
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers not importable: GPT-2 skipped")
    else:
        rows["gpt2-blocks"] = gpt2_rows()
    print(format_table(rows))


if __name__ == "__main__":
    main()
