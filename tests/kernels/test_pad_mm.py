"""kernels/pad_mm.py: matrix products with a misaligned leading dimension run on
zero-padded operands, then a slice back.

The pass is for cuBLAS, so it runs on CUDA graphs; ``config.pad_mm = "always"`` runs it
on the CPU here, and ``pad_mm_min_flops = 0`` lets small products through. Every result
is compared with eager's (values, dtype, shape, strides of what the caller sees), and the
rewritten graphs are read to check which products were padded, by how much, and where
the padding went."""
import copy
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

import kiln
from kiln import config
from kiln.kernels import compile_aten_graph, pad_mm

aten = torch.ops.aten
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


@pytest.fixture
def forced():
    with config.patch(pad_mm="always", pad_mm_min_flops=0):
        yield


@pytest.fixture
def tf32():
    old = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    yield
    torch.backends.cuda.matmul.fp32_precision = old


def _close(got, want, k=64):
    assert got.dtype == want.dtype and got.shape == want.shape
    eps = torch.finfo(want.dtype).eps
    scale = max(1.0, want.abs().max().item())
    torch.testing.assert_close(got, want, rtol=4 * eps, atol=4 * eps * k ** 0.5 * scale)


def _rand(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype)


def _padded(fn, args):
    """The graph of ``fn`` after the pass, and its log lines."""
    return pad_mm.pad_matmuls(fx.symbolic_trace(fn), args)


def _products(gm):
    return [n for n in gm.graph.nodes if n.target in pad_mm.OPS]


def _pads(gm):
    return [n for n in gm.graph.nodes if n.target is aten.constant_pad_nd.default]


def _compiled_matches_eager(fn, args):
    """Compiled (C++ target) result equals eager's in value, dtype, shape and strides."""
    compiled = compile_aten_graph(fx.symbolic_trace(fn), args, target="cpp")
    got, want = compiled(*args), fn(*args)
    for g, w in zip(got, want):
        _close(g, w)
        assert g.stride() == w.stride()
    return compiled


# --- which dims are padded, per layout -----------------------------------------------------
def test_row_major_operands_pad_n(forced):
    a, b = _rand(16, 24), _rand(24, 37)
    gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
    (mm,) = _products(gm)
    assert tuple(mm.meta["val"].shape) == (16, 40)          # N 37 -> 40, M and K as they were
    assert len(_pads(gm)) == 1 and "N 37 -> 40" in notes[0]
    _close(gm(a, b)[0], a @ b)


def test_linear_weight_read_transposed_pads_k(forced):
    """``x @ w.t()`` (Linear): K is the row length of both x and w."""
    x, w = _rand(16, 37), _rand(24, 37)
    gm, notes = _padded(lambda x, w: (aten.mm.default(x, aten.t.default(w)),), [x, w])
    (mm,) = _products(gm)
    a, b = (n.meta["val"] for n in mm.args)
    assert tuple(a.shape) == (16, 40) and tuple(b.shape) == (40, 24)
    assert b.stride() == (1, 40)            # w padded in its own memory order, then transposed
    assert "K 37 -> 40" in notes[0]
    _close(gm(x, w)[0], x @ w.t())


def test_transposed_first_operand_pads_m(forced):
    """``g.t() @ x`` (a weight's gradient): M is the row length of g."""
    g, x = _rand(16, 37), _rand(16, 24)
    gm, notes = _padded(lambda g, x: (aten.mm.default(aten.t.default(g), x),), [g, x])
    (mm,) = _products(gm)
    assert tuple(mm.meta["val"].shape) == (40, 24) and "M 37 -> 40" in notes[0]
    _close(gm(g, x)[0], g.t() @ x)


def test_misaligned_m_of_row_major_operand_is_left(forced):
    """M is no operand's row length there: nothing for cuBLAS to align."""
    a, b = _rand(37, 16), _rand(16, 24)
    gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
    assert not _pads(gm) and not notes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_aligned_product_is_left(forced, dtype):
    a, b = _rand(16, 24, dtype=dtype), _rand(24, 40, dtype=dtype)
    gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
    assert not _pads(gm) and not notes


def test_small_product_is_left_with_a_note():
    a, b = _rand(16, 24), _rand(24, 37)
    with config.patch(pad_mm="always", pad_mm_min_flops=10 ** 6):
        gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
    assert not _pads(gm)
    assert len(notes) == 1 and "left" in notes[0] and "pad_mm_min_flops" in notes[0]


