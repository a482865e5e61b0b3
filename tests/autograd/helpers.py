"""Test helpers: torch-level graphs shaped like kiln capture's, and eager comparison.

``lift(module)`` traces a module with ``torch.fx.symbolic_trace`` and turns its
parameters and buffers into placeholders (capture lifts them the same way): leaf
modules (Conv2d, BatchNorm2d, Linear…) become calls of the module's forward with the
tensors passed in (``torch.func.functional_call``), so buffer updates hit the inputs.
"""
from __future__ import annotations

import copy

import torch
import torch.fx as fx
from torch.func import functional_call


def _call_leaf(module, names, *args_and_tensors):
    n = len(names)
    tensors, args = args_and_tensors[:n], args_and_tensors[n:]
    return functional_call(module, dict(zip(names, tensors)), args)


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
                    _call_leaf, (sub, sub_names, *[phs[prefix + k] for k in sub_names],
                                 *n.args), n.kwargs)
            n.replace_all_uses_with(new)
            graph.erase_node(n)
    out = next(n for n in graph.nodes if n.op == "output")
    res = out.args[0]
    if not isinstance(res, (tuple, list)):
        out.args = ((res,),)
    graph.lint()
    gm.recompile()
    return gm, [state[k] for k in names]


def clone_inputs(xs):
    """Fresh copies (same requires_grad, leaves) so eager and kiln see equal inputs."""
    out = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            y.requires_grad_(x.requires_grad)
            out.append(y)
        else:
            out.append(x)
    return out


def assert_close(a, b, **kw):
    kw.setdefault("rtol", 1e-5)
    kw.setdefault("atol", 1e-5)
    torch.testing.assert_close(a, b, **kw)


def grads_of(outs, inputs, seed=0):
    """Backward through the outputs with fixed random tangents; input grads."""
    g = torch.Generator().manual_seed(seed)
    tensors = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
    total = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
                for o in tensors)
    total.backward()
    return [x.grad for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]


def compare_module(module, user_inputs, compiler, rtol=1e-5, atol=1e-5):
    """Run module eagerly and compiled on equal copies; compare outputs, parameter and
    input grads, and buffer updates. Returns the compiled callable."""
    m_ref = module
    m_kiln = copy.deepcopy(module)
    gm, state = lift(m_kiln)
    ins_ref = clone_inputs(user_inputs)
    ins_kiln = clone_inputs(user_inputs)
    fn = compiler(gm, [*state, *ins_kiln])
    out_kiln = fn(*state, *ins_kiln)
    out_ref = m_ref(*ins_ref)
    if not isinstance(out_ref, (tuple, list)):
        out_ref = (out_ref,)
    assert len(out_kiln) == len(out_ref)
    for a, b in zip(out_kiln, out_ref):
        assert_close(a, b, rtol=rtol, atol=atol)
    if any(isinstance(o, torch.Tensor) and o.requires_grad for o in out_ref):
        g_kiln = grads_of(out_kiln, [*state, *ins_kiln])
        g_ref = grads_of(out_ref, [*m_ref.parameters(), *m_ref.buffers(), *ins_ref])
        assert len(g_kiln) == len(g_ref)
        for a, b in zip(g_kiln, g_ref):
            assert_close(a, b, rtol=rtol, atol=atol)
    for (name, a), b in zip(m_kiln.named_buffers(), m_ref.buffers()):
        assert_close(a, b, rtol=rtol, atol=atol), name
    return fn
