"""Reshapes that merge dims of a lazy value (``kernels/lowering/reindex.py``): the graphs,
the checks, and the Triton cases.

``test_merge_reshape.py`` runs the C++ path with these helpers, and this file in a child
pytest with TRITON_INTERPRET=1 (set before triton is imported) for the Triton path; its
tests are skipped elsewhere. Each graph says how many elementwise buffers its lowering
stores: 0 where the merged value stays lazy (computed inside its reader), 1 where the
merge cannot be said without a division and the value is stored first."""
import os

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils import _pytree as pytree

import kiln
from kiln import config
from kiln.kernels import compile as kcompile
from kiln.kernels import ir
from kiln.kernels.lowering.base import View

from .plan_spy import record_plans

aten = torch.ops.aten

triton_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs TRITON_INTERPRET=1 (see test_merge_reshape.py)")


# --- graphs: (function, input makers, elementwise buffers stored) -----------------------
def merge_then_sum(x):
    return (aten.sum.dim_IntList(aten.view.default(aten.relu.default(x), [32, 37]), [1]),)


def merge_three_reduce_merged(x):
    """[2, 3, 5, 7] -> [30, 7], reduced over the merged dim."""
    y = aten.view.default(aten.exp.default(x), [30, 7])
    return (aten.sum.dim_IntList(y, [0]),)


def merge_all(x):
    return (aten.sum.default(aten._unsafe_view.default(aten.mul.Tensor(x, 2.0), [120])),)


def merge_size_one(x):
    """Size-1 dims in the input and the output: [2, 1, 16, 1, 37] -> [32, 1, 37]."""
    y = aten.reshape.default(aten.add.Tensor(x, 1.0), [32, 1, 37])
    return (aten.amax.default(y, [2]),)


def merge_then_transpose(x):
    y = aten.view.default(aten.relu.default(x), [32, 37])
    return (aten.sum.dim_IntList(aten.t.default(y), [1]),)


def split_and_merge(x):
    """[6, 4] -> [4, 6]: neither a split nor a merge alone."""
    return (aten.sum.dim_IntList(aten.view.default(aten.exp.default(x), [4, 6]), [1]),)


def merge_log_softmax(x):
    """Read three times by the log-softmax (two reductions and its result)."""
    y = aten.view.default(aten.mul.Tensor(x, 0.5), [32, 37])
    return (aten._log_softmax.default(y, 1, False),)


def transposed_merge(x):
    """[16, 2, 37] read as [2, 16, 37], then merged: the merged index would need a
    division — stored first."""
    y = aten.relu.default(aten.permute.default(x, [1, 0, 2]))
    return (aten.sum.dim_IntList(aten.reshape.default(y, [32, 37]), [1]),)


def inner_broadcast_merge(x, b):
    """A bias broadcast along the outer of the merged dims: its read moves with the
    inner dim alone (``i % 16``) — stored first."""
    y = aten.add.Tensor(x, b)
    return (aten.sum.dim_IntList(aten.view.default(y, [32, 37]), [1]),)


def merge_to_output(x):
    """The merged value is the graph's output: stored once, as the output."""
    return (aten.view.default(aten.exp.default(x), [32, 37]),)


def gather_merged(x, y):
    """A loss's pick of each row's target from merged fp64 logits (cast from fp32):
    read where picked, never stored."""
    lg = aten.view.default(aten._to_copy.default(x, dtype=torch.float64), [32, 37])
    picked = aten.gather.default(lg, 1, aten.unsqueeze.default(y, 1))
    return (aten.sum.default(aten.sub.Tensor(picked, aten.amax.default(lg, [1], True))),)


def gather_lazy(x, y):
    """A gather from a lazy value (no reshape): read where picked."""
    return (aten.gather.default(aten.mul.Tensor(x, 2.0), 1, y),)


def gather_masked(x, z, y):
    """A gather along dim 1 from a cat along dim 0: the cat's masked loads take the
    gather's bounds mask beside their own."""
    return (aten.gather.default(aten.cat.default([aten.exp.default(x), z], 0), 1, y),)


def gather_larger(x, y):
    """A gather of more elements than the value has: stored, then gathered."""
    return (aten.gather.default(aten.exp.default(x), 1, y),)


