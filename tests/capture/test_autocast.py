"""Autocast in compiled code: the ambient state at the call (guarded) and torch.autocast
blocks inside compiled functions, traced with their casts as graph nodes.

Each case runs eagerly and compiled on fresh copies of the inputs and compares values,
dtypes, gradients and the autocast state left after the call (also when the function
raises, and across a graph break inside a block); graph and break counts come from
``kiln.explain``. The eager backend runs the captured torch-level graph, so it must match
eager exactly. aot_eager and kiln compute in the same dtypes (checked exactly) but may
round differently: aot_eager's decompositions and kiln's fused kernels compute
bf16/fp16 ops in float32 and round once at the store (as inductor does) where eager
rounds after each op, so their values are compared with torch.testing's per-dtype
defaults (bf16: rtol 1.6e-2, two units in the last place; fp16: rtol 1e-3).
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.backends import lookup_backend

BACKENDS = ["eager", "aot_eager", "kiln"]
LOW = [torch.bfloat16, torch.float16]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(autouse=True)
def _fresh():
    kiln.reset()
    yield
    kiln.reset()


def amp_state():
    """The whole thread-local autocast state, nesting count included."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")) + (
        torch.is_autocast_cache_enabled(), nesting)


def _fresh_copies(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
            for a in args]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _close(got, want, backend):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    if backend == "eager":
        assert torch.equal(got, want) or (got.isnan() == want.isnan()).all() and torch.equal(
            got.nan_to_num(), want.nan_to_num())
    else:
        torch.testing.assert_close(got, want)


def run_both(fn, args, backend, ctx=contextlib.nullcontext, backward=True):
    """fn eagerly and compiled (fresh inputs each), compared; returns explain's output."""
    eager_args, compiled_args = _fresh_copies(args), _fresh_copies(args)
    compiled = kiln.compile(fn, backend=backend)
    results = []
    for f, a in ((fn, eager_args), (compiled, compiled_args)):
        with ctx():
            try:
                out = f(*a)
            except Exception as e:  # noqa: BLE001  (compared with eager's)
                out = e
            state = amp_state()
        results.append((out, state))
    (want, want_state), (got, got_state) = results
    assert got_state == want_state
    if isinstance(want, BaseException):
        assert type(got) is type(want) and str(got) == str(want), (got, want)
        return None
    else:
        for g, w in zip(_flat(got), _flat(want)):
            _close(g, w, backend)
        if backward and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            for outs in (want, got):
                sum(o.float().sum() for o in _flat(outs) if o.requires_grad).backward()
            for a, b in zip(eager_args, compiled_args):
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    assert b.grad is not None and b.grad.dtype == a.grad.dtype
                    _close(b.grad, a.grad, backend)
    with ctx():
        return kiln.explain(fn)(*_fresh_copies(args))


