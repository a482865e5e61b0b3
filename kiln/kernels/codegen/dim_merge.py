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
were not vectorised (GPT-2's GELU backward ran at a fifth of its memory bandwidth).

A C++ pointwise loop nest likewise becomes one loop (``merged_pointwise``): its
``omp simd`` loop was the last dim alone, 7 elements of a [8, 64, 7, 7] map. A C++
reduction merges its kept dims and its reduced dims each apart (``merged_group``): a
spatial mean is [N*C] by [H*W], not four loops with a 7-element ``omp simd`` inside.

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
    """Dims from outermost to innermost in memory of the first stored node of these
    sizes (a channels-last result walks channels fastest); logical order otherwise."""
    n = len(sizes)
    for node in nodes:
        if node.name in writes and tuple(node.sizes) == tuple(sizes):
            st = [int(s) for s in node.strides]
            if st == list(ir.contiguous_strides(sizes)):
                break
            return sorted(range(n), key=lambda i: (-st[i] if int(sizes[i]) != 1 else 0, i))
    return list(range(n))


def _renamer(rename: dict):
    """``fn(affine)`` keeping the variables ``rename`` maps, under their new names."""
    def fn(a: Affine) -> Affine:
        return Affine(tuple(sorted((rename[v], k) for v, k in a.terms if v in rename)),
                      a.const)
    return fn


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
    fn = _renamer({f"x{r[-1]}": f"x{j}" for j, r in enumerate(merged)})
    new_sizes = tuple(run_sizes(merged, sizes)) or (1,)
    out = []
    for n in nodes:
        strides = tuple(int(n.strides[r[-1]]) for r in merged) or (1,)
        out.append(dataclasses.replace(n, sizes=new_sizes, strides=strides,
                                       body=ir.map_affines(n.body, fn)))
    return new_sizes, out


def merged_group(g, writes):
    """A reduction group (``scheduler.Group`` of pointwise and reduction nodes) with its
    kept dims and its reduced dims each merged, never a kept dim with a reduced one; a
    part left with no dim keeps one of size 1. Variables renumbered ``x0``…, nodes
    copied re-indexed with the merged sizes and strides, loops rebuilt over the copies.
    ``g`` itself when nothing merges or a node is of another kind."""
    from ..scheduler import Group
    outer, red = tuple(g.outer), tuple(g.red)
    k, sizes = len(outer), tuple(g.outer) + tuple(g.red)
    if not all(type(n) in (ir.Pointwise, ir.Reduction) for n in g.nodes):
        return g
    all_vars, outer_vars = ir.loop_vars(sizes), ir.loop_vars(outer)

    def full(n) -> bool:
        return not isinstance(n, ir.Reduction) and tuple(n.sizes) == sizes
    stores = [n.store_index(all_vars if full(n) else outer_vars)
              for n in g.nodes if n.name in writes]
    merged = runs(affines([n.body for n in g.nodes], stores), sizes, range(len(sizes)))
    merged = [part for r in merged
              for part in ([d for d in r if d < k], [d for d in r if d >= k]) if part]
    if all(len(r) == 1 for r in merged):
        return g
    oruns = [r for r in merged if r[0] < k]
    rruns = [r for r in merged if r[0] >= k]
    new_outer = tuple(run_sizes(oruns, sizes)) or ((1,) if outer else ())
    new_red = tuple(run_sizes(rruns, sizes)) or ((1,) if red else ())
    rename = {f"x{r[-1]}": f"x{j}" for j, r in enumerate(oruns)}
    rename.update({f"x{r[-1]}": f"x{len(new_outer) + j}" for j, r in enumerate(rruns)})
    fn = _renamer(rename)

    def strides(n, rs):
        return tuple(int(n.strides[r[-1]]) for r in rs) or (1,)
    copies = {}
    for n in g.nodes:
        body = ir.map_affines(n.body, fn)
        if isinstance(n, ir.Reduction):
            c = dataclasses.replace(n, sizes=new_outer, red_sizes=new_red,
                                    strides=strides(n, oruns), body=body)
        elif full(n):
            c = dataclasses.replace(n, sizes=new_outer + new_red,
                                    strides=strides(n, oruns + rruns), body=body)
        else:
            c = dataclasses.replace(n, sizes=new_outer, strides=strides(n, oruns), body=body)
        copies[n.name] = c
    loops = [(kind, [copies[n.name] for n in ns]) for kind, ns in g.loops]
    return Group(new_outer, new_red, [copies[n.name] for n in g.nodes], loops=loops)
