"""The end of a trace with symbolic sizes: the size guards join the entry's guards
(after the tensor guards, so ``x.size(1)`` is read only from a tensor of the traced
rank), printed as Python over the sources with a description in the user's names; a
size the user marked dynamic that the trace fixed is the user's error."""
from __future__ import annotations

from kiln.shapes.printing import to_python


def install(out) -> None:
    env = out.shapes
    if not env.symbols:
        return
    env.check_marks()
    run_names = {i.symbol: i.expr for i in env.symbols.values()}
    user_names = {i.symbol: i.pretty for i in env.symbols.values()}
    for g, where in env.final_guards():
        code = to_python(g, run_names)
        words = to_python(g, user_names)
        if where:
            words += f"  (assumed at {where})"
        reads = sorted(run_names[s] for s in g.free_symbols if s in run_names)
        lhs = reads[0] if len(reads) == 1 else f"({', '.join(reads)})" if reads else None
        out.guards.add(code, words, lhs)


def symbolic_inputs(out) -> bool:
    """Whether the graph reads any size symbolically (a backend must not specialise it
    once for all calls)."""
    return bool(out.shapes.live_symbols())


def annotate(out, gm) -> None:
    """Each placeholder's symbolic shape (or symbolic int) in ``meta["kiln_sym"]``,
    for backends that want them; the example inputs stay real."""
    by_name = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    for _, node, _ in out.inputs:
        ph = by_name.get(node.name)
        ev = node.meta.get("example_value")
        if ph is None or ev is None:
            continue
        ph.meta["kiln_sym"] = tuple(ev.shape) if hasattr(ev, "shape") else ev