def _params(*shapes):
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def _mlp_args(device="cpu"):
    torch.manual_seed(0)
    return [torch.randn(6, 8, device=device)] + [p.to(device).detach().requires_grad_()
                                                  for p in _params((16, 8), (16,), (4, 16), (4,))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ambient_autocast(backend, dtype, device):
    """Called under autocast: the graph computes in autocast's dtypes, in one graph."""
    info = run_both(mlp, _mlp_args(device), backend, lambda: torch.autocast(device, dtype))
    assert (info.graph_count, info.graph_break_count) == (1, 0)
    assert not info.skipped_frames


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ops_whose_mixed_dtypes_fail_without_autocast(backend, device):
    """A conv with a bias taking the bf16 output of another: without autocast PyTorch
    rejects bf16 input with a float32 bias, so the op is recorded with autocast's casts
    (the zoo's alexnet and vgg under autocast)."""
    def fn(x, w1, b1, w2, b2):
        return F.conv2d(F.relu(F.conv2d(x, w1, b1)), w2, b2)
    torch.manual_seed(0)
    args = [torch.randn(2, 3, 8, 8, device=device)] + [
        p.to(device).detach().requires_grad_() for p in _params((4, 3, 3, 3), (4,), (5, 4, 3, 3), (5,))]
    info = run_both(fn, args, backend, lambda: torch.autocast(device, torch.bfloat16))
    assert (info.graph_count, info.graph_break_count) == (1, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_a_float32_mask_whose_kernel_casts_too(backend):
    """bf16 q, k, v and a float32 mask (a relative-position bias, as BEiT's), with
    gradients: autocast casts the mask, then CPU attention's math path casts q, k, v
    itself; only the mask's cast is recorded ahead of the op."""
    def fn(x, w, bias):
        q = F.linear(x, w).view(2, 4, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q * 0.5, q, attn_mask=bias)
    torch.manual_seed(0)
    args = [torch.randn(2, 4, 16)] + _params((16, 16), (1, 2, 4, 4))
    info = run_both(fn, args, backend, lambda: torch.autocast("cpu", torch.bfloat16))
    assert (info.graph_count, info.graph_break_count) == (1, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_block_inside(backend, dtype, device):
    def fn(x, w1, b1, w2, b2):
        with torch.autocast(device, dtype=dtype):
            y = mlp(x, w1, b1, w2, b2)
            z = y @ w2          # a second use of w2 in the block: autocast's cached cast
        return y, z.float().softmax(-1), x @ w1.t()
    info = run_both(fn, _mlp_args(device), backend)
    assert (info.graph_count, info.graph_break_count) == (1, 0)
    ops = [str(n.target) for n in info.graphs[0].graph.nodes if n.op == "call_method"]
    assert ops.count("to") == 5   # x, w1, b1, w2 (once: cached), b2; then y.float()


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_cast_once_per_block_as_eager(backend):
    """A float32 leaf that requires grad is cast once per outermost block (autocast's
    cache): its gradient sums in bfloat16 before the cast back, as in eager — exactly
    for the eager backend; cache_enabled=False casts per use."""
    def cached(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            return (x @ w) @ w + x @ w

    def uncached(x, w):
        with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
            return (x @ w) @ w + x @ w
    torch.manual_seed(1)
    for fn in (cached, uncached):
        run_both(fn, [torch.randn(8, 8), torch.randn(8, 8, requires_grad=True)], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_recompiles_when_the_ambient_state_changes(backend):
    compiled_graphs = []
    inner = lookup_backend(backend)

    def counting(gm, example_inputs):
        compiled_graphs.append(gm)
        return inner(gm, example_inputs)
    fn = kiln.compile(mlp, backend=counting)
    args = _mlp_args()
    states = [contextlib.nullcontext, lambda: torch.autocast("cpu", torch.bfloat16),
              lambda: torch.autocast("cpu", torch.float16), contextlib.nullcontext,
              lambda: torch.autocast("cpu", torch.bfloat16),
              lambda: torch.autocast("cpu", torch.bfloat16, cache_enabled=False)]
    for ctx in states:
        with ctx():
            want, got = mlp(*args), fn(*args)
        _close(got, want, backend)
    assert len(compiled_graphs) == 4    # off, bf16, fp16, bf16 without the cache


@pytest.mark.parametrize("backend", BACKENDS)
def test_nested_blocks_and_classes(backend):
    def fn(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            a = x @ w
            with torch.autocast("cpu", enabled=False):
                b = x @ w
                c = a.float() @ w
            with torch.autocast("cpu", torch.float16):
                d = x.t() @ x
            e = torch.cat([a, x]), torch.stack([a.float(), x])
        with torch.amp.autocast("cpu", dtype=torch.float16):
            f = x @ w
        return a, b, c, d, *e, f
    # the bfloat16 block is the outermost: its exit drops w's cached cast
    info = run_both(fn, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)], backend)
    assert (info.graph_count, info.graph_break_count) == (1, 0)
    # inside an ambient block it does not: the last matmul gets the bfloat16 cast and
    # refuses it (eager's error, compiled too)
    assert run_both(fn, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)], backend,
                    lambda: torch.autocast("cpu", torch.float16)) is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_cached_cast_reused_in_a_nested_block_of_another_dtype(backend):
    """PyTorch's cache is keyed by the weight alone: a float16 block inside a bfloat16
    one gets the bfloat16 cast, and the matmul refuses the mixed dtypes — compiled too."""
    def fn(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            a = x @ w
            with torch.autocast("cpu", torch.float16):
                return a, x @ w
    for w in (torch.randn(4, 4, requires_grad=True), torch.randn(4, 4)):  # cached / not
        run_both(fn, [torch.randn(4, 4), w], backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deprecated_cpu_autocast_class(backend):
    def fn(x, w):
        with torch.cpu.amp.autocast():
            return x @ w
    with pytest.warns(FutureWarning):
        run_both(fn, [torch.randn(4, 4), torch.randn(4, 4)], backend)


@torch.autocast("cpu", dtype=torch.bfloat16)
def _decorated(x, w):
    return F.linear(x, w).relu()


@pytest.mark.parametrize("backend", BACKENDS)
def test_decorator_form(backend):
    def fn(x, w):
        return _decorated(x, w) + 1, x @ w

    def made_inside(x, w):
        return torch.autocast("cpu", dtype=torch.float16)(lambda a: a @ w)(x)
    for f in (fn, made_inside):
        info = run_both(f, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)], backend)
        assert (info.graph_count, info.graph_break_count) == (1, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_queries_read_the_traced_state(backend):
    def fn(x):
        outs = [x * (2 if torch.is_autocast_enabled("cpu") else 3)]
        with torch.autocast("cpu", torch.float16):
            outs.append(x * (5 if torch.get_autocast_dtype("cpu") is torch.float16 else 7))
            outs.append(x * (11 if torch.is_autocast_enabled("cpu") else 13))
        return outs
    for ctx in (contextlib.nullcontext, lambda: torch.autocast("cpu", torch.bfloat16)):
        run_both(fn, [torch.randn(3)], backend, ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_break_inside_a_block(backend):
    """The step at the break runs in the block's state; the resume function starts
    inside the block and leaves it; the state after the call is eager's."""
    def fn(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            y = x @ w
            kiln.graph_break()
            z = (y @ w).relu()
        return y, z, x @ w
    info = run_both(fn, [torch.randn(4, 4), torch.randn(4, 4)], backend)
    assert (info.graph_count, info.graph_break_count) == (2, 1)
    for ctx in (lambda: torch.autocast("cpu", torch.float16), torch.no_grad):
        run_both(fn, [torch.randn(4, 4), torch.randn(4, 4)], backend, ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_state_after_an_exception(backend):
    """Raised by the program (the frame then runs eagerly), by an op at run time inside
    the compiled graph, and by the step at a graph break: eager's with-blocks unwind."""
    def raises(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            y = x @ w
            if x.shape[0] == 4:
                raise ValueError("boom")
        return y

    def index_error(x, w, i):
        with torch.autocast("cpu", torch.bfloat16):
            with torch.autocast("cpu", torch.float16):
                y = x @ w
                return y[i]

    def step_raises(x, w, i):
        with torch.autocast("cpu", torch.bfloat16):
            y = x @ w
            int(i.sum() * 100)      # a graph break
            return y[i]
    args = [torch.randn(4, 4), torch.randn(4, 4)]
    for ctx in (contextlib.nullcontext, lambda: torch.autocast("cpu", torch.float16)):
        run_both(raises, args, backend, ctx)
        run_both(index_error, args + [torch.tensor([7])], backend, ctx)
        run_both(step_raises, args + [torch.tensor([7])], backend, ctx)
        run_both(step_raises, args + [torch.tensor([2])], backend, ctx)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_op_autocast_changes_inside_breaks(backend):
    """einsum is not on autocast's lists but its inner bmm is: not a cast of its
    arguments, so it runs eagerly under the real state (a logged graph break)."""
    def fn(x, w):
        with torch.autocast("cpu", torch.bfloat16):
            return torch.einsum("ij,jk->ik", x, w) + 1, x @ w
    info = run_both(fn, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True)], backend)
    assert info.graph_break_count == 1
    assert "einsum under autocast" in info.break_reasons[0].reason


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32_ops_and_losses_under_autocast(backend):
    def fn(x, w, t):
        with torch.autocast("cpu", torch.bfloat16):
            y = x @ w
            return (F.cross_entropy(y, t), y.softmax(-1), y.log_softmax(-1), y.sum(),
                    F.mse_loss(y, x), F.layer_norm(y, (4,)))
    info = run_both(fn, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True),
                         torch.tensor([0, 1, 2, 3])], backend)
    assert info.graph_break_count == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_inner_autocast(backend):
    fn = kiln.compile(mlp, backend=backend, fullgraph=True)

    def blocked(*a):
        with torch.autocast("cpu", torch.bfloat16):
            return mlp(*a)
    args = _mlp_args()
    _close(kiln.compile(blocked, backend=backend, fullgraph=True)(*args), blocked(*args), backend)
    with torch.autocast("cpu", torch.float16):
        _close(fn(*args), mlp(*args), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_dtype_is_guarded(backend):
    """``torch.set_default_dtype`` between calls is a recompile; inside the function it
    is a graph break, and the code after it sees the new default."""
    def reads(x):
        return x + torch.ones(3), torch.arange(3.0), torch.tensor(1.5)

    def sets(x):
        torch.set_default_dtype(torch.float64)
        y = x + torch.ones(3)
        torch.set_default_dtype(torch.float32)
        return y, torch.ones(2)
    fn = kiln.compile(reads, backend=backend)
    x = torch.randn(3, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(dtype)
        try:
            for g, w in zip(fn(x), reads(x)):
                _close(g, w, backend)
        finally:
            torch.set_default_dtype(torch.float32)
    run_both(sets, [torch.randn(3)], backend)
    assert torch.get_default_dtype() == torch.float32


_CROSS_ENTROPIES = [
    lambda y, t, wt: F.cross_entropy(y, t),
    lambda y, t, wt: F.cross_entropy(y, t, reduction="none", ignore_index=2),
    lambda y, t, wt: F.cross_entropy(y, t, weight=wt, reduction="sum"),
    lambda y, t, wt: F.cross_entropy(y[0], t[1]),
]


def _refuse_cross_entropy(monkeypatch):
    """explicit_call refusing cross_entropy, as CUDA's autocast makes it (on the CPU the
    call is a cast of its arguments, which explicit_call would record)."""
    from kiln.capture import autocast as AC
    plain = AC.AmpTracker.explicit_call

    def refuse(self, out, kind, target, args, kwargs):
        if target is F.cross_entropy:
            raise AC.Unsupported("K0034", "cross_entropy (refused by the test)")
        return plain(self, out, kind, target, args, kwargs)
    monkeypatch.setattr(AC.AmpTracker, "explicit_call", refuse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_entropy_whose_cast_is_inside_it(backend, device, monkeypatch):
    """CUDA autocast casts cross_entropy's log-probabilities (inside the composite, before
    nll_loss), not its arguments: recorded as log_softmax in the input's dtype then
    nll_loss, each under autocast, no graph break — where those parts reach the
    dispatcher as the whole call does. On the CPU the parts are checked with the call
    refused: float32 logits (the same dispatches: rewritten) and bfloat16 ones (CPU
    autocast casts the input itself: not rewritten, a break, eager's values)."""
    if device == "cpu":
        _refuse_cross_entropy(monkeypatch)
    calls = []
    from kiln.capture import autocast_composites
    real = autocast_composites.REWRITES[F.cross_entropy]
    monkeypatch.setitem(autocast_composites.REWRITES, F.cross_entropy,
                        lambda *a: calls.append(a) or real(*a))
    for wide in (True, False):
        for form in _CROSS_ENTROPIES:       # one each: gradients in one order, as eager's
            def fn(x, w, t, wt):
                with torch.autocast(device, torch.bfloat16):
                    y = x @ w
                    return form(y.float() if wide else y, t, wt)
            torch.manual_seed(0)
            args = [torch.randn(4, 4, device=device),
                    torch.randn(4, 4, device=device, requires_grad=True),
                    torch.tensor([0, 1, 2, 3], device=device), torch.rand(4, device=device)]
            info = run_both(fn, args, backend)
            rewritten = device == "cuda" or wide
            assert (info.graph_break_count == 0) == rewritten, info.break_reasons
    assert calls


def test_cross_entropy_smoothing_still_breaks(monkeypatch):
    """A form the rewrite does not know (label smoothing) keeps the break and its reason."""
    _refuse_cross_entropy(monkeypatch)

    def fn(x, w, t):
        with torch.autocast("cpu", torch.bfloat16):
            return F.cross_entropy((x @ w).float(), t, label_smoothing=0.1)
    info = run_both(fn, [torch.randn(4, 4), torch.randn(4, 4, requires_grad=True),
                         torch.tensor([0, 1, 2, 3])], "aot_eager")
    assert info.graph_break_count == 1 and "refused by the test" in info.break_reasons[0].reason
