"""Dims a kernel may walk as one: a flat index instead of one index per dim.

A Triton pointwise kernel recovers each dim's index from its flat one by division and
remainder (``exprs.decompose``), then every load and store multiplies them back by its
strides. Where every tensor of the group is laid out alike along two neighbouring dims —
the outer one's coefficient is the inner one's times the inner size, in every affine
index (loads, stores, ``Index`` values, masks, gather terms) — those dims are the digits
of one number, so the kernel walks that number: a contiguous [8, 512, 3072] GELU is
``ptr + xindex``, with no division at all. That matters most when sizes are kernel
arguments (``size_args``): a division by a run-time size is a multiply-high sequence per
element, and Triton cannot see that ``(x // n) * n + x % n`` is contiguous, so loads
were not vectorised (GPT-2's GELU backward ran 4.6x slower than torch.compile's).

A C++ pointwise loop nest likewise becomes one loop (``merged_pointwise``): its
``omp simd`` loop was the last dim alone, 7 elements of a [8, 64, 7, 7] map.

Merging is decided on this compile's sizes, like every other size-dependent choice: the
text of a merged kernel differs from that of an unmerged one, so a kernel shared by
several sizes (``size_args``) is shared only by sizes that merge alike.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..ir import Affine


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


def memory_order(nodes, sizes, writes) -> list:
    """Dims outermost to innermost in the memory of the first stored node (a
    channels-last map walks its channels fastest); logical order otherwise."""
    for n in nodes:
        if n.name in writes and tuple(n.sizes) == tuple(sizes):
            st = [int(s) for s in n.strides]
            return sorted(range(len(sizes)), key=lambda i: (-st[i] if int(sizes[i]) != 1 else 0, i))
    return list(range(len(sizes)))


def merged_pointwise(nodes, sizes, writes):
    """A pure pointwise group's (sizes, nodes) with its mergeable dims merged, walked
    in the memory order of what it stores: each run one dim (its variables renumbered
    ``x0``…, outermost first), each node a copy with its body re-indexed and its sizes
    and strides those of the merged dims (the stride of a run's innermost dim).
    Unchanged (the same objects) when nothing merges."""
    vars_ = ir.loop_vars(sizes)
    stores = [n.store_index(vars_) for n in nodes if n.name in writes]
    merged = runs(affines([n.body for n in nodes], stores), sizes,
                  memory_order(nodes, sizes, writes))
    if all(len(r) == 1 for r in merged):
        return sizes, nodes
    rename = {f"x{r[-1]}": f"x{j}" for j, r in enumerate(merged)}

    def fn(a: Affine) -> Affine:
        return Affine(tuple(sorted((rename[v], k) for v, k in a.terms if v in rename)),
                      a.const)
    new_sizes = tuple(run_sizes(merged, sizes)) or (1,)
    out = []
    for n in nodes:
        strides = tuple(int(n.strides[r[-1]]) for r in merged) or (1,)
        out.append(dataclasses.replace(n, sizes=new_sizes, strides=strides,
                                       body=ir.map_affines(n.body, fn)))
    return new_sizes, out
