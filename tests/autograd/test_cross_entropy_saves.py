"""Cross-entropy training saves the logits and per-row values, not a log-softmax.

``autograd/log_softmax.py`` expands ``_log_softmax`` in training graphs (CORE op set) so
the min-cut saves the (bf16) logits the matmul made and the [rows, 1] max and log-sum;
the backward recomputes the log-softmax. Checked here: what the partition saves (the
feature's point: these fail without it), that inference and aot_eager graphs keep the
op whole, that the kernel compiler's forward writes no logits-sized buffer of its own,
and that losses and gradients match eager (and float64 at least as closely as eager).
"""
from __future__ import annotations

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F

import kiln
from kiln.autograd.log_softmax import gather_of_log_softmax, log_softmax_in_training
from kiln.autograd.partition import partition
from kiln.autograd.trace import trace_joint

aten = torch.ops.aten
N, H, V = 48, 16, 1000


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def _inputs(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=g, dtype=dtype)
    w = (torch.randn(V, H, generator=g) * 0.5).to(dtype).requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g)
    return h, w, y


def _lm_loss_bf16(h, w, y):
    # what bf16 autocast records: bf16 matmul, the logits cast to float32 for the loss
    return (F.cross_entropy((h.bfloat16() @ w.bfloat16().t()).float(), y),)


def _lm_loss_fp32(h, w, y):
    return (F.cross_entropy(h @ w.t(), y, label_smoothing=0.0),)


def _partition(f, inputs):
    tr = trace_joint(fx.symbolic_trace(f), inputs, train=True)
    return partition(tr.graph, tr.num_fw_outputs)


def _logits_sized(p):
    return [s for s in p.saved if s.meta["val"].numel() == N * V]


@pytest.mark.parametrize("f, dtype", [(_lm_loss_bf16, torch.bfloat16),
                                      (_lm_loss_fp32, torch.float32)], ids=["bf16", "fp32"])
def test_saves_the_logits_and_row_values(f, dtype):
    p = _partition(f, list(_inputs()))
    big = _logits_sized(p)
    # one logits-sized value: the matmul's own result (bf16 under autocast), not an
    # fp32 log-softmax; the rest is per row (max, log-sum) or smaller
    assert len(big) == 1, [(s.name, s.meta["val"].dtype) for s in p.saved]
    assert big[0].target is aten.mm.default and big[0].meta["val"].dtype == dtype
    row_values = [s for s in p.saved if tuple(s.meta["val"].shape) == (N, 1)]
    # the row max, and the sum of exponentials or its log
    assert len(row_values) == 2 and aten.amax.default in {s.target for s in row_values}
    assert {s.target for s in row_values} <= {aten.amax.default, aten.log.default,
                                              aten.sum.dim_IntList}
    # besides: h (for w's gradient), the targets, the count of those not ignored
    assert p.saved_bytes <= N * V * dtype.itemsize + 4 * N * H + 64 * N
    fw_ops = {n.target for n in p.forward.nodes}
    bw_ops = {n.target for n in p.backward.nodes}
    assert aten._log_softmax.default not in fw_ops
    assert aten._log_softmax_backward_data.default not in bw_ops
    # the backward recomputes the log-softmax from the saved logits
    assert aten.exp.default in bw_ops and aten.mm.default in bw_ops


def test_inference_keeps_log_softmax_whole():
    h, w, y = _inputs()
    for train, grad in ((False, True), (True, False)):
        ww = w.detach().requires_grad_(grad)
        tr = trace_joint(fx.symbolic_trace(_lm_loss_bf16), [h, ww, y], train=train)
        targets = {n.target for n in tr.graph.nodes}
        assert aten._log_softmax.default in targets and aten.amax.default not in targets


def test_aot_eager_keeps_log_softmax_whole():
    tr = trace_joint(fx.symbolic_trace(_lm_loss_bf16), list(_inputs()), train=True,
                     ops="eager")
    targets = {n.target for n in tr.graph.nodes}
    assert aten._log_softmax.default in targets
    assert aten._log_softmax_backward_data.default in targets


