"""What an op's schema and tags say about it: writes an argument, aliases an input,
draws random numbers. Read by the catalogue (recomputable ops), the autograd tracer,
functionalization and the verifier."""
from __future__ import annotations

import functools

import torch


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