def gather_cat(x, z, y):
    """A value whose index along the gathered dim is a value (a cat's bounds): stored."""
    return (aten.gather.default(aten.cat.default([aten.exp.default(x), z], 1), 1, y),)


def _randn(*s):
    return lambda g: torch.randn(*s, generator=g, dtype=torch.float64).float()


def _strided(full, index):
    """A non-contiguous input: a window of a larger tensor."""
    return lambda g: torch.randn(*full, generator=g)[index]


def _targets(n, v, k=None):
    return lambda g: torch.randint(0, v, (n,) if k is None else (n, k), generator=g)


CASES = {
    "merge_then_sum": (merge_then_sum, [_randn(2, 16, 37)], 0),
    "merge_three_reduce_merged": (merge_three_reduce_merged, [_randn(2, 3, 5, 7)], 0),
    "merge_all": (merge_all, [_randn(4, 6, 5)], 0),
    "merge_size_one": (merge_size_one, [_randn(2, 1, 16, 1, 37)], 0),
    "merge_then_transpose": (merge_then_transpose, [_randn(2, 16, 37)], 0),
    "split_and_merge": (split_and_merge, [_randn(6, 4)], 0),
    "merge_log_softmax": (merge_log_softmax, [_randn(2, 16, 37)], 0),
    # a window whose rows still step evenly (every other row): merges
    "strided_input_merges": (merge_then_sum, [_strided((2, 32, 37), (slice(None), slice(None, None, 2)))], 0),
    # the first 16 of 20 rows: the batch step is not 16 rows — stored first
    "strided_input_stored": (merge_then_sum, [_strided((2, 20, 37), (slice(None), slice(0, 16)))], 1),
    "transposed_merge": (transposed_merge, [_randn(16, 2, 37)], 1),
    "inner_broadcast_merge": (inner_broadcast_merge, [_randn(2, 16, 37), _randn(16, 1)], 1),
    "merge_to_output": (merge_to_output, [_randn(2, 16, 37)], 0),
    "gather_merged": (gather_merged, [_randn(2, 16, 37), _targets(32, 37)], 0),
    "gather_lazy": (gather_lazy, [_randn(4, 7), _targets(4, 7, 2)], 0),
    "gather_masked": (gather_masked, [_randn(3, 5), _randn(2, 5), _targets(5, 5, 2)], 0),
    "gather_larger": (gather_larger, [_randn(4, 3), _targets(4, 3, 6)], 1),
    "gather_cat": (gather_cat, [_randn(4, 3), _randn(4, 2), _targets(4, 5, 1)], 1),
}


# --- checks ------------------------------------------------------------------------------
def stored_elementwise(lowered) -> list:
    """Elementwise buffers the kernels compute besides the graph's outputs (reductions
    and the index checks aside)."""
    outs = {v.buf for v in pytree.tree_leaves(lowered.outputs) if isinstance(v, View)}
    return [b for b in lowered.buffers if isinstance(b, ir.Pointwise) and b.name not in outs]


def check_case(name, target):
    """The case's graph compiled for ``target``: values, dtypes, shapes and strides as
    eager's, no further from a float64 reference than eager; the elementwise buffers
    stored as the case says."""
    fn, makers, n_stored = CASES[name]
    g = torch.Generator().manual_seed(0)
    inputs = [m(g) for m in makers]
    with config.patch(graph_cache=False):
        rt, art = kcompile.build(fx.symbolic_trace(fn), inputs, target)
        p = kcompile.plan(fx.symbolic_trace(fn), inputs, target)
    got, want = rt(*inputs), fn(*inputs)
    ref = fn(*[t.double() if t.is_floating_point() else t for t in inputs])
    for a, b, r in zip(got, want, ref):
        assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), name
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        if b.is_floating_point():
            err = (a.double() - r.double()).abs().max().item()
            assert err <= 2 * (b.double() - r.double()).abs().max().item() + 1e-6, (name, err)
    stored = stored_elementwise(p.lowered)
    assert len(stored) == n_stored, art["ir"]
    return p


