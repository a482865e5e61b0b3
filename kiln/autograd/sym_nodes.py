"""Symbolic sizes as nodes of the aten graph.

When the tracer runs on meta tensors whose sizes are SymInts (``symbolic.py``), an op's
size arguments (``view(x, [s0, 4*s1])``) are sympy expressions over the size symbols.
In the graph each symbol is read from where the inputs give it at run time: a
``aten.sym_size.int(primal, dim)`` node after the placeholder of the first input with
that size, or the int placeholder itself; an expression is built from those with
``operator`` nodes (one node per distinct expression), so the graph computes every
size from its inputs and runs for any sizes the capture's guards admit. The min-cut
partitioner saves such a value as an int when the backward needs it (costing nothing).
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from kiln.shapes.exprs import FloorDiv

aten = torch.ops.aten


class SymbolicUnsupported(Exception):
    """The symbolic trace meets what it does not express: the graph is traced per
    concrete size instead (``symbolic.DynamicAot``)."""


def _int_hint(e, hints) -> int:
    v = e.xreplace(hints)
    if not v.is_Integer:
        raise SymbolicUnsupported(f"the size {e} has no integer value")
    return int(v)


class SymNodes:
    """The nodes holding the sizes of one trace (see the module docstring)."""

    def __init__(self, make_node, env):
        self.make_node = make_node      # (target, args) -> fx.Node in the current phase
        self.env = env
        self.nodes: dict = {}           # sympy expression -> fx.Node
        self.hints: dict = {s: sympy.Integer(i.hint) for s, i in env.symbols.items()}

    def expr_of(self, s: torch.SymInt):
        node = s.node
        if getattr(node, "env", None) is not self.env:
            raise SymbolicUnsupported(f"a size {s} from another trace")
        return self.env.simplify(node.expr)

    def define(self, expr, node: fx.Node) -> None:
        """``node`` reads ``expr`` (a symbol) from an input, when none did yet."""
        expr = self.env.simplify(expr)
        if isinstance(expr, sympy.Symbol) and expr not in self.nodes:
            self.nodes[expr] = node

    def of_input(self, t: torch.Tensor, placeholder: fx.Node) -> None:
        """``sym_size`` nodes for the symbols a tensor input's sizes introduce."""
        for d, n in enumerate(t.shape):
            if isinstance(n, torch.SymInt):
                e = self.expr_of(n)
                if isinstance(e, sympy.Symbol) and e not in self.nodes:
                    node = self.make_node(aten.sym_size.int, (placeholder, d))
                    node.meta["val"] = n
                    self.nodes[e] = node

    def value(self, x):
        """The graph argument for ``x``: a node for a symbolic int, ``x`` otherwise."""
        if isinstance(x, torch.SymInt):
            e = self.expr_of(x)
            return int(e) if e.is_Integer else self._node(e)
        if isinstance(x, (torch.SymFloat, torch.SymBool)):
            raise SymbolicUnsupported(f"a symbolic {type(x).__name__} argument ({x})")
        return x

    def _node(self, e):
        hit = self.nodes.get(e)
        if hit is not None:
            return hit
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            raise SymbolicUnsupported(f"no input gives the size {e}")
        rule = _RULES.get(type(e))
        if rule is None:
            raise SymbolicUnsupported(f"the size expression {e} ({type(e).__name__})")
        node = rule(self, e)
        if isinstance(node, fx.Node):
            node.meta["val"] = torch.SymInt(self.env_node(e))
            self.nodes[e] = node
        return node

    def env_node(self, e):
        from kiln.shapes.node import KilnSymNode
        return KilnSymNode(e, _int_hint(e, self.hints), int, self.env)

    def _fold(self, op, parts):
        acc = self._node(parts[0])
        for p in parts[1:]:
            acc = self.make_node(op, (acc, self._node(p)))
        return acc


def _add(nodes: SymNodes, e):
    return nodes._fold(operator.add, list(e.args))


def _mul(nodes: SymNodes, e):
    if any(a.is_Number and not a.is_Integer for a in e.args):
        raise SymbolicUnsupported(f"the size expression {e} has a fraction")
    return nodes._fold(operator.mul, list(e.args))


def _pow(nodes: SymNodes, e):
    if not (e.exp.is_Integer and e.exp > 0):
        raise SymbolicUnsupported(f"the size expression {e}")
    return nodes._fold(operator.mul, [e.base] * int(e.exp))


def _binary(op):
    def rule(nodes: SymNodes, e):
        return nodes.make_node(op, (nodes._node(e.args[0]), nodes._node(e.args[1])))
    return rule


_RULES = {sympy.Add: _add, sympy.Mul: _mul, sympy.Pow: _pow,
          FloorDiv: _binary(operator.floordiv), sympy.Mod: _binary(operator.mod),
          sympy.Max: lambda nodes, e: nodes._fold(max, list(e.args)),
          sympy.Min: lambda nodes, e: nodes._fold(min, list(e.args))}
