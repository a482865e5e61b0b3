"""Computed matrix-product operands stored in the order their reads run
(``kernels/lowering/operand_layout.py``): the graphs, the checks, and the Triton cases.

``test_mm_operand_layout.py`` runs the C++ path with these helpers, and this file in a
child pytest with TRITON_INTERPRET=1 (set before triton is imported) for the Triton
path; its tests are skipped elsewhere."""
import copy
import os

import pytest
import torch
import torch.fx as fx

import kiln
from kiln import config
from kiln.kernels import compile as kcompile
from kiln.kernels import ir

from .plan_spy import record_plans

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}

triton_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (see test_mm_operand_layout.py)")


# --- graphs ------------------------------------------------------------------------------
def wgrad(a, g):
    """A weight gradient ``act(a).t() @ g``: the activation is computed for the product
    alone and read transposed (GPT-2's Conv1D weight gradient)."""
    h = aten.mul.Tensor(aten.tanh.default(a), a)
    return (aten.mm.default(aten.permute.default(h, [1, 0]), g),)


def wgrad_cast(a, g):
    """The same under autocast: an fp32 activation cast to bf16, then read transposed."""
    h = aten._to_copy.default(aten.mul.Tensor(aten.tanh.default(a), a), dtype=torch.bfloat16)
    return (aten.mm.default(aten.permute.default(h, [1, 0]), g),)


def linear_cast(b, x, w):
    """A Linear with its fp32 weight cast to bf16 for the product (autocast)."""
    wc = aten._to_copy.default(w, dtype=torch.bfloat16)
    return (aten.addmm.default(b, x, aten.t.default(wc)),)


def linear_scaled(b, x, w):
    """A Linear with its weight computed for the product: ``addmm(b, x, (2 * w).t())``."""
    return (aten.addmm.default(b, x, aten.t.default(aten.mul.Tensor(w, 2))),)


def bmm_t(q, k):
    """Attention scores on a scaled key read transposed: ``q @ (k * s).transpose(1, 2)``."""
    ks = aten.mul.Tensor(k, 0.125)
    return (aten.bmm.default(q, aten.transpose.int(ks, 1, 2)),)


def mm_natural(a, b):
    """An operand whose reads already run along its rows: stored as it is."""
    return (aten.mm.default(aten.relu.default(a), b),)


def saved_twice(w, x, y):
    """One transposed cast read by two products (stored at its node, not at a product)."""
    wt = aten.t.default(aten.mul.Tensor(w, 3))
    return (aten.mm.default(x, wt), aten.mm.default(y, wt))


# --- checks ------------------------------------------------------------------------------
def _contiguous_reads(body, var, other) -> int:
    """Loads contiguous along ``var`` that vary along ``other`` too (a per-row or
    per-column vector reads well in either order)."""
    return sum(1 for x in ir.walk(body) if isinstance(x, ir.Load) and not x.gather
               and abs(x.index.coef(var)) == 1 and x.index.coef(other) != 0)


def strided_feeders(buffers) -> list:
    """Kernel-computed buffers a library matrix product reads whose kernel reads its
    inputs across its innermost loop (more loads contiguous along another loop variable
    than along the innermost): the transposed copies this feature removes."""
    by = {b.name: b for b in buffers}
    bad = []
    for b in buffers:
        if not (isinstance(b, ir.Extern) and b.op in MATMULS):
            continue
        for a in list(b.args) + list(b.kwargs.values()):
            src = by.get(a.buf) if isinstance(a, ir.ExternArg) else None
            if not isinstance(src, ir.Pointwise):
                continue
            names = [f"x{i}" for i, s in enumerate(src.sizes) if int(s) > 1]
            if len(names) < 2:
                continue
            for v in names[:-1]:
                if _contiguous_reads(src.body, v, names[-1]) > \
                        _contiguous_reads(src.body, names[-1], v):
                    bad.append(src.name)
                    break
    return bad