def test_setting_off_and_cpu_default_leave_the_graph():
    a, b = _rand(16, 24), _rand(24, 37)
    gm0 = fx.symbolic_trace(lambda a, b: (aten.mm.default(a, b),))
    for mode in ("0", "1"):              # "1": CUDA graphs only; these tensors are on the CPU
        with config.patch(pad_mm=mode, pad_mm_min_flops=0):
            gm, notes = pad_mm.pad_matmuls(gm0, [a, b])
        assert gm is gm0 and not notes


def test_fp32_padded_only_under_tf32(forced):
    a, b = _rand(16, 24, dtype=torch.float32), _rand(24, 37, dtype=torch.float32)
    old = torch.backends.cuda.matmul.fp32_precision
    try:
        for off in ("none", "ieee"):
            torch.backends.cuda.matmul.fp32_precision = off
            gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
            assert not _pads(gm) and "without TF32" in notes[0]
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        gm, notes = _padded(lambda a, b: (aten.mm.default(a, b),), [a, b])
        (mm,) = _products(gm)
        assert tuple(mm.meta["val"].shape) == (16, 40) and "multiples of 4" in notes[0]
    finally:
        torch.backends.cuda.matmul.fp32_precision = old
    _close(gm(a, b)[0], a @ b)


def test_addmm_bias_padded_with_the_result(forced):
    x, w, bias = _rand(16, 24), _rand(37, 24), _rand(37)
    fn = lambda b, x, w: (aten.addmm.default(b, x, aten.t.default(w), beta=0.5, alpha=2.0),)  # noqa: E731
    gm, _ = _padded(fn, [bias, x, w])
    (mm,) = _products(gm)
    assert tuple(mm.args[0].meta["val"].shape) == (40,)
    _close(gm(bias, x, w)[0], torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0))


def test_bmm_pads_k_and_n(forced):
    a, b = _rand(3, 16, 37), _rand(3, 37, 21)
    gm, notes = _padded(lambda a, b: (aten.bmm.default(a, b),), [a, b])
    (mm,) = _products(gm)
    assert tuple(mm.meta["val"].shape) == (3, 16, 24)
    assert "K 37 -> 40" in notes[0] and "N 21 -> 24" in notes[0]
    _close(gm(a, b)[0], torch.bmm(a, b))


def test_baddbmm_bias_padded_with_the_result(forced):
    bias, a, b = _rand(3, 16, 21), _rand(3, 16, 24), _rand(3, 24, 21)
    fn = lambda c, a, b: (aten.baddbmm.default(c, a, b, beta=0.5, alpha=2.0),)  # noqa: E731
    gm, notes = _padded(fn, [bias, a, b])
    (mm,) = _products(gm)
    assert tuple(mm.args[0].meta["val"].shape) == (3, 16, 24) and "N 21 -> 24" in notes[0]
    _close(gm(bias, a, b)[0], torch.baddbmm(bias, a, b, beta=0.5, alpha=2.0))


def test_result_read_through_its_storage_pads_k_only(forced):
    """``as_strided`` addresses the result's storage, which a slice of a padded result
    does not have: the product keeps its shape (K alone is padded, or nothing)."""
    def fn(a, b):
        y = aten.mm.default(a, b)
        return (aten.as_strided.default(y, [8, 21], [42, 1]),)
    a, b = _rand(16, 37), _rand(37, 21)
    gm, notes = _padded(fn, [a, b])
    (mm,) = _products(gm)
    assert tuple(mm.meta["val"].shape) == (16, 21) and "K 37 -> 40" in notes[0]
    _close(gm(a, b)[0], fn(a, b)[0])
    a, b = _rand(16, 24), _rand(24, 21)
    gm, notes = _padded(fn, [a, b])
    assert not _pads(gm) and "as_strided" in notes[0]


def test_product_off_the_cuda_device_is_left():
    """"1" pads CUDA products only; a CPU product of a CUDA graph stays."""
    gm = fx.symbolic_trace(lambda a, b: (aten.mm.default(a, b),))
    a, b = _rand(16, 24), _rand(24, 37)
    for n, v in zip(gm.graph.nodes, [a, b]):
        n.meta["val"] = v.to("meta")
    mm = next(n for n in gm.graph.nodes if n.target is aten.mm.default)
    mm.meta["val"], mm.meta["device"] = torch.empty(16, 37, dtype=a.dtype, device="meta"), a.device
    with config.patch(pad_mm="1", pad_mm_min_flops=0):
        assert pad_mm.plan_for(mm)[:3] == (0, 0, 0) and "not a CUDA device" in pad_mm.plan_for(mm)[3]
    with config.patch(pad_mm="always", pad_mm_min_flops=0):
        assert pad_mm.plan_for(mm)[:3] == (0, 0, 3)


