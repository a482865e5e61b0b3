"""A Linear-GELU(tanh)-Linear training step (GPT-2's GELU, written out as HF's
``NewGELUActivation`` is) and what its backward plan stores, shared by
``test_recompute_pointwise.py`` (C++) and ``recompute_triton_cases.py`` (Triton under
the interpreter). The backward recomputes the forward's GELU from the saved
pre-activation: its pieces (``0.5*x``, the tanh, ``1 + tanh``) are read both by the GELU
output (for the weight gradient's matmul) and by GELU's backward (after another matmul).
"""
import math

import torch

import kiln
from kiln import config
from kiln.kernels import compile as kernels_compile
from kiln.kernels import ir

MM = torch.ops.aten.mm.default
B, T, H = 4, 8, 16


class NewGELU(torch.nn.Module):
    """``float_pow``: the cube in float32, as CUDA's autocast computes ``pow`` (CPU's
    does not): the tanh and ``1 + tanh`` are then float32 pieces of a bf16 input."""

    def __init__(self, float_pow=False):
        super().__init__()
        self.float_pow = float_pow

    def forward(self, x):
        cube = torch.pow(x.float() if self.float_pow else x, 3.0)
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * cube)))


def model(float_pow=False):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(H, 4 * H), NewGELU(float_pow),
                               torch.nn.Linear(4 * H, H))


def train_step(m, x, autocast_dtype=None, compiled=True):
    """Loss and gradients (input's, then parameters') of one step, through kiln's
    backend (or eagerly); ``autocast_dtype``: under CPU autocast. Returns (values,
    plans compiled meanwhile)."""
    def step(x):
        if autocast_dtype is not None:
            with torch.autocast("cpu", dtype=autocast_dtype):
                y = m(x)
        else:
            y = m(x)
        return y.float().square().mean()
    plans, orig = [], kernels_compile.plan

    def recording(*a, **k):
        p = orig(*a, **k)
        plans.append(p)
        return p
    kernels_compile.plan = recording
    try:
        for p in m.parameters():
            p.grad = None
        x = x.detach().clone().requires_grad_(True)
        loss = (kiln.compile(step, backend="kiln") if compiled else step)(x)
        loss.backward()
    finally:
        kernels_compile.plan = orig
    return [loss.detach(), x.grad] + [p.grad for p in m.parameters()], plans


def backward_plan(plans):
    """The backward's plan: the one with ``mm`` products (the forward's are ``addmm``)."""
    def n_mm(p):
        return sum(isinstance(b, ir.Extern) and b.op == MM for b in p.lowered.buffers)
    (bw,) = [p for p in plans if n_mm(p)]
    return bw


def gelu_kernel(plan):
    """(the kernel that recomputes the GELU from the saved pre-activation alone, the
    buffers it writes). Its reads: the saved input and what it computes itself."""
    bufs = plan.lowered.buffers
    (saved,) = [b.name for b in bufs if isinstance(b, ir.Input) and b.numel == B * T * 4 * H]
    found = []
    for g in plan.sched.groups:
        if g.extern is not None or g.alone is not None:
            continue
        reads = set().union(*(n.reads() for n in g.nodes))
        if saved in reads and reads <= {saved} | g.names:
            found.append(g)
    (g,) = found
    return g, [n for n in g.nodes if n.name not in plan.sched.locals]


def stored_activations(plan):
    """Computed buffers of the activation's size stored in memory (not locals)."""
    return [b for b in plan.lowered.buffers
            if isinstance(b, (ir.Pointwise, ir.Reduction)) and b.numel == B * T * 4 * H
            and b.name not in plan.sched.locals]


def read_by_matmul(plan, name) -> bool:
    return any(isinstance(b, ir.Extern) and b.op == MM and name in b.reads()
               for b in plan.lowered.buffers)


def check_gelu_step(autocast_dtype, tol, monkeypatch, float_pow=False):
    """The step against eager (values and gradients) and against itself with every
    shared value stored: bit for bit in float32 (the same ops in the same dtypes); in
    bfloat16 the stored copies rounded what later kernels read, so close. The plans'
    stores, with and without recomputing."""
    monkeypatch.setattr(config, "small_matmul_macs", 0)     # matmuls are library calls
    m = model(float_pow)
    x = torch.randn(B, T, H)
    ref, _ = train_step(m, x, autocast_dtype, compiled=False)
    got, plans = train_step(m, x, autocast_dtype)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)
    bw = backward_plan(plans)
    g, written = gelu_kernel(bw)
    # the GELU kernel writes the GELU output alone, for the weight gradient's matmul;
    # GELU's backward computes the pieces again from the saved pre-activation
    assert len(written) == 1, [n.name for n in written]
    assert read_by_matmul(bw, written[0].name)
    on_stored = stored_activations(bw)
    assert all(b.dtype == (autocast_dtype or torch.float32) for b in on_stored)

    monkeypatch.setattr(config, "recompute_pointwise", False)
    stored, plans_off = train_step(m, x, autocast_dtype)
    for a, b in zip(got, stored):
        if autocast_dtype is None:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-4)
    # 0.5*x, tanh, 1 + tanh and the output; and x in float32 for the float32 cube
    pieces = 3 + (float_pow and autocast_dtype is not None)
    _, written_off = gelu_kernel(backward_plan(plans_off))
    assert len(written_off) == pieces + 1, [(n.name, n.dtype) for n in written_off]
    assert len(stored_activations(backward_plan(plans_off))) == len(on_stored) + pieces
