"""IR verifier, fusion decisions, buffer reuse, fallbacks, logs, the disk cache."""
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

from kiln.debug.logs import log_for
from kiln.kernels import compile_aten_graph, ir
from kiln.kernels.compile import build

from .cases import CASES, batch_norm_train_graph


@pytest.fixture(autouse=True)
def _library_matmuls(monkeypatch):
    """Here mm is the library call that splits kernels and whose buffers the runtime
    plans around: keep small ones library calls (``config.small_matmul_macs`` would
    compile them into the C++ kernels; ``test_small_matmul.py`` covers that)."""
    from kiln import config
    monkeypatch.setattr(config, "small_matmul_macs", 0)

aten = torch.ops.aten
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _chain(x, y):
    a = aten.mul.Tensor(x, y)
    for _ in range(3):
        a = aten.sigmoid.default(aten.add.Tensor(a, 1.0))
    return (aten.div.Tensor(a, 3.0),)


def _softmax(x):
    return (aten._softmax.default(x, -1, False),)


def test_verifier_rejects_bad_ir():
    a = ir.Input("in0", (4,), (1,), torch.float32)
    body = ir.Load("in0", ir.Affine.var("x3"), torch.float32)     # x3 is not a loop var
    bad = ir.Pointwise("buf0", (4,), (1,), torch.float32, body=body)
    with pytest.raises(ir.IRError):
        ir.verify([a, bad])
    early = ir.Pointwise("buf0", (4,), (1,), torch.float32,
                         body=ir.Load("buf1", ir.Affine.var("x0"), torch.float32))
    with pytest.raises(ir.IRError):
        ir.verify([a, early])
    good = ir.Pointwise("buf0", (4,), (1,), torch.float32,
                        body=ir.Load("in0", ir.Affine.var("x0"), torch.float32))
    ir.verify([a, good])
    assert "pointwise in0[x0]" in ir.format_program([a, good])


def test_pointwise_chain_is_one_kernel_with_no_temporaries():
    x, y = torch.randn(33, 17), torch.randn(17)
    rt, art = build(fx.symbolic_trace(_chain), [x, y], "cpp")
    assert len(rt.sched.groups) == 1
    assert art["ir"].count("pointwise") == 1       # the chain inlined into one body
    assert len(rt.sched.slot_specs) == 1           # only the output is stored


def test_softmax_is_one_kernel_with_local_reductions():
    x = torch.randn(9, 40)
    rt, art = build(fx.symbolic_trace(_softmax), [x], "cpp")
    g, = rt.sched.groups
    assert [k for k, _ in g.loops] == ["inner", "inner", "inner"]
    assert len(rt.sched.locals) == 2               # max and sum never touch memory
    assert "#pragma omp simd reduction(max:" in art["source"]
    torch.testing.assert_close(rt(x)[0], torch.softmax(x, -1))


def test_horizontal_fusion_and_buffer_reuse():
    def f(x):
        a = aten.exp.default(x)
        b = aten.sum.dim_IntList(a, [1])         # a has two users: each computes it
        c = aten.mul.Tensor(aten.add.Tensor(a, 1.0), aten.unsqueeze.default(b, 1))
        d = aten.mm.default(c, aten.t.default(c))  # library call splits kernels
        e = aten.relu.default(d)
        h = aten.exp.default(aten.mm.default(e, e))
        return (h,)
    x = torch.randn(6, 6)
    rt, art = build(fx.symbolic_trace(f), [x], "cpp")
    kinds = ["extern" if g.extern is not None else "kernel" for g in rt.sched.groups]
    assert kinds == ["kernel", "extern", "kernel", "extern", "kernel"]
    # b and c (each computing a: lowering/recompute.py) fuse into the first kernel; the
    # dead buffer for relu is reused or freed
    assert len(rt.sched.groups[0].nodes) == 2
    torch.testing.assert_close(rt(x)[0], fx.symbolic_trace(f)(x)[0], rtol=1e-4, atol=1e-4)


