"""Torch-level graphs shaped like kiln capture's, from ``nn.Module``s, for tests and
reports: parameters and buffers become placeholders.

``lift(module)`` traces with ``torch.fx.symbolic_trace`` and replaces ``get_attr``
parameters/buffers by placeholders; leaf modules (Conv2d, BatchNorm2d, Linear…) become
calls of the module's forward with those tensors passed in
(``torch.func.functional_call``), so buffer updates hit the inputs as in capture's
graphs. ``lift_whole(module)`` does the same for a module symbolic_trace cannot follow
(data-dependent Python control flow): one node calls the whole forward.
"""
from __future__ import annotations

import torch
import torch.fx as fx
from torch.func import functional_call


def _leaf_call(module, names):
    """A function running ``module`` with its state passed first, as graph inputs."""
    def call(*tensors_and_args):
        n = len(names)
        tensors, args = tensors_and_args[:n], tensors_and_args[n:]
        return functional_call(module, dict(zip(names, tensors)), args)
    call.__name__ = call.__qualname__ = f"call_{type(module).__name__}"
    return call


def lift(module: torch.nn.Module):
    """(gm, state) with gm(*state, *user_inputs) == module(*user_inputs), where state
    is the module's parameters and buffers (the module's own tensors)."""
    gm = fx.symbolic_trace(module)
    state = dict(module.named_parameters())
    state.update(module.named_buffers())
    names = list(state)
    graph = gm.graph
    first = next(iter(graph.nodes))
    with graph.inserting_before(first):
        phs = {name: graph.placeholder("p_" + name.replace(".", "_")) for name in names}
    for n in list(graph.nodes):
        if n.op == "get_attr" and n.target in phs:
            n.replace_all_uses_with(phs[n.target])
            graph.erase_node(n)
        elif n.op == "call_module":
            sub = gm.get_submodule(n.target)
            prefix = n.target + "."
            sub_names = [k[len(prefix):] for k in names if k.startswith(prefix)]
            with graph.inserting_before(n):
                new = graph.call_function(
                    _leaf_call(sub, sub_names),
                    (*[phs[prefix + k] for k in sub_names], *n.args), n.kwargs)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
    out = next(n for n in graph.nodes if n.op == "output")
    res = out.args[0]
    if not isinstance(res, (tuple, list)):
        out.args = ((res,),)
    graph.lint()
    gm.recompile()
    return gm, [state[k] for k in names]


def lift_whole(module: torch.nn.Module, num_inputs: int = 1, output_index=None):
    """(gm, state): one call_function node runs ``module``'s forward with its state
    passed as placeholders; ``output_index`` picks one element of a tuple output."""
    state = dict(module.named_parameters())
    state.update(module.named_buffers())
    names = list(state)
    graph = fx.Graph()
    phs = [graph.placeholder("p_" + n.replace(".", "_")) for n in names]
    ins = [graph.placeholder(f"input_{i}") for i in range(num_inputs)]
    out = graph.call_function(_leaf_call(module, names), (*phs, *ins))
    if output_index is not None:
        import operator
        out = graph.call_function(operator.getitem, (out, output_index))
    graph.output((out,))
    return fx.GraphModule(torch.nn.Module(), graph), [state[k] for k in names]