# --- where the padding goes ---------------------------------------------------------------
def test_padding_goes_beneath_a_reshape_into_the_producer(forced):
    """The loss gradient ``[B, S, V]`` reshaped to ``[B*S, V]``: it is padded before the
    reshape, so the value is computed into the padded buffer (no unpadded copy)."""
    def fn(g, w):
        h = aten.mul.Tensor(g, 2)
        return (aten.mm.default(aten.view.default(h, [6, 37]), w),)
    g, w = _rand(2, 3, 37), _rand(37, 16)
    gm, _ = _padded(fn, [g, w])
    (pad,) = [p for p in _pads(gm) if p.args[0].op != "placeholder"]     # (w is padded too)
    assert pad.args[0].target is aten.mul.Tensor and tuple(pad.meta["val"].shape) == (2, 3, 40)
    assert not any(n.target is aten.view.default and tuple(n.meta["val"].shape) == (6, 37)
                   for n in gm.graph.nodes)         # the unpadded view is gone
    _close(gm(g, w)[0], fn(g, w)[0])


def test_reshape_of_a_transposed_value_is_padded_as_it_is(forced):
    """A reshape of a non-contiguous value copies it; its padding stays above it (a view
    of the padded transposed value would not be a reshape of it)."""
    def fn(y, w):
        p = aten.permute.default(y, [1, 0, 2])                   # [2, 3, 37], not contiguous
        return (aten.mm.default(aten.reshape.default(p, [6, 37]), w),)
    y, w = _rand(3, 2, 37), _rand(37, 16)
    gm, notes = _padded(fn, [y, w])
    assert "K 37 -> 40" in notes[0]
    assert any(p.args[0].target is aten.reshape.default for p in _pads(gm))
    _close(gm(y, w)[0], fn(y, w)[0])


def test_two_products_share_one_padded_operand(forced):
    """The two backward products of a Linear read the output gradient, one of them
    transposed: both read the same padded copy."""
    def fn(g, x, w):
        gx = aten.mm.default(g, w)                       # K = 37
        gw = aten.mm.default(aten.t.default(g), x)       # M = 37
        return gx, gw
    g, x, w = _rand(16, 37), _rand(16, 24), _rand(37, 24)
    gm, notes = _padded(fn, [g, x, w])
    assert len(notes) == 2
    g_pads = [p for p in _pads(gm) if p.args[0].op == "placeholder" and p.args[0].name == "g"]
    assert len(g_pads) == 1
    for got, want in zip(gm(g, x, w), fn(g, x, w)):
        _close(got, want)


def test_other_readers_read_a_slice_of_the_padded_value(forced):
    """A computed operand also read elsewhere is stored once, padded; the other reader
    reads the slice."""
    def fn(w, x):
        wc = aten.mul.Tensor(w, 3)                             # [37, 24]
        return aten.mm.default(x, aten.t.default(wc)), aten.add.Tensor(wc, 1)
    w, x = _rand(37, 24), _rand(16, 24)
    gm, _ = _padded(fn, [w, x])
    mul = next(n for n in gm.graph.nodes if n.target is aten.mul.Tensor)
    assert [u.target for u in mul.users] == [aten.constant_pad_nd.default]
    add = next(n for n in gm.graph.nodes if n.target is aten.add.Tensor)
    assert add.args[0].target is aten.slice.Tensor
    for got, want in zip(gm(w, x), fn(w, x)):
        _close(got, want)


# --- compiled, against eager ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_compiled_products_match_eager(forced, tf32, dtype):
    def fn(x, w, b, g):
        y = aten.addmm.default(b, x, aten.t.default(w))          # N = 37
        gx = aten.mm.default(g, w)                                # K = 37
        gw = aten.mm.default(aten.t.default(g), x)                # M = 37
        return y, gx, gw
    args = [_rand(16, 24, dtype=dtype), _rand(37, 24, dtype=dtype), _rand(37, dtype=dtype),
            _rand(16, 37, dtype=dtype)]
    compiled = _compiled_matches_eager(fn, args)
    assert sum("padded" in line for line in compiled.artefacts["passes"]) == 3


