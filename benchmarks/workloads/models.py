"""Model workloads: torchvision, transformers (small configs, random weights) and timm.

Each model is one row of ``MODELS`` (how to build it, what it eats, how its loss is
taken); each becomes an inference row and a training-step row per dtype chosen for the
device. Nothing is downloaded: weights are random, seeded, so every backend gets the
same model. Dropout is switched off so training steps are deterministic and gradients
can be compared with eager.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.workloads import Instance, Workload

N_INPUT_SETS = 2


# --- model builders: (profile sizes) -> nn.Module ---------------------------------

def _tv(name):
    def make(sz):
        import torchvision.models as tvm

        kw = {"image_size": sz["px"]} if name.startswith("vit") else {}
        return getattr(tvm, name)(weights=None, **kw)

    return make


def _timm(name):
    def make(sz):
        import timm

        kw = {"img_size": sz["px"]} if name.startswith(("vit", "deit")) else {}
        return timm.create_model(name, pretrained=False, **kw)

    return make


class LMLogits(nn.Module):
    """A causal/masked LM returning its logits tensor (not a ModelOutput)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


class Seq2SeqLogits(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, decoder_input_ids):
        return self.model(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits


def _bert(sz):
    from transformers import BertConfig, BertForMaskedLM

    h = sz["hidden"]
    cfg = BertConfig(vocab_size=sz["vocab"], hidden_size=h, num_hidden_layers=sz["layers"],
                     num_attention_heads=sz["heads"], intermediate_size=4 * h,
                     max_position_embeddings=max(512, sz["seq"]),
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return LMLogits(BertForMaskedLM(cfg))


def _gpt2(sz):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=sz["vocab"], n_positions=max(1024, sz["seq"]), n_embd=sz["hidden"],
                     n_layer=sz["layers"], n_head=sz["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, use_cache=False)
    return LMLogits(GPT2LMHeadModel(cfg))


def _t5(sz):
    from transformers import T5Config, T5ForConditionalGeneration

    h, a = sz["hidden"], sz["heads"]
    cfg = T5Config(vocab_size=sz["vocab"], d_model=h, d_kv=h // a, d_ff=4 * h,
                   num_layers=sz["layers"], num_decoder_layers=sz["layers"], num_heads=a,
                   dropout_rate=0.0, use_cache=False, decoder_start_token_id=0, pad_token_id=0)
    return Seq2SeqLogits(T5ForConditionalGeneration(cfg))


def _llama(sz):
    from transformers import LlamaConfig, LlamaForCausalLM

    h, a = sz["hidden"], sz["heads"]
    cfg = LlamaConfig(vocab_size=sz["vocab"], hidden_size=h, intermediate_size=(8 * h // 3 + 63) // 64 * 64,
                      num_hidden_layers=sz["layers"], num_attention_heads=a,
                      num_key_value_heads=max(1, a // 2), max_position_embeddings=max(2048, sz["seq"]),
                      use_cache=False)
    return LMLogits(LlamaForCausalLM(cfg))


# --- inputs and losses per model kind -------------------------------------------

def _image_inputs(sz, dtype, device, g):
    b, px = sz["batch"], sz["px"]
    x = torch.randn(b, 3, px, px, generator=g).to(device=device, dtype=dtype)
    y = torch.randint(0, 1000, (b,), generator=g).to(device)
    return (x,), y


def _lm_inputs(sz, dtype, device, g):
    ids = torch.randint(0, sz["vocab"], (sz["batch"], sz["seq"]), generator=g).to(device)
    labels = torch.randint(0, sz["vocab"], (sz["batch"], sz["seq"]), generator=g).to(device)
    return (ids,), labels


def _s2s_inputs(sz, dtype, device, g):
    b, s, v = sz["batch"], sz["seq"], sz["vocab"]
    ids = torch.randint(0, v, (b, s), generator=g).to(device)
    dec = torch.randint(0, v, (b, s), generator=g).to(device)
    labels = torch.randint(0, v, (b, s), generator=g).to(device)
    return (ids, dec), labels


@dataclass(frozen=True)
class ModelSpec:
    name: str
    make: Callable          # sizes -> nn.Module
    kind: str               # "image" | "lm" | "s2s": which inputs and sizes
    needs: tuple[str, ...]
    #: training-mode BatchNorm divides by small batch statistics and amplifies rounding
    #: differences: on an H100 with TF32 off, torch.compile's own resnet18 gradients are
    #: 3e-2 (scaled) away from eager's, eager's run-to-run 2e-5. Such models get this
    #: fp32 training tolerance instead of TOL's.
    bn_train_tol: float | None = None


#: how many of MODELS (from the top) run both modes before the rest's inference rows
FULL_FIRST = 4

_INPUTS = {"image": _image_inputs, "lm": _lm_inputs, "s2s": _s2s_inputs}

#: in priority order: under a time budget the later rows are the ones skipped
MODELS = [
    ModelSpec("resnet18", _tv("resnet18"), "image", ("torchvision",), 5e-2),
    ModelSpec("gpt2", _gpt2, "lm", ("transformers",)),
    ModelSpec("bert", _bert, "lm", ("transformers",)),
    ModelSpec("llama", _llama, "lm", ("transformers",)),
    ModelSpec("resnet50", _tv("resnet50"), "image", ("torchvision",), 5e-2),
    ModelSpec("vit_b_16", _tv("vit_b_16"), "image", ("torchvision",)),
    ModelSpec("t5", _t5, "s2s", ("transformers",)),
    ModelSpec("mobilenet_v3_small", _tv("mobilenet_v3_small"), "image", ("torchvision",), 5e-2),
    ModelSpec("timm_convnext_tiny", _timm("convnext_tiny"), "image", ("timm",)),
    ModelSpec("timm_efficientnet_b0", _timm("efficientnet_b0"), "image", ("timm",), 5e-2),
    ModelSpec("timm_vit_small", _timm("vit_small_patch16_224"), "image", ("timm",)),
]

_IMG = {"cuda": dict(batch=16, px=224), "cpu": dict(batch=4, px=64), "cpu-quick": dict(batch=2, px=32)}
_LM = {
    "cuda": dict(batch=8, seq=512, hidden=768, layers=4, heads=12, vocab=32000),
    "cpu": dict(batch=2, seq=64, hidden=128, layers=2, heads=4, vocab=4096),
    "cpu-quick": dict(batch=2, seq=32, hidden=64, layers=2, heads=4, vocab=1024),
}
#: per-model overrides of the image sizes (the brief's resnet18: batch 16 at 128 px)
_IMG_OVERRIDE = {("cuda", "resnet18"): dict(batch=16, px=128)}

F32, BF16 = torch.float32, torch.bfloat16
#: (mode, dtype) rows per model and device profile. On a GPU: bf16 inference and fp32
#: training for every model, plus fp32 inference / bf16 training for two of them.
_ROWS = {
    "cuda": lambda name: ([("infer", BF16), ("train", F32)]
                          + ([("infer", F32)] if name == "resnet50" else [])
                          + ([("train", BF16)] if name == "llama" else [])),
    "cpu": lambda name: [("infer", F32), ("train", F32)],
    # --quick keeps one small training row: the whole quick run stays under 3 minutes
    "cpu-quick": lambda name: [("train", F32)] if name == "gpt2" else [],
}
TOL = {("infer", F32): 1e-4, ("train", F32): 1e-3, ("infer", BF16): 5e-2, ("train", BF16): 1e-1}


def _tol(spec: ModelSpec, mode, dtype) -> float:
    if spec.bn_train_tol is not None and mode == "train" and dtype == F32:
        return spec.bn_train_tol
    return TOL[(mode, dtype)]


def _sizes(profile, spec):
    if spec.kind == "image":
        return dict(_IMG[profile], **_IMG_OVERRIDE.get((profile, spec.name), {}))
    return _LM[profile]


def _no_dropout(model):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0


def _build(spec: ModelSpec, sz, mode, dtype):
    def build(device) -> Instance:
        torch.manual_seed(0)
        with torch.device(device):  # initialise in place: no host-side init and copy
            model = spec.make(sz).to(dtype=dtype)
        _no_dropout(model)
        g = torch.Generator().manual_seed(1)
        sets = [_INPUTS[spec.kind](sz, dtype, device, g) for _ in range(N_INPUT_SETS)]
        if mode == "infer":
            model.eval()
            return Instance(fn=model, inputs=[args for args, _ in sets])
        model.train()

        def forward_and_loss(*args):
            *inputs, target = args
            out = model(*inputs)
            return F.cross_entropy(out.float().flatten(0, -2), target.flatten())

        return Instance(fn=forward_and_loss, inputs=[(*args, y) for args, y in sets], model=model)

    return build


def workloads(device: str, quick: bool, all_dtypes: bool = False) -> list[Workload]:
    profile = "cuda" if device == "cuda" else ("cpu-quick" if quick else "cpu")
    out = []
    for spec in MODELS:
        sz = _sizes(profile, spec)
        rows = _ROWS[profile](spec.name)
        if all_dtypes and not quick:
            rows = [(m, d) for m in ("infer", "train") for d in (F32, BF16)]
        for mode, dtype in rows:
            out.append(Workload(spec.name, "models", mode, dtype, _build(spec, sz, mode, dtype),
                                tol=_tol(spec, mode, dtype), needs=spec.needs))
    # under a time budget: both modes of the first FULL_FIRST models, then the other
    # models' inference (cheap to compile), then their training steps, each in MODELS' order
    first = {spec.name for spec in MODELS[:FULL_FIRST]}
    return sorted(out, key=lambda w: 0 if w.name in first else (1 if w.mode == "infer" else 2))
