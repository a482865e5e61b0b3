"""Dims a kernel may walk as one: a flat index instead of one index per dim.

A pointwise kernel recovers each dim's index from its flat one by division and
remainder (``exprs.decompose``), then every load and store multiplies them back by its
strides. Where every tensor of the group is laid out alike along two neighbouring dims —
the outer one's coefficient is the inner one's times the inner size, in every affine
index (loads, stores, ``Index`` values, masks, gather terms) — those dims are the digits
of one number, so the kernel walks that number: a contiguous [8, 512, 3072] GELU is
``ptr + xindex``, with no division at all. That matters most when sizes are kernel
arguments (``size_args``): a division by a run-time size is a multiply-high sequence per
element, and Triton cannot see that ``(x // n) * n + x % n`` is contiguous, so loads
were not vectorised (GPT-2's GELU backward ran 4.6x slower than torch.compile's).

Merging is decided on this compile's sizes, like every other size-dependent choice: the
text of a merged kernel differs from that of an unmerged one, so a kernel shared by
several sizes (``size_args``) is shared only by sizes that merge alike.
"""
from __future__ import annotations

from ... import ir
from ...ir import Affine


def affines(exprs, indexes=()) -> list:
    """Every affine index in ``exprs`` (loads, their masks and gather terms, ``Index``
    values) and the extra ``indexes`` (stores)."""
    out = list(indexes)
    for e in exprs:
        for x in ir.walk(e):
            if isinstance(x, (ir.Load, ir.Index)):
                out.append(x.index)
    return out


def runs(index_list, sizes, order) -> list:
    """Dims in ``order`` (outermost first, size-1 dims left out), cut into runs whose
    neighbours every index in ``index_list`` treats as digits of one number."""
    out = []
    for d in order:
        if int(sizes[d]) == 1:
            continue
        if out:
            prev = f"x{out[-1][-1]}"
            inner, s = f"x{d}", int(sizes[d])
            if all(a.coef(prev) == a.coef(inner) * s for a in index_list):
                out[-1].append(d)
                continue
        out.append([d])
    return out


def dropper(merged_runs):
    """``fn(affine)`` for ``ir.map_affines``: the outer dims of each run left out, so the
    run's innermost variable stands for the merged index (its coefficient times the
    merged index is what the run's terms summed to)."""
    gone = {f"x{d}" for r in merged_runs for d in r[:-1]}
    if not gone:
        return None

    def drop(a: Affine) -> Affine:
        if not (a.vars() & gone):
            return a
        return Affine(tuple((v, k) for v, k in a.terms if v not in gone), a.const)
    return drop


def run_sizes(merged_runs, sizes) -> list:
    return [ir.numel_of([sizes[d] for d in r]) for r in merged_runs]
