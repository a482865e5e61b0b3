"""Where DDP's gradient buckets end in a captured graph.

DDP's reducer all-reduces gradients bucket by bucket. After the first step it rebuilds
its buckets in the order gradients became ready (about the reverse of the order the
forward uses the parameters): the first bucket holds at most ``first_bucket_bytes_cap``
bytes, later ones ``bucket_bytes_cap`` (``bucket_cap_mb``), a bucket closing once it
reaches its cap, one bucket list per dtype and device. We predict that order from the
graph (nodes walked backwards, each node's parameters in reverse argument order), let
``torch.distributed``'s own assignment function bucket them, and cut the graph before
the earliest last use of each bucket's parameters: the backward of the piece after a
cut then yields that bucket's gradients, and the all-reduce starts while the earlier
pieces' backwards run. A prediction that misses only moves where gradients become
ready, never their values.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from kiln.distributed.split import cut_allowed


def bucket_caps(ddp) -> tuple[int, int]:
    """(first bucket's byte cap, every later bucket's) of a DistributedDataParallel."""
    import torch.distributed as dist

    cap = int(ddp.bucket_bytes_cap)
    config = getattr(ddp, "_bucket_config", None)
    if config is not None:
        first = int(config.first_bucket_bytes_cap)
    else:
        first = dist._DEFAULT_FIRST_BUCKET_BYTES if getattr(ddp, "bucket_bytes_cap_default", False) else cap
    return min(first, cap), cap


def ready_order(nodes: list[fx.Node], params: dict[fx.Node, torch.Tensor]) -> list[tuple[fx.Node, int]]:
    """The parameter placeholders in predicted gradient-ready order, each with the index
    of the node that uses it last."""
    order: list[tuple[fx.Node, int]] = []
    seen: set = set()
    for i in range(len(nodes) - 1, -1, -1):
        used: list[fx.Node] = []
        fx.node.map_arg((nodes[i].args, nodes[i].kwargs), lambda a: used.append(a) or a)
        for a in reversed(used):
            if a in params and a not in seen:
                seen.add(a)
                order.append((a, i))
    return order


def assign(tensors: list[torch.Tensor], caps: tuple[int, int]) -> list[list[int]]:
    """Bucket indices as DDP's reducer assigns them (its own function when present)."""
    import torch.distributed as dist

    limits = [caps[0], caps[1]] if caps[0] < caps[1] else [caps[1]]
    fn = getattr(dist, "_compute_bucket_assignment_by_size", None)
    if fn is not None:
        buckets, _ = fn(tensors, limits, [False] * len(tensors))
        return [list(b) for b in buckets]
    return _assign_like_ddp(tensors, limits)


def _assign_like_ddp(tensors, limits):
    """The reducer's rule, for a torch without the binding: per (dtype, device) a bucket
    closes once its bytes reach the current limit; limits advance, the last repeats."""
    open_: dict = {}
    done: list[list[int]] = []
    for i, t in enumerate(tensors):
        key = (t.dtype, t.device)
        items, size, li = open_.get(key, ([], 0, 0))
        items.append(i)
        size += t.numel() * t.element_size()
        if size >= limits[li]:
            done.append(items)
            open_[key] = ([], 0, min(li + 1, len(limits) - 1))
        else:
            open_[key] = (items, size, li)
    done += [items for items, _, _ in open_.values() if items]
    return sorted(done, key=min)


class Plan:
    """The cuts of one graph: ``cuts`` (node indices a piece starts at), the predicted
    ``buckets`` (lists of placeholder names) and why any bucket boundary was not cut."""

    def __init__(self, gm: fx.GraphModule, example_inputs, param_ids: set, caps: tuple[int, int]):
        self.nodes = [n for n in gm.graph.nodes if n.op != "output"]
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        params = {n: t for n, t in zip(placeholders, example_inputs)
                  if isinstance(t, torch.Tensor) and id(t) in param_ids and t.requires_grad}
        order = ready_order(self.nodes, params)
        buckets = assign([params[n] for n, _ in order], caps) if order else []
        self.buckets = [[order[i][0].name for i in b] for b in buckets]
        starts = sorted({min(order[i][1] for i in b) for b in buckets})
        self.cuts: list[int] = []
        self.skipped: list[str] = []
        for c in starts[1:]:  # the earliest bucket's piece starts the graph
            prev = self.cuts[-1] if self.cuts else 0
            if not any(n.op not in ("placeholder", "get_attr") for n in self.nodes[prev:c]):
                continue  # nothing to compute before it: the bucket shares the piece
            why = cut_allowed(self.nodes, c)
            if why is None:
                self.cuts.append(c)
            else:
                self.skipped.append(f"before {self.nodes[c].name}: {why}")

    def describe(self) -> str:
        lines = [f"{len(self.buckets)} predicted bucket(s), {len(self.cuts) + 1} piece(s)"]
        for i, b in enumerate(self.buckets):
            lines.append(f"  bucket {i}: {', '.join(b)}")
        bounds = [0, *self.cuts, len(self.nodes)]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            ops = [n.name for n in self.nodes[a:b] if n.op not in ("placeholder", "get_attr")]
            lines.append(f"  piece {i}: {', '.join(ops)}")
        lines += [f"  not cut {s}" for s in self.skipped]
        return "\n".join(lines)
