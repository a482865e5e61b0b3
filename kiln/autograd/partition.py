"""Split a joint graph into forward and backward by a minimum cut over saved bytes.

Every value the backward needs from the forward is either *saved* (kept alive between
the two, costing its bytes) or *recomputed* in the backward from other values. The
choice is a min-cut: each node ``n`` becomes an edge ``n_in -> n_out`` whose capacity
is the bytes of its result; data edges ``n_out -> user_in`` are infinite. The source
feeds the inputs (primals) and every forward op that must not be recomputed (random
ops, matmuls, reductions… — or all of them when ``config.partition_recompute`` is off);
every backward op drains to the sink. The cheapest cut is the set of values to save;
forward ops on the sink side are recomputed in the backward.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

from kiln import config
from kiln.autograd.ops import has_effect, is_view
from kiln.ops import is_recomputable

INF = math.inf


def nbytes(node: fx.Node) -> float:
    """Bytes of the node's result if it is one tensor; infinite otherwise (tuples are
    never saved whole: their getitems are)."""
    v = node.meta.get("val")
    if isinstance(v, torch.Tensor):
        return _hint(v.numel()) * v.element_size()
    if v is None or isinstance(v, (int, float, bool, torch.SymInt)):
        return 0    # a size (an int) saved for the backward costs nothing
    return INF


def _hint(n) -> int:
    """A symbolic count at the traced sizes (what the cut weighs), an int as it is."""
    return n.node.hint if isinstance(n, torch.SymInt) else n


@dataclass
class Partition:
    forward: fx.Graph          # primals -> (*forward outputs, *saved)
    backward: fx.Graph         # (*saved, *tangents) -> grads
    saved: list[fx.Node]       # joint-graph nodes saved for backward
    saved_bytes: int


def _is_backward(n: fx.Node) -> bool:
    return n.meta.get("phase") == "backward"


#: Saving a value the forward would otherwise fuse away (a pointwise result) costs a
#: store of it as well as its bytes: counted as this fraction of its bytes, so that a
#: tie (a log-softmax vs the logits it is computed from, the logits plus two values per
#: row) goes to the value the forward stores anyway.
STORE_COST = 1 / 16


def _store_cost(n: fx.Node, recompute: bool) -> float:
    if not recompute or n.op != "call_function" or not is_recomputable(n.target) \
            or n.target is operator.getitem or is_view(n.target):
        return 0
    return nbytes(n) * STORE_COST


def choose_saved(joint: fx.Graph, recompute: bool | None = None,
                 copied=frozenset()) -> list[fx.Node]:
    """The joint-graph nodes to save for the backward: a minimum cut (see module doc).
    ``copied``: nodes that would be saved as copies, which costs more than keeping
    another value of the same size.

    Backward nodes are not vertices: each drains to the sink with infinite capacity
    and feeds only other backward nodes, so it is on the sink side of every finite cut
    and of the residual graph's sink side: it is the sink itself, and a forward value
    it reads has its edge to the sink. The cut and the vertices that reach the sink are
    those of the graph with every backward node in it (tests/autograd/test_partition_cut.py
    checks that against the whole graph), for half the vertices (a 24-layer GPT-2)."""
    if recompute is None:
        recompute = config.partition_recompute
    import networkx as nx     # here, not at import: 0.3 s, and inference never needs it
    out = next(n for n in reversed(joint.nodes) if n.op == "output")
    forward = [n for n in joint.nodes if n.op != "output" and not _is_backward(n)]
    index = {n: i for i, n in enumerate(forward)}      # n_in is 2i, n_out 2i + 1
    source, sink = "source", "sink"
    edges = []
    for i, n in enumerate(forward):
        if n.op in ("placeholder", "get_attr") or not recompute or \
                not is_recomputable(n.target):
            edges.append((source, 2 * i, {"capacity": INF}))
        # One byte more for computed values: on a tie, save the input itself
        # (alive anyway) rather than a view or copy of it.
        cap = nbytes(n) + (0 if n.op == "placeholder" else 1) + \
            (2 if n in copied else 0) + _store_cost(n, recompute)
        edges.append((2 * i, 2 * i + 1, {} if cap == INF else {"capacity": cap}))
        for u in n.users:
            if u is not out:
                j = index.get(u)
                edges.append((2 * i + 1, sink if j is None else 2 * j, {"capacity": INF}))
    g = nx.DiGraph()
    g.add_edges_from(edges)
    if sink not in g or source not in g:
        return []
    # Boykov-Kolmogorov: on a 24-layer GPT-2's joint graph (6,196 vertices) 0.07 s where
    # networkx's default (preflow-push) takes 0.29 s. The cut is the same: the vertices
    # that reach the sink in the residual graph are those of every maximum flow.
    from networkx.algorithms.flow import boykov_kolmogorov
    _, (reach, _) = nx.minimum_cut(g, source, sink, flow_func=boykov_kolmogorov)
    return [n for i, n in enumerate(forward) if 2 * i in reach and 2 * i + 1 not in reach]


def _copy_into(new: fx.Graph, nodes, env: dict) -> None:
    for n in nodes:
        if n not in env:
            env[n] = new.node_copy(n, lambda a: env[a])


def _ancestors(roots, stop) -> list:
    """Nodes needed to compute ``roots``, not looking past ``stop``; topological order
    follows the joint graph's."""
    seen, todo = set(), [r for r in roots if r is not None]
    while todo:
        n = todo.pop()
        if n in seen or n in stop:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return seen