def test_compiled_output_keeps_eager_layout(forced):
    """A padded product the caller sees comes back contiguous, as eager's does, not as a
    window on the padded buffer."""
    a, b = _rand(16, 24), _rand(24, 37)
    compiled = _compiled_matches_eager(lambda a, b: (aten.mm.default(a, b),), [a, b])
    out = compiled(a, b)[0]
    assert out.is_contiguous() and out.untyped_storage().nbytes() == out.numel() * 2


class _TiedHead(torch.nn.Module):
    """An embedding and an LM head sharing the weight (GPT-2's), vocabulary 37."""

    def __init__(self, vocab=37, hidden=24):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.vocab = vocab

    def forward(self, idx, tgt):
        logits = self.head(torch.tanh(self.proj(self.emb(idx))))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, self.vocab).float(), tgt.view(-1))
        return loss, logits


def _train_step(model, idx, tgt, autocast):
    ctx = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        loss, logits = model(idx, tgt)
    loss.backward()
    return loss, logits


@pytest.mark.parametrize("dtype,autocast", [
    (torch.float32, torch.bfloat16),
    pytest.param(torch.float16, None, marks=pytest.mark.slow),
    pytest.param(torch.float32, None, marks=pytest.mark.slow)])
def test_training_matches_eager(forced, tf32, caplog, dtype, autocast):
    torch.manual_seed(0)
    eager = _TiedHead().to(dtype)
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    idx, tgt = torch.randint(0, 37, (2, 8)), torch.randint(0, 37, (2, 8))
    with caplog.at_level(logging.INFO, logger="kiln.passes"):
        loss, logits = _train_step(compiled, idx, tgt, autocast)
    want_loss, want_logits = _train_step(eager, idx, tgt, autocast)
    padded = [r.getMessage() for r in caplog.records if "padded" in r.getMessage()]
    assert len(padded) == 3, padded            # the head's product and its two gradients
    _close(loss, want_loss)
    _close(logits, want_logits)
    assert logits.stride() == want_logits.stride()
    for p, q in zip(model.parameters(), eager.parameters()):
        _close(p.grad, q.grad, k=256)


class _OddMLP(torch.nn.Module):
    """A hidden width of 37: the activation, saved for the backward, is an operand
    padded along its rows' length, so the backward receives a slice of the padded copy."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(24, 37)
        self.fc2 = torch.nn.Linear(37, 24)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x))).square().mean()


def test_training_with_a_padded_saved_activation_matches_eager(forced, caplog):
    torch.manual_seed(0)
    eager = _OddMLP()
    model = copy.deepcopy(eager)
    compiled = kiln.compile(model)
    x = torch.randn(16, 24)
    with caplog.at_level(logging.INFO, logger="kiln.passes"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(x)
        loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = eager(x)
    want.backward()
    assert sum("padded" in r.getMessage() for r in caplog.records) >= 3
    _close(loss, want)
    for p, q in zip(model.parameters(), eager.parameters()):
        _close(p.grad, q.grad, k=256)


def test_training_with_the_setting_off_pads_nothing(caplog):
    torch.manual_seed(0)
    model = _TiedHead()
    compiled = kiln.compile(model)
    idx, tgt = torch.randint(0, 37, (2, 8)), torch.randint(0, 37, (2, 8))
    with config.patch(pad_mm="0", pad_mm_min_flops=0), \
            caplog.at_level(logging.INFO, logger="kiln.passes"):
        _train_step(compiled, idx, tgt, torch.bfloat16)
    assert not [r for r in caplog.records if r.name == "kiln.passes"
                and r.getMessage().startswith("pad_mm")]


# --- the Triton path (interpreter) -------------------------------------------------------
@pytest.mark.slow
def test_triton_interpreter_pads_inside_the_producer_kernel(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "pad_mm_triton_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "passed" in r.stdout.splitlines()[-1] and "skipped" not in r.stdout.splitlines()[-1]


def test_compile_options_name_the_setting():
    """``options={"shape_padding": ...}`` (PyTorch's compiler's name) and ``"pad_mm"``."""
    from kiln.capture.compile_options import settings_for
    assert settings_for(None, {"shape_padding": False}) == {"pad_mm": "0"}
    assert settings_for(None, {"shape_padding": True}) == {"pad_mm": "1"}
    assert settings_for(None, {"pad_mm": "always"}) == {"pad_mm": "always"}
    with pytest.raises(ValueError):
        settings_for(None, {"pad_mm": "sometimes"})