# --- end to end, compared with eager --------------------------------------------------

def _loss_fn(kind):
    def fn(logits, y, weight):
        if kind == "mean":
            return F.cross_entropy(logits, y)
        if kind == "sum":
            return F.cross_entropy(logits, y, reduction="sum")
        if kind == "none":
            return F.cross_entropy(logits, y, reduction="none").square().mean()
        if kind == "ignore":
            return F.cross_entropy(logits, y, ignore_index=3)
        if kind == "smoothing":
            return F.cross_entropy(logits, y, label_smoothing=0.1)
        if kind == "weight":
            return F.cross_entropy(logits, y, weight=weight)
        if kind == "log_softmax_nll":        # the two halves written out
            return F.nll_loss(F.log_softmax(logits, -1), y, ignore_index=-100)
        raise ValueError(kind)
    return fn


KINDS = ["mean", "sum", "none", "ignore", "smoothing", "weight", "log_softmax_nll"]


def _step(kind, autocast):
    loss = _loss_fn(kind)

    def step(h, w, y, weight):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = h @ w.t()
            return loss(logits, y, weight)
    return step


def _run(fn, h, w, y, weight):
    w = w.detach().clone().requires_grad_(True)
    h = h.detach().clone().requires_grad_(True)
    loss = fn(h, w, y, weight)
    loss.backward()
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", KINDS)
def test_cross_entropy_training_matches_eager(kind, autocast, backend):
    h, w, y = _inputs(seed=1)
    y[::5] = 3                                  # some targets ignored by "ignore"
    weight = torch.rand(V, generator=torch.Generator().manual_seed(2)) + 0.5
    step = _step(kind, autocast)
    want = _run(step, h, w, y, weight)
    got = _run(kiln.compile(step, backend=backend), h, w, y, weight)
    # bf16: the matmul and the gradients' cast round in bf16 (kiln's kernels may round
    # once where eager rounds twice); float32 otherwise
    tol = dict(rtol=2e-2, atol=2e-3) if autocast else dict(rtol=1e-5, atol=1e-6)
    for a, b, what in zip(got, want, ("loss", "h.grad", "w.grad")):
        assert a.dtype == b.dtype, what
        torch.testing.assert_close(a, b, **tol, msg=what)


@pytest.mark.parametrize("backend", ["aot_eager", "kiln"])
def test_logits_grad_matches_eager(backend):
    """The logits themselves as the differentiated input (a leaf): its gradient is
    log-softmax's backward alone."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(N, V, generator=g) * 4
    y = torch.randint(0, V, (N,), generator=g)

    def fn(x, y):
        return F.cross_entropy(x, y, label_smoothing=0.05)
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    la = kiln.compile(fn, backend=backend)(a, y)
    la.backward()
    lb = fn(b, y)
    lb.backward()
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7)


def test_infinite_and_masked_logits_match_eager():
    """-inf logits (a masked vocabulary) give -inf log-probabilities and zero gradient,
    a row of only -inf gives nan: the row max is subtracted as eager's kernel does."""
    logits = torch.randn(6, 16)
    logits[:, 10:] = float("-inf")
    logits[5] = float("-inf")
    y = torch.tensor([0, 1, 2, 3, 4, 5])

    def fn(x, y):
        lp = F.log_softmax(x, 1)
        return F.nll_loss(lp, y, reduction="none"), lp
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    (la, lpa) = kiln.compile(fn, backend="kiln")(a, y)
    (lb, lpb) = fn(b, y)
    torch.testing.assert_close(la, lb, equal_nan=True)
    torch.testing.assert_close(lpa, lpb, equal_nan=True)
    la[:5].sum().backward()
    lb[:5].sum().backward()
    torch.testing.assert_close(a.grad, b.grad, equal_nan=True)


