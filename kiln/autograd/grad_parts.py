"""A compiled graph's autograd as eager's: which nodes a backward runs, and what it adds.

Eager's autograd graph keeps apart what is apart: a backward from one output runs only
the nodes that output reaches. A compiled graph run as a single autograd node would
join every differentiable output to every input that requires grad, and PyTorch's
engine runs every node it reaches, even with no gradient for it. A backward from one
output would then run the history of inputs that output never touched: one freed by
an earlier backward (a tensor kept in a global by an earlier call) fails with "Trying
to backward through the graph a second time" where eager never goes there, and hooks
on such inputs are called (with None). So the differentiable outputs are grouped by
the set of inputs they reach (``TraceResult.grad_deps``; ``split``), and each group is
its own autograd node, connected to exactly those inputs (leaves without hooks aside).
Usually there is one group.

Within a node, an output the backward does not reach has no gradient. Eager never
runs its part of the backward; a zero tangent in its place is not the same (``0 *
inf`` is NaN, added to the other outputs' gradient). So each node's backward graph is
specialised to the tangents present (``restrict_backward``): the contributions of
absent ones are pruned, as structural zeros, before they are added to anything.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.fx as fx

aten = torch.ops.aten


@dataclass
class Part:
    """One autograd node: outputs reaching the same inputs."""
    #: positions in ``TraceResult.grad_inputs`` (= the backward graph's outputs)
    grad_slots: list
    #: positions in ``TraceResult.differentiable`` (= the backward graph's tangents)
    outputs: list


def split(grad_deps, num_differentiable: int, plain=frozenset()) -> list[Part]:
    """The differentiable outputs grouped by the grad inputs they reach, not counting
    the ``plain`` ones (slots of leaves without hooks: the engine running a leaf's
    gradient accumulation with no gradient does nothing, so reaching one more costs
    nothing and saves running a shared part of the backward once per group). A node
    is connected to every input its outputs reach. A differentiable output that
    reaches no grad input (a tensor made with ``requires_grad=True`` inside the graph)
    keeps the single-node behaviour: one part for everything."""
    reach: list[list] = [[] for _ in range(num_differentiable)]
    for j, deps in enumerate(grad_deps):
        for p in deps:
            reach[p].append(j)
    if any(not r for r in reach):
        return [Part(list(range(len(grad_deps))), list(range(num_differentiable)))]
    parts: dict[tuple, Part] = {}
    for p, r in enumerate(reach):
        part = parts.setdefault(tuple(j for j in r if j not in plain), Part([], []))
        part.outputs.append(p)
        part.grad_slots = sorted(set(part.grad_slots) | set(r))
    return list(parts.values())


def restrict_backward(backward: fx.Graph, num_saved: int, grad_slots,
                      present) -> tuple[fx.Graph, list]:
    """``backward`` (placeholders ``(*saved, *tangents)``, output: one gradient per
    grad input) cut down to the gradients at ``grad_slots``, computed from the tangents
    at positions ``present`` only (the others are absent: what they would add is
    pruned, see the module docstring). Returns the graph and the positions of the
    placeholders it keeps."""
    g = fx.Graph()
    env: dict = {}
    absent: set = set()       # nodes of ``backward`` that carry absent tangents only
    tangent_of: set = set()   # nodes of ``backward`` that depend on a tangent
    placeholders = [n for n in backward.nodes if n.op == "placeholder"]
    for k, n in enumerate(placeholders):
        env[n] = g.node_copy(n)
        if k >= num_saved:
            tangent_of.add(n)
            if k - num_saved not in present:
                absent.add(n)
    for n in backward.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            grads = n.args[0]
            g.output(tuple(_present(g, env, absent, grads[j]) for j in grad_slots))
            continue
        ins = [a for a in n.all_input_nodes if a in tangent_of]
        if ins:
            tangent_of.add(n)
        live = [a for a in ins if a not in absent]
        if ins and not live:
            absent.add(n)           # linear in absent tangents only: a structural zero
            continue
        if len(live) < len(ins):
            kept = _sum_without_absent(n, absent)
            if kept is not None:
                env[n] = env[kept]
                continue
        env[n] = g.node_copy(n, lambda a: _present(g, env, absent, a))
    g.eliminate_dead_code()
    phs = [n for n in g.nodes if n.op == "placeholder"]
    carriers = _size_carriers(g, phs, num_saved, present)
    kept = []
    for k, n in enumerate(phs):
        if n.users or k in carriers:
            kept.append(k)
        else:
            g.erase_node(n)
    return g, kept


def free_symbols(v) -> set:
    """The size symbols in a node's value (its tensors' sizes and strides, SymInts)."""
    out = set()
    for t in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(t, torch.Tensor):
            for s in (*t.shape, *t.stride()):
                if isinstance(s, torch.SymInt):
                    out |= s.node.expr.free_symbols
        elif isinstance(t, torch.SymInt):
            out |= t.node.expr.free_symbols
    return out


def _size_carriers(g: fx.Graph, phs: list, num_saved: int, present) -> set:
    """Positions of absent tangents kept as inputs of a graph of symbolic sizes only
    for their sizes: a structural zero (``_present``) or another node may be sized by
    a symbol that no other input gives (``zeros([s1])``, ``s1`` the length of the
    output whose tangent is absent), and a graph compiled per size solves its symbols
    from its inputs' sizes. The backward passes such a tangent as a zero of the
    output's layout that nothing reads (``runtime``: a stride-0 expand)."""
    needed = set()
    for n in g.nodes:
        if n.op != "placeholder":
            needed |= free_symbols(n.meta.get("val"))
    if not needed:
        return set()
    given = set()
    for n in phs:
        if n.users:
            given |= free_symbols(n.meta.get("val"))
    carriers = set()
    for k, n in enumerate(phs):
        missing = needed - given
        if not missing:
            break
        if k >= num_saved and k - num_saved not in present and not n.users:
            has = free_symbols(n.meta.get("val"))
            if has & missing:
                carriers.add(k)
                given |= has
    return carriers


def _sum_without_absent(n: fx.Node, absent: set):
    """For ``a + b`` (how the engine accumulates gradients) with one term absent and the
    other of the sum's own shape and dtype, that other term."""
    if n.target is not aten.add.Tensor or len(n.args) != 2 or n.kwargs:
        return None
    a, b = n.args
    other = b if a in absent else a if b in absent else None
    if not isinstance(other, fx.Node):
        return None
    v, w = other.meta.get("val"), n.meta.get("val")
    if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor) and \
            v.shape == w.shape and v.dtype == w.dtype:
        return other
    return None


def _present(g: fx.Graph, env: dict, absent: set, a):
    """``a`` in the new graph; an absent value read beside present ones is zeros."""
    if not isinstance(a, fx.Node):
        return a
    if a not in absent:
        return env[a]
    v = a.meta["val"]
    with warnings.catch_warnings():
        # symbolic sizes stay SymInts here: a graph compiled per size makes them
        # concrete (``specialize.specialise``), its absent tangents giving their values
        # where no other input does (``_size_carriers``)
        warnings.filterwarnings("ignore", message="Raw SymInt value")
        z = g.call_function(aten.zeros.default, (list(v.shape),),
                            {"dtype": v.dtype, "device": a.meta.get("device", v.device)})
    z.meta.update(a.meta)
    # zeros' own layout (contiguous), not the absent value's: that of an ``expand`` (a
    # sum's tangent) has stride 0, a buffer no result can be copied into (fuzz seed 2054)
    z.meta["val"] = v.new_empty(v.shape)
    return z
