"""Symbolic sizes end to end: streams of sizes through kiln.compile on each backend,
each call compared with eager on fresh inputs, and the number of graphs captured
asserted — no more than torch.compile needs (automatic: 2; marked or dynamic=True: 1;
dynamic=False: one per size)."""
import logging

import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln.shapes.env import SpecializedMarkedDim

BACKENDS = ["eager", "aot_eager", pytest.param("kiln", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def _strict():
    with kiln.config.patch(suppress_errors=False):
        yield
    kiln.reset()


def graphs(c) -> int:
    return sum(len(e.graphs) for e in c.entries)


def stream(fn, make, sizes, backend, prepare=None, **kw):
    """``fn`` compiled, called on ``make(s)`` for each size, compared with eager."""
    torch.manual_seed(0)
    c = kiln.compile(fn, backend=backend, **kw)
    for s in sizes:
        args = make(s)
        ref = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
        if prepare is not None:
            prepare(*args)
        got = c(*args)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert c.skip is None, c.skip
    return c


def _pointwise_reduce(x):
    return (torch.sin(x) * 2 + x.exp()).sum(-1), x.amax(0)


def _pointwise_sum(x):
    return torch.sin(x) * 2 + x.exp(), x.sum(0)


def _matmul_chain(x, w1, w2):
    return torch.relu(x @ w1) @ w2


def _heads(x):
    b, s, d = x.shape
    y = x.view(b, s, 2, d // 2).transpose(1, 2)      # (b, 2, s, d/2)
    return y.reshape(b * 2, s, d // 2).transpose(1, 2).contiguous()


def _halves(x):
    n = x.size(0)
    return x[: n // 2] * 2 + x[n // 2:].sum(0), x[:, 1:]


def _pad(x):
    return F.pad(x, (1, 2)) * 3, F.pad(x, (0, 0, 2, 0), value=1.0)


def _norms(x):
    return F.layer_norm(torch.softmax(x, 1), (8,)), torch.log_softmax(x, -1)


AUTOMATIC = [
    (_pointwise_reduce, lambda s: (torch.randn(s, 8),), [3, 4, 5, 6, 7, 9]),
    (_matmul_chain, lambda s: (torch.randn(s, 8), torch.randn(8, 16), torch.randn(16, 4)), [3, 5, 8, 11]),
    (_heads, lambda s: (torch.randn(2, s, 8),), [3, 4, 6, 9, 10]),
    (_halves, lambda s: (torch.randn(s, 5),), [4, 6, 7, 10, 12]),
    (_pad, lambda s: (torch.randn(s, 6),), [3, 5, 7, 8]),
    (_norms, lambda s: (torch.randn(2, s, 8),), [3, 5, 6, 9]),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make,sizes", AUTOMATIC, ids=[f[0].__name__ for f in AUTOMATIC])
def test_automatic_dynamic_compiles_twice(fn, make, sizes, backend):
    c = stream(fn, make, sizes, backend)
    assert graphs(c) == 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn,make,sizes", AUTOMATIC[:3], ids=[f[0].__name__ for f in AUTOMATIC[:3]])
def test_dynamic_true_compiles_once(fn, make, sizes, backend):
    c = stream(fn, make, sizes, backend, dynamic=True)
    assert graphs(c) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_dynamic_false_compiles_per_size(backend):
    c = stream(_pointwise_reduce, lambda s: (torch.randn(s, 8),), [3, 4, 5, 6], backend, dynamic=False)
    assert graphs(c) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_mark_dynamic_on_the_first_call_compiles_once(backend):
    c = stream(_heads, lambda s: (torch.randn(2, s, 8),), [3, 4, 7, 9], backend,
               prepare=lambda x: kiln.mark_dynamic(x, 1))
    assert graphs(c) == 1
    assert "2 <= L['x'].size(1)" in [g.description for g in c.entries[0].guards]


def _scale(x, n):
    return x[:n] * n + n // 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_int_argument_becomes_symbolic(backend):
    c = stream(_scale, lambda n: (torch.randn(12, 3), n), [2, 3, 5, 7, 11], backend)
    assert graphs(c) == 2
    gm = c.entries[-1].graphs[0]
    ints = [n for n in gm.graph.nodes if n.op == "placeholder"
            and isinstance(n.meta.get("kiln_sym"), torch.SymInt)]
    assert len(ints) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_size_one_and_zero_are_specialised(backend):
    c = stream(_pointwise_sum, lambda s: (torch.randn(s, 8),), [4, 5, 1, 6, 0, 7], backend,
               dynamic=True)
    assert graphs(c) == 3       # sizes >= 2, size 1, size 0


def _branchy(x):
    if x.size(0) > 4:
        return x * 2
    return x - 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_guard_on_a_symbolic_relation(backend):
    c = stream(_branchy, lambda s: (torch.randn(s, 3),), [2, 3, 5, 6, 3, 9], backend, dynamic=True)
    assert graphs(c) == 2
    words = [[g.description for g in e.guards] for e in c.entries]
    assert "2 <= L['x'].size(0) <= 4" in words[0]
    assert "5 <= L['x'].size(0)" in words[1]


def test_recompile_log_names_the_failed_size_guard(caplog):
    c = kiln.compile(_branchy, backend="eager", dynamic=True)
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        c(torch.randn(3, 2))
        c(torch.randn(6, 2))
    assert "failed: 2 <= L['x'].size(0) <= 4 (now 6)" in caplog.text


def test_recompile_log_says_which_dim_became_dynamic(caplog):
    c = kiln.compile(_pointwise_reduce, backend="eager")
    with caplog.at_level(logging.INFO, logger="kiln.recompiles"):
        c(torch.randn(3, 8))
        c(torch.randn(5, 8))
    assert "L['x'].shape[0] was 3, now 5" in caplog.text
    assert "dim 0 of L['x'] is now dynamic" in caplog.text


def test_recompile_limit_says_how_to_mark_the_dim(caplog):
    c = kiln.compile(_pointwise_reduce, backend="eager", dynamic=False)
    with kiln.config.patch(recompile_limit=2), caplog.at_level(logging.WARNING, logger="kiln"):
        for s in (3, 4, 5):
            x = torch.randn(s, 8)
            torch.testing.assert_close(c(x), _pointwise_reduce(x))
    assert "hit recompile_limit (2)" in caplog.text
    assert "kiln.mark_dynamic(x, 0)" in caplog.text


def _fixed(x):
    return x + torch.ones(8)


def test_mark_dynamic_on_a_dim_the_code_fixes_raises():
    x = torch.randn(8)
    kiln.mark_dynamic(x, 0)
    with pytest.raises(SpecializedMarkedDim, match=r"L\['x'\].size\(0\) was marked dynamic.*x \+ torch.ones\(8\)"):
        kiln.compile(_fixed, backend="eager")(x)


def test_maybe_mark_dynamic_lets_the_code_fix_the_dim():
    x = torch.randn(8)
    kiln.maybe_mark_dynamic(x, 0)
    c = kiln.compile(_fixed, backend="eager")
    torch.testing.assert_close(c(x), _fixed(x))
    assert "L['x'].size(0) == 8" in [g.description.split("  (")[0] for g in c.entries[0].guards]


def test_mark_static_keeps_a_dim_static_under_dynamic_true():
    def make(s):
        x = torch.randn(s, 8)
        kiln.mark_static(x, 0)
        return (x,)
    c = stream(_pointwise_reduce, make, [3, 4, 5], "eager", dynamic=True)
    assert graphs(c) == 3


def test_backends_get_real_inputs_and_symbolic_placeholders():
    seen = []

    def backend(gm, example_inputs):
        seen.append((gm, [type(a) for a in example_inputs]))
        return gm.forward

    c = stream(_heads, lambda s: (torch.randn(2, s, 8),), [3, 4, 6, 9], backend)
    assert graphs(c) == 2 and len(seen) == 2
    gm, types = seen[1]
    assert types == [torch.Tensor]
    (ph,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert str(ph.meta["kiln_sym"][1]) == "s0" and ph.meta["kiln_sym"][0] == 2
    # the one graph computes its view sizes from its input
    assert any(n.op == "call_method" and n.target == "size" for n in gm.graph.nodes)


def test_symbolic_tracing_does_not_import_torch_dynamo():
    import subprocess
    import sys
    prog = """
import sys, torch, kiln
import torch.nn.functional as F
def f(x, w):
    y = torch.sin(x) + torch.cos(x) * 2
    return (torch.softmax(y @ w, -1).sum(), F.layer_norm(y, (8,)), F.pad(y, (1, 1)),
            y[: x.size(0) // 2], torch.cat([y, y]).triu(1))
c = kiln.compile(f, backend="aot_eager", dynamic=True)
for s in (4, 6):
    c(torch.randn(s, 8), torch.randn(8, 8))
assert len(c.entries) == 1
print("dynamo" if "torch._dynamo" in sys.modules else "clean")
"""
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "clean", r.stdout


# Python idioms over a symbolic size: each compared with eager over the stream, with the
# graphs they take (a number that has to be a plain int — range(), a list's length, a
# returned size, the number of chunks — is fixed by a guard: a graph for each value).
IDIOMS = [
    ("zeros_of_int", lambda x, n: x.sum() + torch.zeros(n, 2), lambda s: (torch.randn(3), s), 2),
    ("branch_on_int", lambda x, n: x * 2 if n else x, lambda s: (torch.randn(3), s), 2),
    ("float_of_size", lambda x: x / x.size(0) + x.size(0) ** 0.5, lambda s: (torch.randn(s, 3),), 2),
    ("factories", lambda x: x.new_zeros(x.shape) + torch.ones(x.size(0), 3)
     + torch.arange(x.size(0))[:, None], lambda s: (torch.randn(s, 3),), 2),
    ("expand", lambda x: x[:, :1].expand(-1, x.size(1) * 2) + torch.full((x.size(0), 6), 2.0),
     lambda s: (torch.randn(s, 3),), 2),
    ("reshape_minus_one", lambda x: x.reshape(x.size(0) * 3).view(-1, 3).flatten(),
     lambda s: (torch.randn(s, 3),), 2),
    ("negative_slice", lambda x: x[-x.size(0) // 2:], lambda s: (torch.randn(s, 3),), 2),
    ("chunk", lambda x: x.chunk(2), lambda s: (torch.randn(s, 3),), 2),
    ("split_count_fixed", lambda x: torch.split(x, x.size(0) // 2), lambda s: (torch.randn(s, 3),), 3),
    ("range_unrolled", lambda x: sum(x[i] for i in range(x.size(0))), lambda s: (torch.randn(s, 3),), 4),
    ("list_times_int", lambda x, n: x + torch.tensor([0.5] * n).sum(), lambda s: (torch.randn(3), s), 4),
    ("returned_size", lambda x: (x * 2, x.size(0) * 2, x.shape), lambda s: (torch.randn(s, 3),), 4),
    ("iterate_rows", lambda x: [r * 2 for r in x], lambda s: (torch.randn(s, 3),), 4),
    ("shapes_equal", lambda x, y: x * 2 if x.shape == y.shape else x,
     lambda s: (torch.randn(s, 4), torch.randn(s, 4)), 2),
    ("shape_is_a_size", lambda x: x + isinstance(x.shape, torch.Size) + (type(x.shape) is torch.Size),
     lambda s: (torch.randn(s, 4),), 2),
    ("shape_unpacked", lambda x: (lambda a, b: x.reshape(b, a))(*x.shape), lambda s: (torch.randn(s, 4),), 2),
    ("shape_tail", lambda x: x.view(*x.shape[:-1], 2, -1).sum(-1), lambda s: (torch.randn(2, s, 4),), 2),
    ("numel", lambda x: x.reshape(x.numel()) / x.numel(), lambda s: (torch.randn(s, 4),), 2),
    ("causal_mask", lambda x: x.masked_fill(
        torch.ones(x.size(0), x.size(0), dtype=torch.bool).triu(1)[:, :4], 0.0),
     lambda s: (torch.randn(s, 4),), 2),
    ("positions", lambda x: x + torch.arange(x.size(1), dtype=x.dtype).unsqueeze(0),
     lambda s: (torch.randn(3, s),), 2),
    ("conv1d", lambda x, w: F.conv1d(x, w, padding=1), lambda s: (torch.randn(1, 2, s), torch.randn(3, 2, 3)), 2),
    ("topk_sort_cumsum", lambda x: (x.topk(2, dim=0).values, x.cumsum(0).sort(0).values),
     lambda s: (torch.randn(s, 4),), 2),
    ("stack_einsum", lambda x: (torch.stack([x, x * 2], 1), torch.einsum("ij,kj->ik", x, x)),
     lambda s: (torch.randn(s, 4),), 2),
    ("min_max_of_sizes", lambda x: x[: min(x.size(0), 5)] * max(x.size(0), 2),
     lambda s: (torch.randn(s, 3),), 3),     # static 4; 2 <= s <= 5; 6 <= s
    ("causal_attention", lambda q: F.scaled_dot_product_attention(q, q, q, is_causal=True),
     lambda s: (torch.randn(1, 2, s, 8),), 2),
]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("name,fn,make,n", IDIOMS, ids=[i[0] for i in IDIOMS])
def test_python_idioms_on_symbolic_sizes(name, fn, make, n, backend):
    c = stream(fn, make, [4, 5, 6, 8], backend)
    assert graphs(c) == n and not c._callees


def _train(x, w):
    return torch.relu(x @ w).softmax(0).sum(), x.view(-1)[: x.size(0)].exp()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_through_symbolic_graphs(backend):
    """Backward through the symbolic graph (aot_eager and kiln trace its autograd once;
    kiln then compiles it per size): values and gradients match eager's."""
    c = kiln.compile(_train, backend=backend)
    w = torch.randn(8, 4, requires_grad=True)
    for s in (3, 5, 6, 9):
        x = torch.randn(s, 8, requires_grad=True)
        x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
        a, b = c(x, w)
        (a + b.sum()).backward()
        ra, rb = _train(x2, w2)
        (ra + rb.sum()).backward()
        torch.testing.assert_close((a, b, x.grad, w.grad), (ra, rb, x2.grad, w2.grad))
        w.grad = None
    assert graphs(c) == 2


def test_per_size_compiles_are_bounded():
    from kiln.backends_dynamic import PerSizeCompiled
    calls = []

    def backend(gm, ins):
        calls.append(tuple(ins[0].shape))
        return gm.forward

    import torch.fx as fx
    g = fx.symbolic_trace(lambda x: x * 2)
    with kiln.config.patch(dynamic_specializations=2):
        p = PerSizeCompiled(backend, g, lambda b, gm, ins: b(gm, ins))
        for s in (2, 3, 2, 4, 2, 3, 4):
            torch.testing.assert_close(p(torch.ones(s)), torch.ones(s) * 2)
    # bound 2: (4,) drops (3,), which comes back and drops (4,); two dropped, so the
    # stream cycles: (4,) runs the graph as it is
    assert calls == [(2,), (3,), (4,), (3,)]
    assert (p.variants.compiled_calls, p.variants.uncompiled_calls) == (6, 1)


def test_mark_dynamic_range_is_guarded():
    def make(s):
        x = torch.randn(s, 4)
        kiln.mark_dynamic(x, 0, min=2, max=16)
        return (x,)
    c = stream(_pointwise_reduce, make, [3, 9, 16], "eager")
    assert "2 <= L['x'].size(0) <= 16" in [g.description for g in c.entries[0].guards]
    assert graphs(c) == 1
    with pytest.raises(SpecializedMarkedDim, match="outside the range"):
        c(*make(20))


_TABLE = {4: 1.0, 5: 2.0, 6: 3.0, 8: 4.0}


def _int_uses(x, n):
    import math
    return (x * _TABLE[n] + x * [0, 1, 2, 3, 4, 5, 6, 7, 8][n] + x * math.sqrt(n)
            + x * n.bit_length() + x * divmod(n, 3)[0] + x * min(n, 5) + x * float(n)
            + torch.tensor([x.size(0), n]).sum(), f"n={n} s={x.size(0)}", str(n))


def test_a_symbolic_int_used_as_a_plain_int():
    """Dict keys, list indices, math, int methods, f-strings: the traced value, guarded
    (so one graph per value, each right)."""
    c = kiln.compile(_int_uses, backend="eager")
    for s in (4, 5, 6, 8):
        x = torch.randn(s)
        got, ref = c(x, s), _int_uses(x, s)
        torch.testing.assert_close(got[0], ref[0])
        assert got[1:] == ref[1:]
    assert graphs(c) == 4 and c.skip is None


@pytest.mark.parametrize("make", [
    lambda s: torch.randn(4, s).t(),
    lambda s: torch.randn(2, s, s, 3).permute(0, 3, 1, 2),      # channels-last
    lambda s: torch.randn(s, 1, 4).transpose(0, 2),
], ids=["transposed", "channels_last", "size_one_dim"])
def test_permuted_dense_inputs_are_dynamic_with_their_strides_guarded(make):
    def g(x):
        return x.softmax(-1) * 2, x.contiguous().view(-1), x * x.stride(0) + sum(x.stride())
    c = stream(g, lambda s: (make(s),), [3, 5, 6, 9], "eager")
    assert graphs(c) == 2
    assert any("stride" in gd.description for gd in c.entries[-1].guards)
    x = make(7).contiguous()          # same sizes, another layout: not the permuted entry
    torch.testing.assert_close(c(x), g(x))
    assert graphs(c) == 3


def _size_types(x):
    return (x * 2, type(x.shape[1:]).__name__, type(x.shape[:1]).__name__,
            type(x.shape + (1,)).__name__, type((1,) + x.shape).__name__,
            type(x.shape * 2).__name__, type(x.shape[0]).__name__,
            x.reshape(x.shape.numel()) * x.shape.numel())


def test_a_symbolic_shape_behaves_as_a_torch_size():
    """Slices, sums and repeats of ``x.shape`` are ``torch.Size``s, as in eager; its
    ``numel()`` stays symbolic."""
    c = kiln.compile(_size_types, backend="eager")
    for s in (3, 4, 5, 7):
        x = torch.randn(s, 2)
        got, ref = c(x), _size_types(x)
        assert got[1:7] == ref[1:7]
        torch.testing.assert_close((got[0], got[7]), (ref[0], ref[7]))
    assert graphs(c) == 2


@pytest.mark.parametrize("setting,expected", [("auto", 2), ("true", 1), ("false", 4)])
def test_the_dynamic_shapes_setting(setting, expected):
    """``KILN_DYNAMIC_SHAPES`` (config.dynamic_shapes) is the default that
    ``kiln.compile(dynamic=)`` overrides per function."""
    with kiln.config.patch(dynamic_shapes=setting):
        c = stream(_pointwise_reduce, lambda s: (torch.randn(s, 8),), [3, 4, 5, 6], "eager")
    assert graphs(c) == expected


def test_a_backend_failing_on_a_later_size_runs_the_graph_for_it(caplog):
    from kiln.backends_dynamic import PerSizeCompiled
    import torch.fx as fx

    def backend(gm, ins):
        if ins[0].shape[0] == 3:
            raise RuntimeError("no kernel for 3")
        return gm.forward

    g = fx.symbolic_trace(lambda x: x * 2)
    p = PerSizeCompiled(backend, g, lambda b, gm, ins: b(gm, ins))
    torch.testing.assert_close(p(torch.ones(2)), torch.ones(2) * 2)
    with kiln.config.patch(suppress_errors=True), caplog.at_level(logging.WARNING, logger="kiln"):
        torch.testing.assert_close(p(torch.ones(3)), torch.ones(3) * 2)
    assert "backend failed on new sizes" in caplog.text
    with kiln.config.patch(suppress_errors=False), pytest.raises(RuntimeError, match="no kernel"):
        PerSizeCompiled(backend, g, lambda b, gm, ins: b(gm, ins))(torch.ones(3))


def _bf16_linear(x, w, b):
    return F.linear(x, w, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_linear_stream_compiles_twice(backend):
    """``addmm`` on bf16 with a symbolic batch: PyTorch's Python meta kernel for it
    upcasts with ``Tensor.to``, whose C++ side read the batch size as an int, so every
    size recompiled (``fake_ops.META`` computes the result itself)."""
    w, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16)
    torch.manual_seed(0)
    c = kiln.compile(_bf16_linear, backend=backend)
    for s in [3, 5, 7, 9]:
        x = torch.randn(s, 8, dtype=torch.bfloat16)
        got, ref = c(x, w, b), _bf16_linear(x, w, b)
        assert got.dtype == ref.dtype and got.shape == ref.shape and got.stride() == ref.stride()
        torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
    assert graphs(c) == 2


def test_bf16_linear_traced_once_by_autograd(caplog):
    """The autograd stage's symbolic trace computes ``addmm``'s metadata too
    (``shapes/meta_calls``): a bf16 ``Linear`` with a batch marked dynamic is traced
    once for every size, not per size (PyTorch's Python meta fixed the batch to 3)."""
    w, b = torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16)
    c = kiln.compile(_bf16_linear)
    with caplog.at_level(logging.INFO, logger="kiln.fallbacks"):
        for s in [3, 5, 7]:
            x = torch.randn(s, 8, dtype=torch.bfloat16)
            if s == 3:
                kiln.mark_dynamic(x, 0)
            with torch.no_grad():
                got, ref = c(x, w, b), _bf16_linear(x, w, b)
            torch.testing.assert_close(got, ref, rtol=2e-2, atol=2e-2)
    assert "traces this graph per size" not in caplog.text
    assert graphs(c) == 1


def test_addmm_meta_checks_as_addmm_does():
    from kiln.shapes.fake_ops import META
    addmm = META[torch.ops.aten.addmm.default]
    m = torch.empty(5, 8, device="meta")
    w = torch.empty(8, 4, device="meta")
    assert addmm(torch.empty(4, device="meta"), m, w).shape == (5, 4)
    assert addmm(torch.empty(5, 4, device="meta"), m, w).is_contiguous()
    with pytest.raises(RuntimeError):
        addmm(torch.empty(3, device="meta"), m, w)
    with pytest.raises(RuntimeError):
        addmm(torch.empty(4, device="meta", dtype=torch.bfloat16), m, w)
    with pytest.raises(RuntimeError):
        addmm(torch.empty(4, device="meta"), m, torch.empty(7, 4, device="meta"))