def test_late_reduction_epilogue_joins_its_reduction_kernel():
    # BatchNorm's running-statistics update reads the batch statistics but comes after
    # the normalised output: it is fused into the statistics' kernel, not a kernel of
    # its own (one launch fewer per layer and step)
    make = dict((c[0], c[2]) for c in CASES)["batch_norm_train"]
    inputs = make()
    rt, _ = build(fx.symbolic_trace(batch_norm_train_graph), inputs, "cpp")
    stats = next(g for g in rt.sched.groups if g.red)
    updates = [n for n in stats.nodes if n.name in rt.sched.outputs and tuple(n.sizes) == (5,)]
    assert len(updates) == 2
    assert len(rt.sched.groups) == 3       # statistics (+ updates), output, counter


def test_buffer_slots_are_reused():
    def f(x, w):
        a = aten.tanh.default(x)
        b = aten.mm.default(a, w)
        c = aten.tanh.default(b)
        d = aten.mm.default(c, w)
        e = aten.tanh.default(d)
        return (aten.mm.default(e, w),)
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    rt, _ = build(fx.symbolic_trace(f), [x, w], "cpp")
    assert len(rt.sched.slots) == 3 and len(rt.sched.slot_specs) == 1   # one slot, reused twice
    torch.testing.assert_close(rt(x, w)[0], fx.symbolic_trace(f)(x, w)[0], rtol=1e-4, atol=1e-3)


def test_fallback_is_logged(caplog):
    def f(x):
        return (aten.cumprod.default(aten.exp.default(x), 0),)
    x = torch.randn(5, 3)
    with caplog.at_level(logging.INFO, logger="kiln.fallbacks"):
        c = compile_aten_graph(fx.symbolic_trace(f), [x])
    assert "aten.cumprod.default" in caplog.text
    torch.testing.assert_close(c(x)[0], torch.cumprod(torch.exp(x), 0))


def test_output_code_is_logged(caplog):
    x = torch.randn(3, 5)
    with caplog.at_level(logging.INFO, logger="kiln.output_code"):
        compile_aten_graph(fx.symbolic_trace(_softmax), [x])
    assert 'extern "C" void kiln_seg0' in caplog.text


def test_new_layout_compiles_a_new_variant():
    c = compile_aten_graph(fx.symbolic_trace(_chain), [torch.randn(4, 5), torch.randn(5)])
    x = torch.randn(5, 4).t()
    y = torch.randn(5)
    torch.testing.assert_close(c(x, y)[0], fx.symbolic_trace(_chain)(x, y)[0])
    assert len(c.variants) == 2


def test_views_of_inputs_are_returned_as_views():
    def f(x):
        return (aten.permute.default(x, [1, 0]), x)
    x = torch.randn(3, 4)
    a, b = compile_aten_graph(fx.symbolic_trace(f), [x])(x)
    assert b is x and a.data_ptr() == x.data_ptr() and a.stride() == (1, 4)