def test_as_accurate_as_eager_against_float64():
    """Large vocabulary, logits far from zero: loss and gradient against a float64
    reference, no further off than eager's float32."""
    g = torch.Generator().manual_seed(4)
    n, v = 32, 1 << 15
    logits = torch.randn(n, v, generator=g) * 6 + 40
    y = torch.randint(0, v, (n,), generator=g)

    def fn(x, y):
        return F.cross_entropy(x, y)

    def run(f, x):
        x = x.clone().requires_grad_(True)
        loss = f(x, y)
        loss.backward()
        return loss.detach().double(), x.grad.double()
    ref = run(fn, logits.double())
    eager = run(fn, logits)
    got = run(kiln.compile(fn, backend="kiln"), logits)

    def err(a, r):
        return ((a - r).abs().max() / r.abs().max()).item()
    for k, what in enumerate(("loss", "grad")):
        e_eager, e_kiln = err(eager[k], ref[k]), err(got[k], ref[k])
        assert e_kiln <= 2 * e_eager + 1e-7, (what, e_kiln, e_eager)


def test_kernels_write_no_log_softmax(monkeypatch):
    """The compiled forward computes the loss from per-row max and log-sum: none of its
    own kernels writes a logits-sized buffer (it wrote the fp32 log-softmax, saved); the
    backward writes one, the gradient."""
    from kiln.kernels import compile as kcompile
    from kiln.kernels import ir
    built = []
    build = kcompile.build
    monkeypatch.setattr(kcompile, "build", lambda *a, **k: built.append(build(*a, **k)) or built[-1])
    h, w, y = _inputs(seed=5)
    step = _step("mean", True)
    got = _run(kiln.compile(step, backend="kiln"), h, w, y, None)
    want = _run(step, h, w, y, None)
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=2e-3)

    def written(rt):
        return [name for name, b in rt.buffers.items()
                if isinstance(b, (ir.Pointwise, ir.Reduction)) and ir.numel_of(b.sizes) >= N * V]
    assert not written(built[0][0])
    # the backward's one kernel recomputes the log-softmax where it is read; only the
    # logits' gradient is stored (nll_loss's zeros, full_like(log_softmax), read no value)
    assert len(written(built[1][0])) == 1, written(built[1][0])


# --- the decompositions themselves ----------------------------------------------------

def test_decomposition_is_eager_exactly_and_declines_what_it_must():
    x = (torch.randn(8, 50) * 3).requires_grad_(True)
    idx = torch.randint(0, 50, (8, 1))
    with torch.no_grad():
        assert log_softmax_in_training(x, 1) is NotImplemented      # no gradient taken
    out = log_softmax_in_training(x, 1)
    torch.testing.assert_close(out, aten._log_softmax.default(x, 1, False), rtol=0, atol=1e-6)
    picked = gather_of_log_softmax(out, 1, idx)
    assert torch.equal(picked, out.gather(1, idx))                  # the same arithmetic
    assert gather_of_log_softmax(out, 0, idx[:1].t()) is NotImplemented   # another dim
    assert gather_of_log_softmax(out, 1, idx[:4]) is NotImplemented  # a smaller index
    assert gather_of_log_softmax(x, 1, idx) is NotImplemented       # not a log-softmax
    with torch.no_grad():
        out.add_(1)                                                  # written since
    assert gather_of_log_softmax(out, 1, idx) is NotImplemented
    # a bf16 result stays whole (eager's CPU and CUDA kernels round it differently)
    xb = torch.randn(8, 50).bfloat16().requires_grad_(True)
    assert log_softmax_in_training(xb, -1) is NotImplemented


@pytest.mark.slow
def test_triton_kernels_store_no_log_softmax(tmp_path):
    """The same through kiln's Triton kernels (interpreter, CPU tensors): values as
    eager's, the forward stores no logits-sized buffer, the backward one."""
    import os
    import subprocess
    import sys
    pytest.importorskip("triton")
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_KERNEL_TARGET="triton",
               KILN_CACHE_DIR=str(tmp_path),
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, os.path.join(here, "cross_entropy_triton_case.py")],
                       env=env, capture_output=True, text=True, cwd=root, timeout=900)
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout[-4000:] + r.stderr[-3000:]