# --- an LM loss: bf16 logits cast to fp32, flattened, cross-entropy -----------------------
def lm_plans(target, monkeypatch, model, make_inputs, tol, autocast=torch.bfloat16):
    """One training step of ``model`` (returning its loss) compiled by kiln for
    ``target`` against eager: loss and every gradient. Returns the plans made
    (forward, backward)."""
    plans = record_plans(monkeypatch)
    monkeypatch.setattr(config, "kernel_target", target)
    kiln.reset()
    inputs = make_inputs()

    def step(*args):
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            return model(*args)

    def run(f):
        for q in model.parameters():
            q.grad = None
        loss = f(*inputs)
        loss.backward()
        return [loss.detach()] + [q.grad.clone() for q in model.parameters()]
    want = run(step)
    got = run(kiln.compile(step, backend="kiln"))
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **tol)
    return plans


class Head(torch.nn.Module):
    """An LM head and its loss as transformers' ForCausalLMLoss computes them:
    ``logits.float()``, flattened to [B*S, V], cross-entropy ignoring -100."""

    def __init__(self, h=12, v=300):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(v, h) * 0.3)
        self.v = v

    def forward(self, x, y):
        logits = x @ self.w.t()
        return F.cross_entropy(logits.float().view(-1, self.v), y.view(-1), ignore_index=-100)


def head_inputs(b=2, s=8, h=12, v=300):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, s, h, generator=g)
    y = torch.randint(0, v, (b, s), generator=g)
    y[0, :3] = -100
    return lambda: (x, y)


def logits_sized(plan, n, dtype=None) -> list:
    """Elementwise buffers of ``n`` elements or more the plan stores in memory."""
    return [(b.name, b.dtype) for b in plan.lowered.buffers
            if isinstance(b, (ir.Pointwise, ir.Reduction)) and b.numel >= n
            and b.name not in plan.sched.locals and (dtype is None or b.dtype == dtype)]


def gpt2(v=257, s=16):
    """transformers' GPT2LMHeadModel, 2 layers, no dropout; its loss is
    ForCausalLMLoss (``logits.float()``, flattened, cross-entropy ignoring -100)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=24, n_head=2, vocab_size=v, n_positions=s,
                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    m = GPT2LMHeadModel(cfg)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids, labels):
            return self.m(input_ids=ids, labels=labels).loss
    return Loss()


def gpt2_inputs(b=2, s=16, v=257):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, v, (b, s), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100
    return lambda: (ids, labels)


# --- the Triton path (under the interpreter, in a child pytest) --------------------------
@triton_only
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_triton(name):
    check_case(name, "triton")


@triton_only
@pytest.mark.parametrize("pad", ["0", "always"])
def test_lm_head_stores_no_fp32_logits_triton(monkeypatch, pad):
    """``pad="always"``: the products padded to aligned sizes as on a GPU (V = 300 is
    not): the gradient then goes from the saved logits into its padded bf16 copy."""
    monkeypatch.setattr(config, "pad_mm", pad)
    monkeypatch.setattr(config, "pad_mm_min_flops", 0)
    plans = lm_plans("triton", monkeypatch, Head(), head_inputs(),
                     dict(rtol=2e-2, atol=2e-3))
    fw, bw = plans
    assert logits_sized(fw, 16 * 300, torch.float32) == [], fw.artefacts["ir"]
    assert logits_sized(bw, 16 * 300, torch.float32) == [], bw.artefacts["ir"]
    # the backward stores the bf16 gradient alone (padded or not), for the product
    assert [d for _, d in logits_sized(bw, 16 * 300)] == [torch.bfloat16], bw.artefacts["ir"]


@triton_only
def test_gpt2_stores_no_fp32_logits_triton(monkeypatch):
    """The whole model under bf16 autocast: its loss's fp32 logits are stored in
    neither graph (the backward stores the bf16 logits' gradient, for the products)."""
    n = 2 * 16 * 257
    fw, bw = lm_plans("triton", monkeypatch, gpt2(), gpt2_inputs(),
                      dict(rtol=3e-2, atol=3e-3))
    assert logits_sized(fw, n, torch.float32) == [], fw.artefacts["ir"]
    assert logits_sized(bw, n, torch.float32) == [], bw.artefacts["ir"]