def _view_root(n: fx.Node) -> fx.Node:
    """The node a chain of view ops (and getitems of their results) starts from."""
    while n.op == "call_function" and n.args and isinstance(n.args[0], fx.Node) and (
            n.target is operator.getitem or (isinstance(n.target, torch._ops.OpOverload)
                                             and is_view(n.target))):
        n = n.args[0]
    return n


def partition(joint: fx.Graph, num_fw_outputs: int, mutated_inputs=(),
              recompute: bool | None = None, copied=frozenset()) -> Partition:
    """Forward and backward graphs from a joint graph whose output is
    ``(*forward outputs, *grads)``. ``mutated_inputs``: indices of primals the runtime
    overwrites after the forward; those are saved as copies, as are the ``copied``
    nodes (``TraceResult.copied``)."""
    out = next(n for n in reversed(joint.nodes) if n.op == "output")
    outs = list(out.args[0])
    fw_outs, bw_outs = outs[:num_fw_outputs], outs[num_fw_outputs:]
    order = {n: i for i, n in enumerate(joint.nodes)}
    saved = choose_saved(joint, recompute, copied)

    # Backward: everything the grads need, stopping at saved values and tangents;
    # a forward value reached that is not recomputable is saved after all.
    saved_set = set(saved)
    while True:
        need = _ancestors(bw_outs, saved_set)
        extra = [n for n in need if not _is_backward(n) and
                 (n.op in ("placeholder",) or not is_recomputable(n.target))
                 and n.op != "get_attr"]
        if not extra:
            break
        saved_set.update(extra)
    saved = sorted(saved_set, key=order.get)
    need = sorted(need, key=order.get)

    primals = [n for n in joint.nodes if n.op == "placeholder" and not _is_backward(n)]
    mutated = {primals[i] for i in mutated_inputs}

    fw = fx.Graph()
    env: dict = {}
    for p in primals:
        env[p] = fw.node_copy(p)
    # ops kept for their effect alone (a check that raises) run in the forward
    effects = [n for n in joint.nodes if has_effect(n) and n.op == "call_function"
               and not _is_backward(n)]
    fw_need = sorted(_ancestors(list(fw_outs) + saved + effects, set(primals)), key=order.get)
    _copy_into(fw, [n for n in fw_need if n.op != "placeholder"], env)
    saved_vals = []
    for s in saved:
        v = env[s]
        if _view_root(s) in mutated or s in copied:
            # the runtime writes this input (or changes its geometry) after the forward,
            # which bumps the version of every view of it, or the user may write it
            # where eager's backward would not mind: save the old value
            v = fw.call_function(torch.ops.aten.clone.default, (v,))
            v.meta.update(s.meta)
            v.meta["val"] = _cloned_meta(s.meta.get("val"))
        saved_vals.append(v)
    out = fw.output((*[env[o] if o is not None else None for o in fw_outs], *saved_vals))
    # what follows the forward outputs is saved for the backward alone: the kernel
    # compiler may keep its own layout there (kernels.lowering.outputs.INTERNAL_OUTPUTS)
    out.meta["kiln_internal_outputs_from"] = len(fw_outs)

    bw = fx.Graph()
    benv: dict = {}
    for s in saved:
        benv[s] = bw.placeholder(s.name)
        benv[s].meta.update(s.meta)
    for n in joint.nodes:
        if n.op == "placeholder" and _is_backward(n):
            benv[n] = bw.node_copy(n)
    _copy_into(bw, [n for n in need if n.op != "placeholder"], benv)
    bw.output(tuple(benv[o] if o is not None else None for o in bw_outs))
    bw.eliminate_dead_code()
    total = int(sum(nbytes(s) for s in saved))
    return Partition(fw, bw, saved, total)


def _cloned_meta(val):
    """The metadata ``clone`` gives ``val``: its strides where it is dense, else dense
    ones (an expanded input's clone is not stride 0, and a kernel planned for the input's
    strides would write the clone into overlapping memory)."""
    if not isinstance(val, torch.Tensor):
        return val
    try:
        return torch.ops.aten.clone.default(val)
    except Exception:       # noqa: BLE001  (a value only its own mode can clone)
        return val