@pytest.mark.slow
def test_second_process_compiles_nothing(tmp_path):
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        import torch, torch.fx as fx
        import kiln.config; kiln.config.cache_dir = {str(tmp_path)!r}
        from kiln.kernels import compile_aten_graph
        from kiln.kernels.toolchain import cxx_build as cache
        aten = torch.ops.aten
        def f(x):
            return (aten._softmax.default(aten.mul.Tensor(x, 2.0), -1, False),)
        x = torch.randn(7, 9)
        out = compile_aten_graph(fx.symbolic_trace(f), [x])(x)[0]
        assert torch.allclose(out, torch.softmax(2 * x, -1), atol=1e-6)
        print(cache.stats["misses"], cache.stats["hits"])
    """)
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    assert runs[0].stdout.split() == ["1", "0"]
    assert runs[1].stdout.split() == ["0", "1"]


def test_column_reductions_walk_memory_contiguously():
    def f(x):
        return (aten.sum.dim_IntList(x, [0]), aten.amax.default(x, [0]),
                aten.amin.default(x, [0], True))
    x = torch.randn(300, 517)
    x[7, 3] = float("nan")
    rt, art = build(fx.symbolic_trace(f), [x], "cpp")
    assert "xb += 256" in art["source"]            # the column loop order was chosen
    got = rt(x)
    torch.testing.assert_close(got[0], x.sum(0), rtol=1e-4, atol=1e-4, equal_nan=True)
    torch.testing.assert_close(got[1], x.amax(0), equal_nan=True)
    torch.testing.assert_close(got[2], x.amin(0, True), equal_nan=True)


def _mlp_chain(x, w):
    for _ in range(6):
        x = aten.relu.default(aten.mm.default(x, w))
        x = aten.add.Tensor(aten.mul.Tensor(x, 0.5), 1.0)
    return (x,)


def test_runtime_frees_dead_buffers_and_allocates_late():
    """Library results and kernel slots live from their first writer to their last
    reader only (peak memory of a deep network stays that of a few layers)."""
    x, w = torch.randn(8, 16), torch.randn(16, 16) / 4
    rt, _ = build(fx.symbolic_trace(_mlp_chain), [x, w], "cpp")
    live = []
    for i, step in enumerate(rt.steps):
        def spy(r, tensors, step=step):
            step(r, tensors)
            live.append(len({id(t) for k, t in tensors.items() if not k.startswith("in")}))
        rt.steps[i] = spy
    torch.testing.assert_close(rt(x, w)[0], _mlp_chain(x, w)[0])
    assert len(rt.steps) == 12
    assert max(live) <= 3, live
    # and the same answer twice (slots re-allocated on every call)
    torch.testing.assert_close(rt(x, w)[0], _mlp_chain(x, w)[0])


def _toy_graph(a, b):
    s = aten.sum.dim_IntList(b, [])
    lt = aten.lt.Scalar(s, 0)
    x = aten.div.Tensor(a, aten.add.Tensor(aten.abs.default(a), 1))
    return (lt, x)


def test_independent_member_joins_the_first_loop():
    """The toy example's graph order (sum, compare, then an unrelated pointwise) gives one
    pass: the pointwise joins the reduction's loop rather than a second loop after the
    comparison, so on a GPU the whole loop can be split across programs."""
    a, b = torch.randn(1000), torch.randn(1000)
    rt, _ = build(fx.symbolic_trace(_toy_graph), [a, b], "cpp")
    g, = rt.sched.groups
    assert [k for k, _ in g.loops] == ["inner", "outer"]
    got = rt(a, b)
    for x, y in zip(got, _toy_graph(a, b)):
        assert torch.equal(x, y) if x.dtype == torch.bool else torch.allclose(x, y)
    from kiln.kernels.codegen.triton import heuristics
    assert heuristics._splittable(g)


def _few_long(x, t, m):
    return (aten.sum.dim_IntList(x, [1]), aten.amax.default(x, [1]), aten.mean.dim(x, [1]),
            aten._softmax.default(x, 1, False),
            aten.sum.dim_IntList(t, [0]), aten.amin.default(t, [0]),
            aten.any.dim(aten.gt.Scalar(t, 3.0), 0), aten.sum.dim_IntList(m, [0]))


def test_cpp_column_reduction_splits_rows_across_threads(monkeypatch):
    """Column sums with fewer output blocks than threads: the rows are split across
    threads (OpenMP array-section reductions), not the one block of outputs."""
    from kiln.kernels.codegen.cpp import source as cpp
    monkeypatch.setattr(cpp, "FEW_OUTER", 64)
    x = torch.randn(3, 40000)
    x[1, 5] = float("nan")
    t, m = torch.randn(50000, 20), torch.randn(40000, 3)
    gm = fx.symbolic_trace(_few_long)
    rt, art = build(gm, [x, t, m], "cpp")
    src = art["source"]
    # the column kernels' array reductions (20 columns: a block of 32, the size class)
    assert "reduction(+:acc_" in src and ("[:32])" in src or "[:20])" in src)
    assert "reduction(min:acc_" in src and "reduction(||:acc_" in src
    for g, e in zip(rt(x, t, m), gm(x.double(), t.double(), m.double())):
        if e.dtype == torch.bool:
            assert torch.equal(g, e)
        else:      # float32 sums of 40000+ terms against float64
            torch.testing.assert_close(g.double(), e, rtol=1e-4, atol=2e-3, equal_nan=True)
