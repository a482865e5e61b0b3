"""The model zoo of issue 6: real models built from configs with random weights.

``REGISTRY`` lists ``ModelSpec``s (name, family, builder, input maker).  ``check_model``
compiles one with ``kiln.compile(model, backend=..., fullgraph=...)`` and compares it
with eager on identically seeded deep copies:

* eval: two calls on fresh inputs under ``torch.no_grad()`` (the second must reuse the
  graph), outputs compared;
* train: one training step (forward, a fixed random projection of every floating output
  as the loss, backward), comparing the loss, every parameter's gradient and every
  buffer afterwards (BatchNorm running statistics, ``num_batches_tracked``).

On the eager backend (the captured graph run as it is) models run in float32 and must
match bit for bit; on aot_eager they run in float64, so that its decompositions
(different reduction orders) can be held to tight normwise tolerances (``rtol``/``atol``
per spec, loosened only with a stated reason).  Dropout, drop-path and stochastic depth
are set to p=0 (the training step is compared without randomness).  Sizes are small (batch 2, 32-64 px images, 2-layer transformers
of width 64) so that the whole zoo runs on two CPU cores in minutes; where a torchvision
family's smallest member is large, the family's own class is built from a reduced
config (same code, fewer/narrower layers), as the notes say.

``tests/models/test_zoo.py`` runs every entry on both backends;
``python -m tests.models.zoo_table`` prints the markdown table of issue 6.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import operator
import time
from typing import Callable

import torch
import torch.nn as nn

import kiln
from kiln.backends import lookup_backend

BATCH = 2


@dataclasses.dataclass
class ModelSpec:
    name: str
    family: str  # torchvision | timm | transformers
    build: Callable[[], nn.Module]
    inputs: Callable[[int], tuple]  # call index -> (args tuple, kwargs dict)
    xfail: str | None = None  # expected failure today, with its reason
    note: str = ""
    rtol: float = 1e-9  # aot_eager tolerances (float64, normwise); the eager backend must be exact
    atol: float = 1e-10
    #: On a backend that generates its own kernels (``kiln``): the normwise rtol for a model
    #: that computes part of its work in float32 on purpose even when run in float64
    #: (a "float32 island": rotary tables, RMS variance, Fourier features). There, float32
    #: sin/cos/exp and float32 reduction orders may differ from eager's by an ulp (eager's
    #: Sleef/MKL float32 sin and cos are not correctly rounded; kiln's are closer), which
    #: the rest of the model carries to the output. None: ``rtol`` on every backend.
    kernel_rtol: float | None = None
    train: bool = True  # also compare a training step
    eval_graphs: int = 1  # graphs after the two eval calls (2: a cache filled by the first call)


REGISTRY: list[ModelSpec] = []


def _add(name, family, build, inputs, **kw):
    REGISTRY.append(ModelSpec(name, family, build, inputs, **kw))


def _images(h=64, w=None, c=3):
    def make(i):
        g = torch.Generator().manual_seed(100 + i)
        return (torch.randn(BATCH, c, h, w or h, generator=g, dtype=torch.float64),), {}
    return make


def _tokens(vocab=128, seq=8, mask=True, extra=None):
    def make(i):
        g = torch.Generator().manual_seed(200 + i)
        kw = {"input_ids": torch.randint(0, vocab, (BATCH, seq), generator=g)}
        if mask:
            m = torch.ones(BATCH, seq, dtype=torch.long)
            m[1, seq - 2:] = 0  # padding in the second row
            kw["attention_mask"] = m
        if extra:
            kw.update(extra(g))
        return (), kw
    return make


# --------------------------------------------------------------------------- torchvision

def _tv(fn_name, **kw):
    def build():
        import torchvision.models as M
        return getattr(M, fn_name)(num_classes=10, **kw)
    return build


def _small_classifier(model, attr="classifier"):
    """Replace the 4096-wide Linear layers of a classifier (alexnet, vgg) by 64-wide ones:
    same module structure and forward code, 100x fewer parameters."""
    seq = getattr(model, attr)
    linears = [i for i, m in enumerate(seq) if isinstance(m, nn.Linear)]
    for j, i in enumerate(linears):
        old = seq[i]
        in_f = old.in_features if j == 0 else 64
        out_f = old.out_features if j == len(linears) - 1 else 64
        seq[i] = nn.Linear(in_f, out_f)
    return model


def _tv_alexnet():
    import torchvision.models as M
    return _small_classifier(M.alexnet(num_classes=10))


def _tv_vgg():
    import torchvision.models as M
    return _small_classifier(M.vgg11_bn(num_classes=10))


def _tv_resnet(**kw):
    def build():
        from torchvision.models.resnet import Bottleneck, ResNet
        return ResNet(Bottleneck, [1, 1, 1, 1], num_classes=10, **kw)
    return build


def _tv_densenet():
    from torchvision.models import DenseNet
    return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, num_classes=10)


def _tv_mnasnet():
    from torchvision.models.mnasnet import MNASNet
    return MNASNet(0.25, num_classes=10)


def _tv_efficientnet_b0():
    # float64 depthwise convolutions run one channel at a time on CPU: fewer channels
    from torchvision.models.efficientnet import EfficientNet, _efficientnet_conf
    setting, last = _efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.5)
    return EfficientNet(setting, dropout=0.2, num_classes=10, last_channel=last)


def _tv_efficientnet_v2():
    from torchvision.models.efficientnet import EfficientNet, FusedMBConvConfig, MBConvConfig
    setting = [FusedMBConvConfig(1, 3, 1, 16, 16, 1), FusedMBConvConfig(4, 3, 2, 16, 24, 2),
               MBConvConfig(4, 3, 2, 24, 32, 2), MBConvConfig(6, 3, 1, 32, 40, 2)]
    return EfficientNet(setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=10, last_channel=128)


def _tv_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    setting = [CNBlockConfig(16, 32, 2), CNBlockConfig(32, 64, 2), CNBlockConfig(64, None, 2)]
    return ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=10)


def _tv_vit():
    from torchvision.models import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64,
                             mlp_dim=128, num_classes=10)


def _tv_swin(v2=False):
    from torchvision.models import swin_transformer as S
    kw = dict(block=S.SwinTransformerBlockV2, downsample_layer=S.PatchMergingV2) if v2 else {}
    return S.SwinTransformer(patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                             window_size=[4, 4], stochastic_depth_prob=0.0, num_classes=10, **kw)


def _tv_maxvit():
    from torchvision.models import MaxVit
    return MaxVit(input_size=(64, 64), stem_channels=16, partition_size=2, block_channels=[32, 64],
                  block_layers=[1, 1], head_dim=16, stochastic_depth_prob=0.0, num_classes=10)


def _tv_regnet():
    from torchvision.models.regnet import BlockParams, RegNet
    params = BlockParams.from_init_params(depth=4, w_0=24, w_a=24.48, w_m=2.54, group_width=8, se_ratio=0.25)
    return RegNet(params, num_classes=10)


_TORCHVISION = [
    ("alexnet", _tv_alexnet, _images(64), "classifier 64 wide"),
    ("vgg11_bn", _tv_vgg, _images(32), "classifier 64 wide"),
    ("resnet18", _tv("resnet18"), _images(64), ""),
    ("resnext", _tv_resnet(groups=32, width_per_group=4), _images(64), "ResNeXt(Bottleneck 1-1-1-1, 32x4d)"),
    ("wide_resnet", _tv_resnet(width_per_group=128), _images(64), "wide ResNet(Bottleneck 1-1-1-1, width x2)"),
    ("squeezenet1_1", _tv("squeezenet1_1"), _images(64), ""),
    ("densenet", _tv_densenet, _images(32), "DenseNet(growth 8, blocks 2-2-2-2)"),
    ("inception_v3", _tv("inception_v3", aux_logits=False, init_weights=False), _images(75),
     "aux logits off (they need 299 px)"),
    ("googlenet", _tv("googlenet", aux_logits=True, init_weights=False), _images(64), "aux logits on"),
    ("mobilenet_v2", _tv("mobilenet_v2", width_mult=0.25), _images(64), "width 0.25"),
    ("mobilenet_v3_small", _tv("mobilenet_v3_small", width_mult=0.5), _images(64), "width 0.5"),
    ("mnasnet", _tv_mnasnet, _images(64), "MNASNet(alpha 0.25)"),
    ("shufflenet_v2_x0_5", _tv("shufflenet_v2_x0_5"), _images(64), ""),
    ("efficientnet_b0", _tv_efficientnet_b0, _images(64), "b0 at width 0.25, depth 0.5"),
    ("efficientnet_v2", _tv_efficientnet_v2, _images(64), "EfficientNet(4 stages, fused+MBConv)"),
    ("regnet", _tv_regnet, _images(64), "RegNet(depth 4, SE)"),
    ("convnext", _tv_convnext, _images(64), "ConvNeXt(3 stages, 16-64 wide)"),
    ("vit", _tv_vit, _images(32), "ViT(2 layers, hidden 64, patch 8)"),
    ("swin", _tv_swin, _images(64), "Swin(depths 2-2, window 4)"),
    ("swin_v2", functools.partial(_tv_swin, True), _images(64), "SwinV2(depths 2-2, window 4)"),
    ("maxvit", _tv_maxvit, _images(64), "MaxVit(2 stages, partition 2)"),
]
for _name, _build, _inp, _note in _TORCHVISION:
    _add(f"tv.{_name}", "torchvision", _build, _inp, note=_note)
# eager's CPU hardsigmoid_backward multiplies by 1.0f/6.0f, a float32 constant, even in
# float64: aot_eager's decomposition (exact 1/6) differs from it by ~3e-8 relative.
_HARDSIGMOID = dict(rtol=1e-7, note="rtol 1e-7: eager's float64 hardsigmoid_backward uses a float32 1/6")


# --------------------------------------------------------------------------- timm

def _timm(name, cls=None, **kw):
    """``timm.create_model(name)``, or the model class ``cls`` ("module.Class" under
    timm.models) built directly from a small config."""
    def build():
        import importlib

        import timm
        if cls is not None:
            mod, _, klass = cls.rpartition(".")
            return getattr(importlib.import_module(f"timm.models.{mod}"), klass)(num_classes=10, **kw)
        return timm.create_model(name, pretrained=False, num_classes=10, **kw)
    return build


_TIMM = [
    ("resnet10t", {}, _images(64), ""),
    ("efficientnet_b0", {}, _images(64), ""),
    ("mobilenetv3_small_050", {}, _images(64), ""),
    ("convnext_atto", {}, _images(64), ""),
    ("regnetx_002", {}, _images(64), ""),
    ("densenet121", dict(growth_rate=8, block_config=(2, 2, 2, 2)), _images(64), "growth 8, blocks 2-2-2-2"),
    ("ghostnet_050", {}, _images(64), ""),
    ("rexnet_100", {}, _images(64), ""),
    ("lcnet_050", {}, _images(64), ""),
    ("vit_tiny_patch16_224", dict(img_size=32, patch_size=8, depth=2), _images(32), "depth 2, 32 px"),
    ("deit_tiny_distilled_patch16_224", dict(img_size=32, patch_size=8, depth=2), _images(32), "depth 2, 32 px"),
    ("swin_tiny_patch4_window7_224", dict(img_size=64, window_size=4, depths=(2, 2), num_heads=(2, 4), embed_dim=32),
     _images(64), "depths 2-2, window 4"),
    ("beit_base_patch16_224", dict(img_size=32, patch_size=8, depth=2, embed_dim=64, num_heads=2),
     _images(32), "depth 2, width 64"),
    ("levit_128s", dict(img_size=64), _images(64), "64 px"),
    ("mlp_mixer", dict(cls="mlp_mixer.MlpMixer", img_size=64, patch_size=16, num_blocks=2, embed_dim=128),
     _images(64), "MlpMixer(2 blocks, width 128, 64 px)"),
    ("poolformer_s12", {}, _images(64), ""),
    ("coatnet_nano_rw_224", dict(img_size=64), _images(64), ""),
    ("mobilevit_xxs", {}, _images(64), ""),
    ("efficientformerv2_s0", dict(img_size=64), _images(64), "64 px"),
    ("res2net50_26w_4s", dict(layers=(1, 1, 1, 1)), _images(64), "layers 1-1-1-1"),
    ("skresnet18", {}, _images(64), ""),
    ("nf_resnet26", {}, _images(64), ""),
    ("xcit_nano_12_p16_224", dict(img_size=64, depth=2), _images(64), "depth 2, 64 px"),
    ("edgenext_xx_small", {}, _images(64), ""),
    ("cait_xxs24_224", dict(img_size=32, patch_size=8, depth=2), _images(32), "depth 2"),
]
for _name, _kw, _inp, _note in _TIMM:
    _add(f"timm.{_name}", "timm", _timm(_name, **_kw), _inp, note=_note)


# --------------------------------------------------------------------------- transformers

_VOCAB = 128


def _hf(cls_name, cfg_name, **cfg):
    def build():
        import transformers
        config = getattr(transformers, cfg_name)(**cfg)
        return getattr(transformers, cls_name)(config)
    return build


_ENC = dict(vocab_size=_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=128, max_position_embeddings=64)
_DEC_LLAMA = dict(vocab_size=_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, intermediate_size=128, max_position_embeddings=64,
                  use_cache=False)


def _decoder_ids(g):
    return {"decoder_input_ids": torch.randint(0, _VOCAB, (BATCH, 6), generator=g)}


def _whisper_inputs(i):
    g = torch.Generator().manual_seed(300 + i)
    return (), {"input_features": torch.randn(BATCH, 16, 32, generator=g, dtype=torch.float64),
                "decoder_input_ids": torch.randint(0, _VOCAB, (BATCH, 6), generator=g)}


_TRANSFORMERS = [
    ("bert", "BertModel", "BertConfig", dict(_ENC), _tokens()),
    ("roberta", "RobertaModel", "RobertaConfig", dict(_ENC, pad_token_id=1), _tokens()),
    ("distilbert", "DistilBertModel", "DistilBertConfig",
     dict(vocab_size=_VOCAB, dim=64, n_layers=2, n_heads=2, hidden_dim=128, max_position_embeddings=64), _tokens()),
    ("albert", "AlbertModel", "AlbertConfig", dict(_ENC, embedding_size=32), _tokens()),
    ("electra", "ElectraModel", "ElectraConfig", dict(_ENC, embedding_size=32), _tokens()),
    ("deberta_v2", "DebertaV2Model", "DebertaV2Config", dict(_ENC), _tokens()),
    ("gpt2", "GPT2LMHeadModel", "GPT2Config",
     dict(vocab_size=_VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=64, use_cache=False,
          bos_token_id=0, eos_token_id=0), _tokens()),
    ("gpt_neo", "GPTNeoForCausalLM", "GPTNeoConfig",
     dict(vocab_size=_VOCAB, hidden_size=64, num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]],
          window_size=4, max_position_embeddings=64, use_cache=False), _tokens()),
    ("opt", "OPTForCausalLM", "OPTConfig",
     dict(vocab_size=_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, ffn_dim=128,
          word_embed_proj_dim=64, max_position_embeddings=64, use_cache=False), _tokens()),
    ("bart", "BartModel", "BartConfig",
     dict(vocab_size=_VOCAB, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
          decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
          use_cache=False), _tokens(extra=_decoder_ids)),
    ("t5", "T5Model", "T5Config",
     dict(vocab_size=_VOCAB, d_model=64, d_kv=32, d_ff=128, num_layers=2, num_heads=2, use_cache=False),
     _tokens(extra=_decoder_ids)),
    ("llama", "LlamaForCausalLM", "LlamaConfig", dict(_DEC_LLAMA), _tokens()),
    ("mistral", "MistralForCausalLM", "MistralConfig", dict(_DEC_LLAMA, sliding_window=4), _tokens()),
    ("qwen2", "Qwen2ForCausalLM", "Qwen2Config", dict(_DEC_LLAMA), _tokens()),
    ("phi", "PhiForCausalLM", "PhiConfig", dict(_DEC_LLAMA), _tokens()),
    ("gemma", "GemmaForCausalLM", "GemmaConfig", dict(_DEC_LLAMA, head_dim=32), _tokens()),
    ("bloom", "BloomForCausalLM", "BloomConfig",
     dict(vocab_size=_VOCAB, hidden_size=64, n_layer=2, n_head=2, use_cache=False), _tokens()),
    ("gptj", "GPTJForCausalLM", "GPTJConfig",
     dict(vocab_size=_VOCAB, n_embd=64, n_layer=2, n_head=2, rotary_dim=16, n_positions=64, use_cache=False),
     _tokens()),
    ("whisper", "WhisperModel", "WhisperConfig",
     dict(vocab_size=_VOCAB, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
          encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=128, decoder_ffn_dim=128,
          max_source_positions=16, max_target_positions=32, use_cache=False, pad_token_id=0,
          decoder_start_token_id=1), _whisper_inputs),
    ("vit", "ViTModel", "ViTConfig",
     dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, image_size=32,
          patch_size=8), lambda i: ((), {"pixel_values": _images(32)(i)[0][0]})),
    ("clip_text", "CLIPTextModel", "CLIPTextConfig",
     dict(vocab_size=_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
          max_position_embeddings=64, bos_token_id=0, eos_token_id=2), _tokens()),
    ("mobilebert", "MobileBertModel", "MobileBertConfig",
     dict(_ENC, embedding_size=32, intra_bottleneck_size=32, num_feedforward_networks=2), _tokens()),
]
for _name, _cls, _cfg, _kw, _inp in _TRANSFORMERS:
    _add(f"hf.{_name}", "transformers", _hf(_cls, _cfg, **_kw), _inp)


# Per-model adjustments: tolerances (with the reason) and expected failures.
# LeViT-style attention keeps ``attention_bias_cache``, a dict filled on the first eval
# call: the second call finds the cached tensor and compiles once more (guarded on the
# dict's keys); every later call reuses that graph.
_BIAS_CACHE = dict(eval_graphs=2, note="eval recompiles once: attention-bias cache filled by the first call")
# float32 islands (see ModelSpec.kernel_rtol): 2e-6 normwise is about 16 float32 ulps; the
# worst measured (2026-11-24, python -m benchmarks.zoo_kiln) was 3.2e-7 (a gradient).
def _island(what):
    return dict(kernel_rtol=2e-6, note=f"kiln: rtol 2e-6, {what} computed in float32")


_TWEAKS = {
    "hf.llama": _island("rotary cos/sin and RMS variance"),
    "hf.mistral": _island("rotary cos/sin and RMS variance"),
    "hf.qwen2": _island("rotary cos/sin and RMS variance"),
    "hf.gemma": _island("rotary cos/sin and RMS variance"),
    "hf.phi": _island("rotary cos/sin"),
    "hf.t5": _island("RMS variance"),
    "timm.xcit_nano_12_p16_224": _island("Fourier positional features"),
    "timm.edgenext_xx_small": _island("Fourier positional features"),
    "tv.mobilenet_v3_small": _HARDSIGMOID,
    "timm.mobilenetv3_small_050": _HARDSIGMOID,
    "timm.lcnet_050": _HARDSIGMOID,
    "timm.ghostnet_050": _HARDSIGMOID,
    "timm.rexnet_100": dict(rtol=1e-8, note="rtol 1e-8: 80 BatchNorms deep"),
    "timm.levit_128s": _BIAS_CACHE,
    "timm.efficientformerv2_s0": _BIAS_CACHE,
}
for _s in REGISTRY:
    for _k, _v in _TWEAKS.get(_s.name, {}).items():
        setattr(_s, _k, "; ".join(x for x in (_s.note, _v) if x) if _k == "note" else _v)


def by_name(name) -> ModelSpec:
    for s in REGISTRY:
        if s.name == name:
            return s
    raise KeyError(name)


# --------------------------------------------------------------------------- checking

def _zero_randomness(model: nn.Module):
    """Dropout, drop-path and stochastic depth at p=0 (the training step is compared
    without random masks)."""
    for m in model.modules():
        if isinstance(m, nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for attr, v in list(vars(m).items()):  # drop_rate, drop_prob, attention_dropout...
            if "drop" in attr and isinstance(v, float):
                setattr(m, attr, 0.0)
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
    return model


def _leaves(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # transformers' ModelOutput is an OrderedDict
        return [t for v in out.values() for t in _leaves(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in _leaves(v)]
    return []


def _loss(out):
    """A fixed random projection of every floating output: a loss whose gradient reaches
    everything the outputs depend on (a plain sum would give ~0 through normalisations)."""
    g = torch.Generator().manual_seed(7)
    total = 0
    for t in _leaves(out):
        if t.is_floating_point():
            total = total + (t * torch.randn(t.shape, generator=g, dtype=t.dtype)).sum()
    return total


#: The largest normwise error seen by ``_assert_close`` since the last ``check_model``
#: began — the rtol each tensor needed, (max|actual - expected| - atol) / max|expected| —
#: its ``Result.worst_rtol``.
_worst = [0.0]


def _assert_close(actual, expected, what, exact, spec, rtol=None):
    """Exact on the eager backend; otherwise every element within
    ``atol + rtol * max|expected|`` (normwise: a gradient that is zero up to rounding,
    like a bias before BatchNorm, is noise relative to its own elements). ``rtol``
    defaults to the spec's."""
    rtol = spec.rtol if rtol is None else rtol
    la, le = _leaves(actual), _leaves(expected)
    assert len(la) == len(le), f"{what}: {len(la)} tensors vs eager's {len(le)}"
    for i, (a, e) in enumerate(zip(la, le)):
        tol = 0.0
        if not exact and e.numel() and e.is_floating_point():
            scale = e.detach().abs().max().item()
            tol = spec.atol + rtol * scale
            if a.shape == e.shape and scale > 0:
                err = (a.detach().double() - e.detach().double()).abs().max().item()
                _worst[0] = max(_worst[0], max(err - spec.atol, 0.0) / scale)
        torch.testing.assert_close(a, e, rtol=0.0, atol=tol, equal_nan=True,
                                   msg=lambda m: f"{what}[{i}]: {m}")


