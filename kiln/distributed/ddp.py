"""``kiln.compile(DDP(model))``: DDP's own forward as in eager, the model compiled and
split at DDP's bucket boundaries.

DDP's forward is bookkeeping on its C++ reducer (prepare for forward and backward,
bucket rebuilds, the join context) around one call of the wrapped module. That wrapper
runs eagerly, exactly as eager DDP runs it; the wrapped module's call is routed, for the
length of the call, to its kiln-compiled ``_call_impl`` through the ``nn.Module``
instance slot ``_compiled_call_impl`` (a compatibility use of ``nn.Module``'s own
calling protocol: ``Module.__call__`` reads the slot; nothing of PyTorch's compiler is
imported or called).
Its graphs go to ``BucketSplit``, which cuts each at the predicted bucket boundaries
(``buckets.py``) and compiles every piece separately (``split.py``), so a bucket's
gradients are final, and DDP's all-reduce hook fires, while the backward of the pieces
before it still runs.

``DDP(kiln.compile(model))`` needs none of this: DDP calls a compiled module whose
graph is one autograd node, so every bucket becomes ready only when the whole backward
has run (same gradients, no overlap).
"""
from __future__ import annotations

import weakref

import torch

from kiln import config
from kiln.debug.logs import log_for
from kiln.distributed.buckets import Plan, bucket_caps
from kiln.distributed.split import SplitGraph

log = log_for("ddp")


def reduced_param_ids(ddp) -> set:
    """ids of the parameters DDP's reducer buckets (not ignored, requiring grad)."""
    ignored = set(getattr(ddp, "parameters_to_ignore", ()) or ())
    return {id(p) for name, p in ddp.module.named_parameters()
            if p.requires_grad and name not in ignored}


class BucketSplit:
    """A backend wrapper: each captured graph is cut at the DDP buckets of ``ddp`` and
    its pieces handed to ``backend`` one by one (``KILN_DDP_SPLIT=0``: whole)."""

    def __init__(self, backend, ddp):
        self.backend = backend
        self._ddp = weakref.ref(ddp)
        self.plans: list[Plan] = []   # one per graph compiled, for tests and reports
        if hasattr(backend, "prepare"):
            self.prepare = backend.prepare

    def __call__(self, gm, example_inputs):
        ddp = self._ddp()
        if ddp is None or not config.ddp_split:
            return self.backend(gm, example_inputs)
        plan = Plan(gm, example_inputs, reduced_param_ids(ddp), bucket_caps(ddp))
        self.plans.append(plan)
        log.info("graph split at DDP buckets (caps %s bytes): %s", bucket_caps(ddp), plan.describe())
        if not plan.cuts:
            return self.backend(gm, example_inputs)
        return SplitGraph(gm, plan.cuts, self.backend)


class CompiledDDP(torch.nn.Module):
    """What ``kiln.compile`` returns for a DistributedDataParallel: calls run DDP's
    forward, whose call of the wrapped module runs kiln's compiled one. Shares
    everything with the DDP (``_orig_mod``)."""

    def __init__(self, ddp, inner_call, splitter: BucketSplit):
        super().__init__()
        self._orig_mod = ddp
        object.__setattr__(self, "_kiln_inner_call", inner_call)
        object.__setattr__(self, "_kiln_split", splitter)

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        ddp = self._orig_mod
        slots = ddp.module.__dict__
        # compatibility use of nn.Module's calling slot (read by Module.__call__), by name
        had, prev = "_compiled_call_impl" in slots, slots.get("_compiled_call_impl")
        slots["_compiled_call_impl"] = self._kiln_inner_call
        try:
            return ddp(*args, **kwargs)
        finally:
            if had:
                slots["_compiled_call_impl"] = prev
            else:
                slots.pop("_compiled_call_impl", None)

    def __getattr__(self, name):
        if name == "_orig_mod":
            return super().__getattr__(name)
        return getattr(self._orig_mod, name)


def compile_ddp(ddp, backend, compile_callable) -> CompiledDDP:
    """``compile_callable(fn, backend)`` compiles the wrapped module's ``_call_impl``
    (its hooks and forward) with ``backend`` behind a BucketSplit."""
    splitter = BucketSplit(backend, ddp)
    inner = compile_callable(ddp.module._call_impl, splitter)
    return CompiledDDP(ddp, inner, splitter)
