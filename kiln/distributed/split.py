"""Cutting one captured graph into consecutive pieces, each compiled as its own graph.

A piece's compiled forward is one autograd node, so in the backward the last piece's
gradients are final before the earlier pieces' backwards run: that is what lets DDP's
all-reduce of a finished bucket overlap the rest of the backward. The pieces run in
program order on the same values (each piece's outputs are the next pieces' inputs), so
what the graph computes is unchanged; only where autograd nodes begin and end moves.

A cut is made only where it cannot change the program: every value crossing it is a
tensor (a tuple from ``split`` stays with its ``getitem``s), and no grad-mode switch is
open across it (a piece would otherwise start in the wrong mode).
"""
from __future__ import annotations

import torch
import torch.fx as fx

#: graph nodes that change global state for the nodes after them
_STATE_SWITCHES = (torch._C._set_grad_enabled,)


def _is_tensor_node(node: fx.Node) -> bool:
    return isinstance(node.meta.get("example_value"), torch.Tensor)


def _uses(node: fx.Node) -> list[fx.Node]:
    seen: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda a: seen.append(a) or a)
    return seen


def cut_allowed(nodes: list[fx.Node], cut: int) -> str | None:
    """None if the graph may be cut before ``nodes[cut]``, else why not."""
    switches = sum(1 for n in nodes[:cut] if n.op == "call_function" and n.target in _STATE_SWITCHES)
    if switches % 2:
        return "a grad-mode block is open there"
    later = nodes[cut:]
    for n in nodes[:cut]:
        if n.op in ("placeholder", "get_attr") or not n.users:
            continue
        if any(u in later for u in n.users) and not _is_tensor_node(n):
            return f"{n.name} (not a tensor) crosses it"
    return None


class Piece:
    """One run of consecutive nodes as a GraphModule of its own: ``inputs`` are the
    outer graph's nodes it reads, ``outputs`` the ones later pieces or the output read."""

    def __init__(self, root: fx.GraphModule, body: list[fx.Node], later_users: set):
        inside = {n for n in body if n.op != "placeholder"}
        self.inputs: list[fx.Node] = []
        for n in body:
            for a in _uses(n):
                if a not in inside and a not in self.inputs and a.op != "get_attr":
                    self.inputs.append(a)
        self.outputs = [n for n in body if n.op not in ("placeholder", "get_attr")
                        and any(u in later_users for u in n.users)]
        g = fx.Graph()
        env: dict[fx.Node, fx.Node] = {}
        for a in self.inputs:
            env[a] = g.placeholder(a.name)
            env[a].meta = dict(a.meta)
        for n in body:
            if n.op == "placeholder":
                continue
            if n.op == "get_attr" and n not in env:
                env[n] = g.node_copy(n)
                continue
            for a in _uses(n):
                if a.op == "get_attr" and a not in env:
                    env[a] = g.node_copy(a)
            env[n] = g.node_copy(n, lambda a: env[a])
        g.output(tuple(env[o] for o in self.outputs))
        self.gm = fx.GraphModule(root, g)
        self.compiled = None


class SplitGraph:
    """Runs the pieces of a cut graph in order; each piece goes to ``backend`` at the
    first call, with the real tensors it receives as its example inputs."""

    def __init__(self, gm: fx.GraphModule, cuts: list[int], backend):
        nodes = [n for n in gm.graph.nodes if n.op != "output"]
        out = next(n for n in gm.graph.nodes if n.op == "output")
        self.placeholders = [n for n in nodes if n.op == "placeholder"]
        self.result = out.args[0]
        bounds = [0, *cuts, len(nodes)]
        bodies = [nodes[a:b] for a, b in zip(bounds, bounds[1:])]
        self.pieces: list[Piece] = []
        for i, body in enumerate(bodies):
            later = {out} | {n for b in bodies[i + 1:] for n in b}
            self.pieces.append(Piece(gm, body, later))
        self.backend = backend
        # values no piece after the i-th and no output reads: dropped after piece i
        kept = set(_uses(out))
        self.drop: list[list[fx.Node]] = []
        for i, p in enumerate(self.pieces):
            ahead = {a for q in self.pieces[i + 1:] for a in q.inputs}
            self.drop.append([a for a in [*p.inputs, *p.outputs] if a not in ahead and a not in kept])

    def __call__(self, *args):
        env = dict(zip(self.placeholders, args))
        for p, drop in zip(self.pieces, self.drop):
            ins = [env[a] for a in p.inputs]
            if p.compiled is None:
                p.compiled = self.backend(p.gm, ins)
            for node, v in zip(p.outputs, p.compiled(*ins)):
                env[node] = v
            del ins
            for a in drop:
                env.pop(a, None)
        return fx.node.map_arg(self.result, lambda a: env[a])
