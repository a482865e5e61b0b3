"""The verifier of kiln's aten IR: what every graph leaving ``kiln.autograd`` obeys.

Tests run it on every forward, backward and inference graph; the kernel compiler may
rely on what it checks: only ops of ``ops.CORE_OPS`` (and ``getitem`` of their tuple
results; any op overload for graphs of the "eager" op set), no mutating op, and ``val``
(a meta tensor) plus ``device`` (the real device) in every tensor-producing node's
metadata.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from kiln.autograd.ops import is_mutation, op_set


class AtenGraphError(AssertionError):
    pass


def verify_aten_graph(gm: fx.GraphModule | fx.Graph, ops=None) -> None:
    """Raise ``AtenGraphError`` naming every node that breaks the rules. ``ops``: the
    op set profile the graph was traced with ("core", the default, or "eager", whose
    graphs may hold any functional op overload)."""
    allowed = op_set(ops).allowed
    graph = gm.graph if isinstance(gm, fx.GraphModule) else gm
    graph.lint()
    problems = []
    for n in graph.nodes:
        if n.op == "call_function":
            if n.target is operator.getitem:
                pass
            elif not isinstance(n.target, torch._ops.OpOverload):
                problems.append(f"{n.name}: {n.target} is not an aten op overload")
            elif is_mutation(n.target):
                problems.append(f"{n.name}: {n.target} mutates its input")
            elif allowed is not None and n.target not in allowed:
                problems.append(f"{n.name}: {n.target} is not in the core op set")
        elif n.op in ("call_module", "call_method"):
            problems.append(f"{n.name}: {n.op} is not allowed in aten graphs")
        if n.op in ("call_function", "placeholder", "get_attr"):
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                if v.device.type != "meta":
                    problems.append(f"{n.name}: meta['val'] is not a meta tensor")
                if "device" not in n.meta:
                    problems.append(f"{n.name}: no meta['device']")
            elif n.op != "placeholder" and "val" not in n.meta:
                problems.append(f"{n.name}: no meta['val']")
    if problems:
        raise AtenGraphError("invalid aten graph:\n  " + "\n  ".join(problems))