def matmul_args(buffers) -> list:
    """(stored buffer, ExternArg) of every computed buffer a product reads."""
    by = {b.name: b for b in buffers}
    out = []
    for b in buffers:
        if isinstance(b, ir.Extern) and b.op in MATMULS:
            for a in b.args:
                if isinstance(a, ir.ExternArg) and isinstance(by.get(a.buf), ir.Pointwise):
                    out.append((by[a.buf], a))
    return out


def planned(fn, inputs, target):
    """(runtime, lowered buffers) of ``fn`` compiled for ``target``, no graph cache."""
    with config.patch(graph_cache=False, pad_mm="0"):
        rt, _ = kcompile.build(fx.symbolic_trace(fn), inputs, target)
        p = kcompile.plan(fx.symbolic_trace(fn), inputs, target)
    return rt, p.lowered.buffers


def close(got, want, k, eps=None):
    """Equal to rounding: ``eps`` of ``want``'s dtype (or the one given: an autocast
    step's values went through bf16) over a sum of ``k`` terms."""
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = eps or torch.finfo(want.dtype).eps
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=8 * eps, atol=8 * eps * k ** 0.5 * scale)


def check_transposed(fn, inputs, target, k):
    """Values as eager's; the one computed operand stored in its read order and passed
    to the product as a transposed view."""
    rt, bufs = planned(fn, inputs, target)
    for g, w in zip(rt(*inputs), fn(*inputs)):
        close(g, w, k)
    assert strided_feeders(bufs) == []
    args = matmul_args(bufs)
    assert args, ir.format_program(bufs)
    for src, a in args:
        assert tuple(src.strides) == ir.contiguous_strides(src.sizes)
        assert tuple(a.sizes)[-2:] == tuple(src.sizes)[-2:][::-1]
        assert a.strides[-2] == 1 and a.strides[-1] == src.sizes[-1], (a, src.sizes)
    return bufs


# --- training ----------------------------------------------------------------------------
class Conv1D(torch.nn.Module):
    """GPT-2's Linear: ``addmm(bias, x, weight)`` with the weight [in, out]."""

    def __init__(self, nx, nf):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(nx, nf) * nx ** -0.5)
        self.bias = torch.nn.Parameter(torch.randn(nf) * 0.1)

    def forward(self, x):
        out = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight)
        return out.view(*x.shape[:-1], -1)


class MLP(torch.nn.Module):
    """GPT-2's MLP block, twice: c_fc, tanh-GELU, c_proj, residual."""

    def __init__(self, d=64, h=256):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            [torch.nn.ModuleList([Conv1D(d, h), Conv1D(h, d)]) for _ in range(2)])

    def forward(self, x):
        for fc, proj in self.layers:
            # the activation in fp32 (GPT-2's gelu_new: its pow runs in fp32 under
            # autocast), cast back to bf16 by the next product
            x = x + proj(torch.nn.functional.gelu(fc(x).float(), approximate="tanh"))
        return x.float().square().mean()


def train_and_check(monkeypatch, autocast, k, target):
    """One training step compiled against eager: loss and every gradient; returns the
    plans the kernel compiler made (forward and backward)."""
    plans = record_plans(monkeypatch)
    torch.manual_seed(0)
    eager = MLP()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    x = torch.randn(4, 32, 64)
    ctx = (lambda: torch.autocast("cpu", dtype=autocast)) if autocast else \
        (lambda: torch.autocast("cpu", enabled=False))
    with config.patch(pad_mm="0", kernel_target=target):
        with ctx():
            loss = compiled(x)
        loss.backward()
    with ctx():
        want = eager(x)
    want.backward()
    eps = torch.finfo(autocast).eps if autocast else None
    close(loss, want, k, eps)
    for p, q in zip(model.parameters(), eager.parameters()):
        close(p.grad, q.grad, k, eps)
    assert len(plans) >= 2
    return plans