@dataclasses.dataclass
class Result:
    graphs: int = 0
    ops: int = 0
    capture_s: float = 0.0
    worst_rtol: float = 0.0   # the largest normwise error of any compared tensor


def _op_count(gm):
    return sum(n.op in ("call_function", "call_method", "call_module")
               and n.target is not torch._C._set_grad_enabled for n in gm.graph.nodes)


def _cast(tree, dtype):
    if isinstance(tree, torch.Tensor):
        return tree.to(dtype) if tree.is_floating_point() else tree
    if isinstance(tree, dict):
        return {k: _cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_cast(v, dtype) for v in tree)
    return tree


def check_model(spec: ModelSpec, backend: str, fullgraph: bool = True, train: bool | None = None) -> Result:
    """Compile ``spec``'s model on ``backend`` and compare it with eager (eval: two calls;
    train: one step).  Raises (AssertionError, kiln.Unsupported...) on any difference.

    The eager backend runs the captured graph as it is, so it must match bit for bit (in
    float32, the fast dtype); aot_eager's decompositions reorder arithmetic, so it runs
    in float64 against normwise tolerances."""
    exact = backend == "eager"
    dtype = torch.float32 if exact else torch.float64
    rtol = spec.rtol
    if backend not in ("eager", "aot_eager") and spec.kernel_rtol is not None:
        rtol = max(rtol, spec.kernel_rtol)
    train = spec.train if train is None else train
    _worst[0] = 0.0
    kiln.reset()
    torch.manual_seed(0)
    base = _zero_randomness(spec.build()).to(dtype)
    ref = copy.deepcopy(base)
    mod = copy.deepcopy(base)
    del base
    graphs = []
    capture = [0.0]
    inner = lookup_backend(backend)

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)

    from kiln.debug import timing

    def timed_call(fn, *a, **k):
        before = timing.totals().get("capture (incl. backend)", 0.0)
        out = fn(*a, **k)
        capture[0] += timing.totals().get("capture (incl. backend)", 0.0) - before
        return out

    cm = kiln.compile(mod, backend=counting, fullgraph=fullgraph)
    try:
        ref.eval()
        mod.eval()
        for i in range(2):
            args, kwargs = _cast(spec.inputs(i), dtype)
            with torch.no_grad():
                expected = ref(*args, **kwargs)
                got = timed_call(cm, *args, **kwargs)
            _assert_close(got, expected, f"eval call {i} output", exact, spec, rtol)
            if fullgraph:
                want = 1 if i == 0 else spec.eval_graphs
                assert len(graphs) == want, f"eval call {i}: {len(graphs)} graphs compiled, expected {want}"
        eval_graphs = len(graphs)
        eval_ops = sum(_op_count(g) for g in graphs)
        eval_capture = capture[0]
        if train:
            ref.train()
            mod.train()
            args, kwargs = _cast(spec.inputs(5), dtype)
            expected = ref(*args, **kwargs)
            got = cm(*args, **kwargs)
            _assert_close(got, expected, "train output", exact, spec, rtol)
            le, lg = _loss(expected), _loss(got)
            le.backward()
            lg.backward()
            _assert_close(lg, le, "train loss", exact, spec, rtol)
            for (n, p), (_, q) in zip(mod.named_parameters(), ref.named_parameters()):
                assert (p.grad is None) == (q.grad is None), f"grad of {n}: {p.grad is None} vs {q.grad is None}"
                if q.grad is not None:
                    _assert_close(p.grad, q.grad, f"grad of {n}", exact, spec, rtol)
            for (n, b), (_, c) in zip(mod.named_buffers(), ref.named_buffers()):
                _assert_close(b, c, f"buffer {n}", exact, spec, rtol)
            if fullgraph:
                want = eval_graphs + 1
                assert len(graphs) == want, f"train step: {len(graphs)} graphs in all, expected {want}"
    finally:
        kiln.reset()
    return Result(graphs=eval_graphs, ops=eval_ops, capture_s=eval_capture,
                  worst_rtol=_worst[0])


