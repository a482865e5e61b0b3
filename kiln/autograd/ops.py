"""The op sets kiln's aten graphs use (CORE, EAGER), built from the op catalogue.

Per-op facts (kept whole, decomposed anyway, allowed beyond ``core``, recomputable,
what a schema says) live in ``kiln/ops``; this module turns them into what the tracer
and verifier ask:

* ``DECOMPOSITIONS``: what the tracer expands while recording (PyTorch's core-aten
  decomposition table, plus the catalogue's ``decompose`` ops, minus its ``KEEP_WHOLE``
  ops: those libraries (cuBLAS, cuDNN, flash attention) do better than generated code).
* ``CORE_OPS``: the final op set a verified aten graph may contain.
* ``functional_variant``: a mutating op's out-of-place twin.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._decomp import decomposition_table

from kiln.ops import (EXTRA_ALLOWED, EXTRA_DECOMPOSE, KEEP_WHOLE, is_kiln_op, is_mutation,
                      is_view, ops_named)

aten = torch.ops.aten


_ops = ops_named


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return (aten.var.correction(x, dim, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dim, keepdim) if dim is not None else
            aten.mean.default(x).reshape([1] * x.dim() if keepdim else []))


#: Decompositions of our own, where PyTorch's table only has a prims-level one.
_OWN_DECOMPOSITIONS = {aten.var_mean.correction: _var_mean}


def _build_decompositions():
    from kiln.autograd.decomp_table import core_aten_table
    table = core_aten_table()
    for op in EXTRA_DECOMPOSE:
        if op in decomposition_table:
            table[op] = decomposition_table[op]
    from kiln.autograd.log_softmax import TRAINING_DECOMPOSITIONS
    for op, fn in {**_OWN_DECOMPOSITIONS, **TRAINING_DECOMPOSITIONS}.items():
        table[op] = fn
    for op in KEEP_WHOLE:
        table.pop(op, None)
    return table


#: op -> Python decomposition, applied by the tracer as it records.
DECOMPOSITIONS = _build_decompositions()

class _CoreOps:
    """The core aten op set the verifier accepts, as a membership test: ops tagged
    ``core`` that the tracer does not decompose, plus KEEP_WHOLE and EXTRA_ALLOWED,
    less mutations. (Listing them means materialising every aten overload: 50 ms at
    every process's first compile.) ``|`` adds ops."""

    def __init__(self, extra=frozenset()):
        self.extra = frozenset(extra)

    def __contains__(self, op) -> bool:
        if op in self.extra:
            return True
        if is_kiln_op(op):                                # kiln.sdpa and its backward
            return True
        if not isinstance(op, torch._ops.OpOverload) or is_mutation(op):
            return False
        return (op in KEEP_WHOLE or op in EXTRA_ALLOWED
                or (torch.Tag.core in op.tags and op not in DECOMPOSITIONS))

    def __or__(self, other) -> "_CoreOps":
        return _CoreOps(self.extra | frozenset(other))

    def __iter__(self):
        ops = set(KEEP_WHOLE) | set(EXTRA_ALLOWED) | set(self.extra)
        for name in dir(aten):
            packet = getattr(aten, name, None)
            if isinstance(packet, torch._ops.OpOverloadPacket):
                ops.update(getattr(packet, ov) for ov in packet.overloads())
        return iter(sorted((op for op in ops if op in self), key=str))


# --- aliasing classification ------------------------------------------------------


# is_mutation, is_view: kiln/ops/schema.py (imported above; the tracer reads them here).


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


def has_effect(node: fx.Node) -> bool:
    """Kept by dead-code elimination although nothing reads it: an op that returns
    nothing is there for what it does (``_linalg_check_errors`` raises on a singular
    matrix), besides what fx itself calls impure."""
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.OpOverload) \
            and not target._schema.returns:
        return True
    return node.is_impure()
