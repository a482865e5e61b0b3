"""The aten op set kiln's aten graphs use, and the per-op rules the tracer needs.

Three tables live here, because every other module of ``kiln.autograd`` asks them:

* ``DECOMPOSITIONS``: what the tracer expands while recording (PyTorch's core-aten
  decomposition table, plus a few ops the core table leaves whole but we want as
  primitives, minus ``KEEP_WHOLE``: the ops that libraries (cuBLAS, cuDNN, flash
  attention) do better than generated code, so the kernel compiler calls them).
* ``CORE_OPS``: the final op set a verified aten graph may contain.
* how an op relates to aliasing: a *view* (returns alias an input, nothing written),
  a *mutation* (writes an argument; ``functional_variant`` names its out-of-place twin)
  or plain functional.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch._decomp import decomposition_table

aten = torch.ops.aten


def _ops(*names):
    """OpOverloads by "packet.overload" name, skipping ones this torch lacks."""
    out = []
    for n in names:
        packet, _, overload = n.partition(".")
        p = getattr(aten, packet, None)
        if p is not None and overload in p.overloads():
            out.append(getattr(p, overload))
    return out


#: Ops kept whole although the decomposition tables could expand them: matmuls,
#: convolutions and attention go to vendor libraries.
KEEP_WHOLE = frozenset(_ops(
    "mm.default", "bmm.default", "addmm.default", "baddbmm.default",
    "convolution.default", "convolution_backward.default",
    "_scaled_dot_product_flash_attention.default",
    "_scaled_dot_product_flash_attention_backward.default",
    "_scaled_dot_product_efficient_attention.default",
    "_scaled_dot_product_efficient_attention_backward.default",
    "_scaled_dot_product_cudnn_attention.default",
    "_scaled_dot_product_cudnn_attention_backward.default",
    "_scaled_dot_product_flash_attention_for_cpu.default",
    "_scaled_dot_product_flash_attention_for_cpu_backward.default",
))

#: Ops the core table leaves alone that we expand anyway: batch norm hides a write to
#: its running statistics (its schema does not say so); the decomposition makes the
#: write an explicit ``copy_`` that functionalization then removes. Group norm's
#: expansion (reductions and pointwise ops) is what the kernel compiler fuses; whole,
#: it was poolformer's one fallback (14% of its graph's ops).
_EXTRA_DECOMPOSE = _ops(
    "native_batch_norm.default", "_native_batch_norm_legit.default",
    "_native_batch_norm_legit.no_stats", "_native_batch_norm_legit_functional.default",
    "_native_batch_norm_legit_no_training.default", "native_group_norm.default",
)


#: Ops allowed in aten graphs beyond those tagged ``core``: random ops (kept whole so
#: each random draw happens once, where eager draws it), allocation, and the few
#: non-core ops the autograd engine's own formulas and functionalization emit.
_EXTRA_ALLOWED = frozenset(_ops(
    "bernoulli.p", "bernoulli.default", "bernoulli.Tensor", "rand.default",
    "randn.default", "rand_like.default", "randn_like.default", "randint.low",
    "native_dropout.default", "uniform.default", "normal.Tensor_float",
    "empty.memory_format", "empty_strided.default", "new_empty_strided.default",
    "empty_permuted.default",
    "as_strided_scatter.default", "copy.default", "alias.default",
    "_to_copy.default", "clone.default", "lift_fresh_copy.default",
    "scalar_tensor.default", "_unsafe_index.Tensor", "_unsafe_index_put.default",
))


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dim, keepdim) if dim is not None else
            aten.mean.default(x).reshape([1] * x.dim() if keepdim else []))


#: Decompositions of our own, where PyTorch's table only has a prims-level one.
_OWN_DECOMPOSITIONS = {aten.var_mean.correction: _var_mean}


def _build_decompositions():
    from kiln.autograd.decomp_table import core_aten_table
    table = core_aten_table()
    for op in _EXTRA_DECOMPOSE:
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    for op, fn in _OWN_DECOMPOSITIONS.items():
        table[op] = fn
    for op in KEEP_WHOLE:
        table.pop(op, None)
    return table


#: op -> Python decomposition, applied by the tracer as it records.
DECOMPOSITIONS = _build_decompositions()

class _CoreOps:
    """The core aten op set the verifier accepts, as a membership test: ops tagged
    ``core`` that the tracer does not decompose, plus KEEP_WHOLE and _EXTRA_ALLOWED,
    less mutations. (Listing them means materialising every aten overload: 50 ms at
    every process's first compile.) ``|`` adds ops."""

    def __init__(self, extra=frozenset()):
        self.extra = frozenset(extra)

    def __contains__(self, op) -> bool:
        if op in self.extra:
            return True
        if getattr(op, "namespace", None) == "kiln":     # kiln.sdpa and its backward
            return True
        if not isinstance(op, torch._ops.OpOverload) or is_mutation(op):
            return False
        return (op in KEEP_WHOLE or op in _EXTRA_ALLOWED
                or (torch.Tag.core in op.tags and op not in DECOMPOSITIONS))

    def __or__(self, other) -> "_CoreOps":
        return _CoreOps(self.extra | frozenset(other))

    def __iter__(self):
        ops = set(KEEP_WHOLE) | set(_EXTRA_ALLOWED) | set(self.extra)
        for name in dir(aten):
            packet = getattr(aten, name, None)
            if isinstance(packet, torch._ops.OpOverloadPacket):
                ops.update(getattr(packet, ov) for ov in packet.overloads())
        return iter(sorted((op for op in ops if op in self), key=str))


# --- aliasing classification ------------------------------------------------------


@functools.lru_cache(maxsize=None)
def is_mutation(op) -> bool:
    """True when the schema says the op writes one of its arguments (``Tensor(a!)``)."""
    return any(a.alias_info is not None and a.alias_info.is_write
               for a in op._schema.arguments)


@functools.lru_cache(maxsize=None)
def is_view(op) -> bool:
    """True when a result aliases an input without writing it (view, select, split…)."""
    if is_mutation(op):
        return False
    return any(r.alias_info is not None for r in op._schema.returns)


@functools.lru_cache(maxsize=None)
def is_random(op) -> bool:
    return torch.Tag.nondeterministic_seeded in op.tags


#: Mutating ops whose out-of-place twin does not follow the naming rule.
_FUNCTIONAL_SPECIAL = {
    op: fn for op, fn in [
        *zip(_ops("bernoulli_.float"), _ops("bernoulli.p")),
        *zip(_ops("bernoulli_.Tensor"), _ops("bernoulli.Tensor")),
        *zip(_ops("copy_.default"), _ops("copy.default")),
        *zip(_ops("uniform_.default"), _ops("uniform.default")),
        *zip(_ops("normal_.default"), _ops("normal_functional.default")),
        *zip(_ops("_native_batch_norm_legit.default"),
             _ops("_native_batch_norm_legit_functional.default")),
        *zip(_ops("_batch_norm_with_update.default"),
             _ops("_batch_norm_with_update_functional.default")),
    ]
}


def _signature(op):
    """(name, type) of each argument an op reads: an ``out=`` variant's written
    keyword-only arguments left out, alias annotations ignored."""
    return [(a.name, str(a.type)) for a in op._schema.arguments
            if not (a.alias_info is not None and a.alias_info.is_write and a.kwarg_only)]


def is_out_variant(op) -> bool:
    """An ``out=`` form: every argument it writes is keyword-only (``add.out``)."""
    written = [a for a in op._schema.arguments
               if a.alias_info is not None and a.alias_info.is_write]
    return bool(written) and all(a.kwarg_only for a in written)


@functools.lru_cache(maxsize=None)
def functional_variant(op):
    """The out-of-place twin of a mutating op (``add_.Tensor`` -> ``add.Tensor``,
    ``add.out`` -> ``add.Tensor``), or None. Found by a table of exceptions, then the
    naming rule (trailing underscore dropped; the same name for ``out=`` forms),
    preferring the same overload: a twin takes the same arguments, by name and type
    (``pow_.Scalar`` is ``pow.Tensor_Scalar``, not ``pow.Scalar``)."""
    if op in _FUNCTIONAL_SPECIAL:
        return _FUNCTIONAL_SPECIAL[op]
    name = op._schema.name.split("::")[-1]
    if is_out_variant(op):
        packet = getattr(aten, name, None)
    elif name.endswith("_"):
        packet = getattr(aten, name[:-1], None)
    else:
        return None
    if packet is None:
        return None
    want = _signature(op)
    overloads = list(packet.overloads())
    if op._overloadname in overloads:
        overloads.remove(op._overloadname)
        overloads.insert(0, op._overloadname)
    for ov in overloads:
        cand = getattr(packet, ov)
        if not is_mutation(cand) and _signature(cand) == want:
            return cand
    return None


# --- recomputation (used by the partitioner) -------------------------------------

_CHEAP = frozenset(_ops(
    "view.default", "_unsafe_view.default", "permute.default", "expand.default",
    "squeeze.dims", "squeeze.dim", "squeeze.default", "unsqueeze.default",
    "slice.Tensor", "select.int", "alias.default", "as_strided.default",
    "_to_copy.default", "clone.default", "full.default", "scalar_tensor.default",
    "zeros.default", "ones.default", "empty.memory_format", "new_empty_strided.default",
    "empty_strided.default", "full_like.default", "cat.default",
))


def is_recomputable(target) -> bool:
    """May the partitioner recompute this op in the backward instead of saving it?
    Cheap, deterministic ops only: pointwise maths, views, copies, constants."""
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if is_random(target):
        return False
    return target in _CHEAP or torch.Tag.pointwise in target.tags or is_view(target)


#: The final op set of kiln's aten graphs: core-tagged aten ops the decomposition
#: table leaves whole, plus ``KEEP_WHOLE`` and a few extras; never a mutating op.
CORE_OPS = _CoreOps()


# --- op-set profiles: how much the tracer decomposes, chosen by the backend -------


@dataclass(frozen=True)
class OpSet:
    """What the tracer does to the ops it records, for one kind of consumer.

    ``table``: op -> Python decomposition applied while recording; ``keep_whole``: ops
    never decomposed (not even CompositeImplicitAutograd ones); ``allowed``: the op set
    the verifier accepts (None: any functional op overload); ``whole_attention``:
    record ``F.scaled_dot_product_attention`` as one op (``kiln.sdpa``) with a fused
    backward, so the device's flash/efficient kernels run, instead of the math path
    that tracing on meta tensors would take.
    """
    name: str
    table: dict = field(hash=False, compare=False)
    keep_whole: frozenset = frozenset()
    allowed: object = None          # a container of op overloads (``in``), or None
    whole_attention: bool = False


#: For the kernel compiler: the core aten set (few ops to lower; matmuls, convolutions
#: and fused attention stay whole — attention as ``kiln.sdpa``, so the device's flash
#: kernels run rather than the math path's matmuls, upcast to float32 for half types).
CORE = OpSet("core", DECOMPOSITIONS, KEEP_WHOLE, CORE_OPS, whole_attention=True)

#: For ``aot_eager``, whose graphs PyTorch runs op by op: no decomposition beyond what
#: functionalization needs, so batch norm, layer norm, softmax, GELU, convolution and
#: attention keep their efficient aten kernels (and their fused backward formulas).
#: Ops that hide a write (``native_batch_norm`` updating running stats) are handled by
#: the tracer (``trace._HIDDEN_WRITES``). View ops are still decomposed as in "core"
#: (free: views of views), so that writes through them scatter back by the tracer's
#: few rules; ``detach`` becomes ``alias``, later dropped.
class _ViewDecompositions(Mapping):
    """DECOMPOSITIONS' entries for view ops, and ``detach`` as ``alias`` (looked up per
    op, so the whole table is never resolved)."""

    def __contains__(self, op) -> bool:
        return op is aten.detach.default or (op in DECOMPOSITIONS and is_view(op))

    def __getitem__(self, op):
        if op is aten.detach.default:
            return _detach_as_alias
        if op in self:
            return DECOMPOSITIONS[op]
        raise KeyError(op)

    def __iter__(self):
        return iter([op for op in DECOMPOSITIONS if is_view(op)] + [aten.detach.default])

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _detach_as_alias(x):
    return aten.alias.default(x)


EAGER = OpSet("eager", _ViewDecompositions(), frozenset(), None, whole_attention=True)

PROFILES = {"core": CORE, "eager": EAGER}


def op_set(choice) -> OpSet:
    """An ``OpSet`` from a profile name ("core", "eager") or an ``OpSet`` itself."""
    if isinstance(choice, OpSet):
        return choice
    if choice is None:
        return CORE
    try:
        return PROFILES[choice]
    except KeyError:
        raise ValueError(f"unknown decomposition profile {choice!r}; "
                         f"known: {', '.join(PROFILES)}") from None