@contextlib.contextmanager
def kernel_graphs():
    """Yields a list that receives (op count, fallbacks) of each aten graph the kernel
    compiler builds meanwhile (``getitem`` is not an op; library calls are not
    fallbacks)."""
    from kiln.kernels import compile as kcompile
    seen = []
    orig = kcompile.build

    def spy(gm, example_inputs, target="cpp"):
        rt, arte = orig(gm, example_inputs, target)
        ops = sum(n.op == "call_function" and n.target is not operator.getitem
                  for n in gm.graph.nodes)
        seen.append((ops, list(arte["fallbacks"])))
        return rt, arte
    kcompile.build = spy
    try:
        yield seen
    finally:
        kcompile.build = orig


def explain_model(spec: ModelSpec):
    """kiln.explain on the eval model (no fullgraph): graphs, breaks, ops, break reasons."""
    kiln.reset()
    torch.manual_seed(0)
    m = _zero_randomness(spec.build()).to(torch.float64).eval()
    args, kwargs = spec.inputs(0)
    from kiln.debug import timing

    timing.clear()
    t0 = time.perf_counter()
    with torch.no_grad():
        ex = kiln.explain(m)(*args, **kwargs)
    # capture alone (the trace, guards and entry code), not explain's own eager run
    dt = timing.totals().get("capture (incl. backend)", time.perf_counter() - t0)
    kiln.reset()
    return ex, dt