# --- the Triton path ----------------------------------------------------------------------
@triton_only
def test_triton_weight_gradient_of_a_cast_activation():
    torch.manual_seed(0)
    a, g = torch.randn(64, 48), torch.randn(64, 32).to(torch.bfloat16)
    check_transposed(wgrad_cast, [a, g], "triton", 64 * 40)


@triton_only
def test_triton_linear_with_a_cast_weight():
    torch.manual_seed(0)
    b, x, w = torch.randn(40).to(torch.bfloat16), torch.randn(16, 24).to(torch.bfloat16), torch.randn(40, 24)
    check_transposed(linear_cast, [b, x, w], "triton", 24 * 40)


@triton_only
def test_triton_bmm_with_a_transposed_computed_operand():
    torch.manual_seed(0)
    q, k = torch.randn(3, 16, 8).to(torch.bfloat16), torch.randn(3, 24, 8).to(torch.bfloat16)
    check_transposed(bmm_t, [q, k], "triton", 8 * 40)


@triton_only
def test_triton_training_step_under_autocast(monkeypatch):
    plans = train_and_check(monkeypatch, torch.bfloat16, k=1, target="triton")
    for p in plans:
        assert strided_feeders(p.lowered.buffers) == [], p.artefacts["ir"]
    # the backward's weight gradients read the recomputed GELU transposed: stored
    # [rows, hidden] in its read order and passed as the transposed view
    transposed = [a for p in plans for _, a in matmul_args(p.lowered.buffers)
                  if len(a.sizes) == 2 and a.strides[-2] == 1 and a.strides[-1] != 1]
    assert transposed, [p.artefacts["ir"] for p in plans]


# --- a loss gradient into its padded product operand ----------------------------------------
def loss_grad_head(lsm, t, w):
    """The LM head's backward under autocast (vocabulary 37): the fp32 gradient of the
    logits (a softmax backward: a row sum, then a pointwise), reshaped to [B, S, V],
    cast to bf16, reshaped back and multiplied by the bf16 weight (K = 37)."""
    s = aten.sum.dim_IntList(t, [1], True)
    g = aten.sub.Tensor(t, aten.mul.Tensor(aten.exp.default(lsm), s))
    g = aten._to_copy.default(aten.view.default(g, [2, 16, 37]), dtype=torch.bfloat16)
    return (aten.mm.default(aten.view.default(g, [32, 37]), w),)


@triton_only
def test_triton_loss_gradient_is_written_padded_in_bf16_once():
    """No fp32 copy of the gradient is stored: the kernel that computes it writes the
    bf16, zero-padded operand pad_mm makes (one pass over the logits' size)."""
    torch.manual_seed(0)
    lsm = torch.log_softmax(torch.randn(32, 37), 1)
    t, w = torch.randn(32, 37), torch.randn(37, 24).to(torch.bfloat16)
    with config.patch(graph_cache=False, pad_mm="always", pad_mm_min_flops=0):
        rt, art = kcompile.build(fx.symbolic_trace(loss_grad_head), [lsm, t, w], "triton")
        bufs = kcompile.plan(fx.symbolic_trace(loss_grad_head), [lsm, t, w], "triton").lowered.buffers
    assert any("padded" in line for line in art["passes"])
    got, want = rt(lsm, t, w)[0], loss_grad_head(lsm, t, w)[0]
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    computed = [b for b in bufs if isinstance(b, (ir.Pointwise, ir.Reduction))]
    assert not [b.name for b in computed if b.numel >= 32 * 37 and b.dtype == torch.float32], art["ir"]
    padded = [b for b in computed if b.dtype == torch.bfloat16 and int(b.sizes[-1]) == 40]
    assert len(padded) == 1 and any(isinstance(x, ir.Op) and x.name == "exp"
                                    for x in ir.walk(padded[0].body)), art["ir"]
