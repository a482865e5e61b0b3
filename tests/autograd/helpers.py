"""Test helpers: eager comparison; ``lift`` (kiln.autograd.lift) makes graphs shaped
like kiln capture's from modules."""
from __future__ import annotations

import copy

import torch

from kiln.autograd.lift import lift  # noqa: F401  (tests import it from here)


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
    total = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype).to(o.device)).sum()
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
