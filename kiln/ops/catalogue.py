"""The op catalogue: every per-op fact a stage needs, written once, per op family.

An entry says, for the ops of one family:

* ``keep_whole`` — the CORE op set (kernel compiler) never decomposes it, although a
  decomposition table could (libraries do it better than generated code). The EAGER op
  set decomposes only views, so it keeps these whole anyway.
* ``decompose`` — CORE decomposes it although PyTorch's core table leaves it whole.
* ``allowed`` — a verified CORE graph may hold it although it is not tagged ``core``.
* ``library_call`` — the kernel compiler runs it as an extern (BLAS, oneDNN, cuDNN,
  flash attention) and does not report it as a fallback. A lowering, where one is
  registered (``kiln/kernels/lowering/``, ``LOWERINGS``), is tried first.
* ``lowering`` — the module of ``kiln/kernels/lowering/`` that registers the op's
  lowering: required for a library call with one, and given for the ops outside the
  core tag that only a lowering handles (the ``_foreach_*`` family); a test checks it.
* ``recomputable`` — cheap enough for the partitioner to recompute in the backward
  rather than save (besides what the rule in ``is_recomputable`` admits by tags).
* ``meta`` — the ``kiln.fast_meta`` shortcut (by name, ``fast_meta._SHORTCUTS``) that
  computes its result metadata without PyTorch's Python meta kernel.

kiln's own ops (namespace ``kiln``: ``kiln.sdpa`` and friends, ``autograd/sdpa.py``) are
kept whole, allowed and library calls by namespace (``is_kiln_op``).

Every stage reads these tables; none keeps a list of its own (``tests/ops``).
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields

import torch

from .schema import is_random, is_view

aten = torch.ops.aten


def ops_named(*names):
    """OpOverloads by "packet.overload" name, skipping ones this torch lacks."""
    out = []
    for n in names:
        packet, _, overload = n.partition(".")
        p = getattr(aten, packet, None)
        if p is not None and overload in p.overloads():
            out.append(getattr(p, overload))
    return out


def foreach_names(*specs):
    """``_foreach_<name>.<overload>`` for every (names, overloads) pair of ``specs``."""
    return tuple(f"_foreach_{n}.{ov}" for names, overloads in specs
                 for n in names for ov in overloads)


@dataclass(frozen=True)
class OpInfo:
    keep_whole: bool = False
    decompose: bool = False
    allowed: bool = False
    library_call: bool = False
    recomputable: bool = False
    meta: str | None = None
    lowering: str | None = None


#: (op names, facts, why). An op may sit in several families; its facts are merged.
FAMILIES = [
    (("mm.default", "addmm.default"),
     dict(keep_whole=True, library_call=True, lowering="matmul"),
     "matmuls go to BLAS; the lowering fuses small ones and epilogues, else declines"),
    (("bmm.default", "baddbmm.default"),
     dict(keep_whole=True, library_call=True),
     "batched matmuls go to BLAS"),
    (("convolution.default",),
     dict(keep_whole=True, library_call=True, lowering="conv"),
     "convolutions go to oneDNN/cuDNN; the lowering handles the few it does better"),
    (("convolution_backward.default",),
     dict(keep_whole=True, library_call=True),
     "the convolution's backward goes to oneDNN/cuDNN"),
    (("_scaled_dot_product_flash_attention.default",
      "_scaled_dot_product_flash_attention_backward.default",
      "_scaled_dot_product_efficient_attention.default",
      "_scaled_dot_product_efficient_attention_backward.default",
      "_scaled_dot_product_cudnn_attention.default",
      "_scaled_dot_product_cudnn_attention_backward.default",
      "_scaled_dot_product_flash_attention_for_cpu.default",
      "_scaled_dot_product_flash_attention_for_cpu_backward.default"),
     dict(keep_whole=True, library_call=True),
     "fused attention kernels, forward and backward"),
    (("scaled_dot_product_attention.default", "_native_multi_head_attention.default"),
     dict(library_call=True),
     "attention entry points: a library call where a graph holds them, but not kept "
     "whole — CORE records F.scaled_dot_product_attention as kiln.sdpa instead, and "
     "keeping these CompositeImplicit ops whole would change what it traces"),
    (("mm.default",), dict(meta="mm"), "shape of a plain matmul"),
    (("addmm.default",), dict(meta="addmm"), "shape of a plain matmul"),
    (("bmm.default",), dict(meta="bmm"), "shape of a plain batched matmul"),
    (("_softmax.default", "_log_softmax.default"), dict(meta="softmax"),
     "same shape and dtype as the input"),
    (("native_layer_norm.default",), dict(meta="layer_norm"),
     "output and float statistics"),
    (("native_batch_norm.default", "_native_batch_norm_legit.default",
      "_native_batch_norm_legit.no_stats", "_native_batch_norm_legit_functional.default",
      "_native_batch_norm_legit_no_training.default"),
     dict(decompose=True),
     "batch norm hides a write to its running statistics (its schema does not say "
     "so); decomposed, the write is an explicit copy_ that functionalization removes"),
    (("native_group_norm.default",), dict(decompose=True),
     "its expansion (reductions, pointwise ops) is what the kernel compiler fuses"),
    (("bernoulli.p", "bernoulli.default", "bernoulli.Tensor", "rand.default",
      "randn.default", "rand_like.default", "randn_like.default", "randint.low",
      "native_dropout.default", "uniform.default", "normal.Tensor_float"),
     dict(allowed=True),
     "random ops kept whole, so each draw happens once, where eager draws it"),
    (("_log_softmax.default", "gather.default"), dict(allowed=True),
     "CORE decomposes them only in training, a log-softmax whose gradient is taken and a "
     "gather from one (autograd/log_softmax.py); otherwise they stay whole"),
    (("empty.memory_format", "empty_strided.default", "new_empty_strided.default",
      "empty_permuted.default", "as_strided_scatter.default", "copy.default",
      "alias.default", "_to_copy.default", "clone.default", "lift_fresh_copy.default",
      "scalar_tensor.default", "_unsafe_index.Tensor", "_unsafe_index_put.default"),
     dict(allowed=True),
     "allocation, and non-core ops the autograd formulas and functionalization emit"),
    (foreach_names(
        (("add", "sub", "mul", "div"), ("List", "Scalar", "ScalarList", "Tensor")),
        (("maximum", "minimum", "clamp_min", "clamp_max"), ("List", "Scalar", "ScalarList")),
        (("pow",), ("List", "Scalar", "ScalarList", "ScalarAndTensor")),
        (("addcdiv", "addcmul", "lerp"), ("Scalar", "ScalarList")), (("lerp",), ("List",)),
        (("addcdiv", "addcmul"), ("Tensor",)),
        (("abs", "neg", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt",
          "reciprocal", "sigmoid", "sign", "sin", "cos", "tan", "tanh", "sinh", "cosh",
          "asin", "acos", "atan", "erf", "floor", "ceil", "round", "trunc", "clone", "zero"),
         ("default",))),
     dict(allowed=True, lowering="foreach"),
     "the multi-tensor maths of a traced optimizer step (their functional forms): lowered "
     "element by element as the per-tensor op, so each parameter's update is one kernel"),
    (("view.default", "_unsafe_view.default", "permute.default", "expand.default",
      "squeeze.dims", "squeeze.dim", "squeeze.default", "unsqueeze.default",
      "slice.Tensor", "select.int", "alias.default", "as_strided.default",
      "_to_copy.default", "clone.default", "full.default", "scalar_tensor.default",
      "zeros.default", "ones.default", "empty.memory_format", "new_empty_strided.default",
      "empty_strided.default", "full_like.default", "cat.default"),
     dict(recomputable=True),
     "cheap and deterministic: views, copies, constants, concatenation"),
]


def _build():
    table: dict = {}
    for names, facts, _why in FAMILIES:
        for op in ops_named(*names):
            old = table.get(op, OpInfo())
            merged = {f.name: getattr(old, f.name) or facts.get(f.name, getattr(old, f.name))
                      for f in fields(OpInfo)}
            table[op] = OpInfo(**merged)
    return table


#: op overload -> OpInfo, for every op with a fact beyond its schema and tags.
CATALOGUE: dict = _build()
_NONE = OpInfo()


def info(op) -> OpInfo:
    """The catalogue's facts about ``op`` (all false for an op it does not list)."""
    return CATALOGUE.get(op, _NONE)


def _where(flag):
    return frozenset(op for op, i in CATALOGUE.items() if getattr(i, flag))


KEEP_WHOLE = _where("keep_whole")
EXTRA_DECOMPOSE = _where("decompose")
EXTRA_ALLOWED = _where("allowed")


def is_kiln_op(target) -> bool:
    """One of kiln's own ops (``torch.ops.kiln.*``, defined in ``autograd/sdpa.py``)."""
    return getattr(target, "namespace", None) == "kiln"


def is_library_call(target) -> bool:
    """Run as an extern on purpose (not a fallback to report)."""
    return is_kiln_op(target) or info(target).library_call


def is_recomputable(target) -> bool:
    """May the partitioner recompute this op in the backward instead of saving it?
    Cheap, deterministic ops only: pointwise maths, views, copies, constants."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if is_random(target):
        return False
    return (info(target).recomputable or torch.Tag.pointwise in target.tags
            or is_view(target))


def meta_shortcut(op) -> str | None:
    """The kind of ``fast_meta`` shortcut for ``op``, or None."""
    i = CATALOGUE.get(op)
    return i.meta if i is not None else None
