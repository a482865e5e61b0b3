"""The shared cases on a real GPU through Triton (skipped without CUDA)."""
import os

import pytest
import torch

from kiln import config
from kiln.kernels import compile_aten_graph

from .cases import CASES, run_case

# factories and tensor constants in these graphs are CPU tensors: eager refuses to mix
GPU_CASES = [c for c in CASES if c[0] not in ("full_arange", "tensor_constant", "factories")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_case_triton_gpu(case):
    name, fn, make, tol = case
    compiled = run_case(name, fn, make, tol, None, compile_aten_graph, device="cuda")
    assert compiled.target == "triton"


def _resnet_like(x, w1, w2, g, b):
    aten = torch.ops.aten
    for _ in range(3):
        y = aten.convolution.default(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        y = aten.relu.default(aten.add.Tensor(aten.mul.Tensor(y, g), b))
        z = aten.convolution.default(y, w2, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        x = aten.relu.default(aten.add.Tensor(z, x))
    return (aten.sum.dim_IntList(aten.mean.dim(x, [-1, -2]), [1]),)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["1", "0"])
def test_cuda_graph_replay_matches_eager(mode, monkeypatch):
    """Launch-bound graphs replay a recorded CUDA graph from the third call: results follow
    new input values and addresses; a moved parameter falls back to plain calls."""
    import torch.fx as fx
    from kiln.kernels.codegen.triton import launcher as triton_gen
    monkeypatch.setattr(config, "cudagraphs", mode)
    monkeypatch.setattr(triton_gen.Launcher, "why", {})   # this test's launches only
    dt, dev = torch.bfloat16, "cuda"
    w1 = (torch.randn(16, 16, 3, 3, device=dev) / 12).to(dt)
    w2 = (torch.randn(16, 16, 3, 3, device=dev) / 12).to(dt)
    g, b = torch.randn(1, 16, 1, 1, device=dev).to(dt), torch.randn(1, 16, 1, 1, device=dev).to(dt)
    gm = fx.symbolic_trace(_resnet_like)
    x0 = torch.randn(4, 16, 12, 12, device=dev).to(dt)
    c = compile_aten_graph(gm, [x0, w1, w2, g, b])
    for i in range(6):
        x = torch.randn(4, 16, 12, 12, device=dev).to(dt)
        if i == 4:
            w1 = w1.clone()          # a "parameter" at a new address
        got = c(x, w1, w2, g, b)[0]
        exp = gm(x, w1, w2, g, b)[0]
        torch.testing.assert_close(got.float(), exp.float(), rtol=3e-2, atol=3e-2)
    rt = next(iter(c.variants.values()))
    if mode == "1":
        assert rt.graphs is not None and rt.graphs.calls == 6
        assert rt.graphs.graph is not None, rt.graphs.reason
        assert rt.graphs.moving == {0}         # x every call; w1 moved once: recorded again
        assert rt.graphs.records <= 4      # x moving, w1 moving once, the kept result
    else:
        assert rt.graphs is None
    assert not triton_gen.Launcher.why, triton_gen.Launcher.why


def _chain(x, w):
    aten = torch.ops.aten
    for _ in range(12):                  # library calls keep the kernels apart
        x = aten.relu.default(aten.add.Tensor(aten.mm.default(x, w), 1.0))
    return (x, aten.mul.Tensor(x, 2.0))


def _compiled_chain(n=64):
    import torch.fx as fx
    gm = fx.symbolic_trace(_chain)
    w = torch.randn(n, n, device="cuda") / n ** 0.5
    c = compile_aten_graph(gm, [torch.randn(n, n, device="cuda"), w])
    return gm, c, w


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_outputs_are_aliases_until_one_is_kept(monkeypatch):
    """A replayed graph hands out its own memory, no copies; when a caller keeps an
    output across calls, the next call records again (the kept one keeps its values)
    and that output is a copy from then on."""
    monkeypatch.setattr(config, "cudagraphs", "auto")
    gm, c, w = _compiled_chain()
    x = torch.empty(64, 64, device="cuda")
    ptrs = []
    for _ in range(4):
        x.normal_()
        got = c(x, w)
        for g, e in zip(got, gm(x, w)):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
        ptrs.append(got[0].data_ptr())
        del got, g, e                 # held across the next call, they would be copied
    rt = next(iter(c.variants.values()))
    assert rt.graphs.graph is not None and rt.graphs.records == 1, rt.graphs.reason
    assert ptrs[1] == ptrs[2] == ptrs[3]          # the graph's memory, not copies
    x.normal_()
    kept, exp = c(x, w)[0], gm(x, w)[0].clone()
    for _ in range(3):
        x.normal_()
        got = c(x, w)
        torch.testing.assert_close(got[0], gm(x, w)[0], rtol=1e-4, atol=1e-4)
        del got
    torch.testing.assert_close(kept, exp, rtol=0, atol=0)     # not overwritten
    assert rt.graphs.copied == {0} and rt.graphs.records == 2, rt.graphs.reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graphs_share_a_pool_without_overwriting_held_outputs(monkeypatch):
    """Two graphs recorded into the shared pool: the later one's outputs may lie in the
    earlier one's temporaries, so while a caller holds one the earlier graph records
    again rather than overwrite it."""
    monkeypatch.setattr(config, "cudagraphs", "auto")
    gm, first, w = _compiled_chain()
    _, second, _ = _compiled_chain()
    x = torch.randn(64, 64, device="cuda")
    for _ in range(3):
        first(x, w)
    for _ in range(3):
        second(x, w)
    out2 = second(x, w)[1]                    # an alias of the later graph's memory
    exp2 = out2.clone()
    for _ in range(3):
        x.normal_()
        torch.testing.assert_close(first(x, w)[0], gm(x, w)[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out2, exp2, rtol=0, atol=0)
    rt1 = next(iter(first.variants.values()))
    rt2 = next(iter(second.variants.values()))
    assert rt1.graphs.graph is not None and rt1.graphs.records == 2, rt1.graphs.reason
    assert rt2.graphs.copied == {1}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_training_step_replays_forward_and_backward_in_place(monkeypatch):
    """A training step on the kiln backend: forward and backward both replay, the
    backward reading the forward's saved activations where the forward's graph left
    them (no copies), and gradients match eager's step after step."""
    import gc

    import kiln
    from kiln.kernels.runtime import graph_replay
    monkeypatch.setattr(config, "cudagraphs", "auto")
    before = {id(o) for o in gc.get_objects() if issubclass(type(o), graph_replay.GraphReplay)}

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(*[torch.nn.Sequential(
            torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.GELU())
            for _ in range(6)]).cuda()
    m, ref = net(), net()
    cm = kiln.compile(m, backend="kiln")
    x = torch.empty(32, 64, device="cuda")
    for _ in range(5):
        x.normal_()
        cm(x).square().mean().backward()
        ref(x).square().mean().backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
            p.grad = q.grad = None
    replays = [o for o in gc.get_objects()
               if issubclass(type(o), graph_replay.GraphReplay) and id(o) not in before]
    assert len(replays) == 2, [(o.calls, o.reason) for o in replays]
    for o in replays:
        assert o.calls == 5 and o.graph is not None, o.reason
        assert len(o.moving) <= 1, o.moving       # at most the backward's tangent


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_kernels_compile_in_parallel_at_load(monkeypatch, tmp_path):
    """Every kernel of a module is compiled at load time (by the compile workers and this
    process), none at first launch."""
    import torch.fx as fx
    from kiln.kernels.codegen.triton import launcher as triton_gen
    done = []
    orig = triton_gen.precompile

    def spy(mod, kinfo, path):
        ready, tuned = orig(mod, kinfo, path)
        done.append((len(ready) + len(tuned), len(kinfo)))
        return ready, tuned
    monkeypatch.setattr(triton_gen, "precompile", spy)
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    torch.manual_seed(0)
    x = torch.randn(64, 300, device="cuda")
    gm = fx.symbolic_trace(lambda x: tuple(torch.ops.aten.sum.dim_IntList(
        torch.ops.aten.mul.Tensor(x, float(i)), [i % 2]) for i in range(4)) + (
        torch.ops.aten._softmax.default(x, -1, False),))
    c = compile_aten_graph(gm, [x])
    assert done and done[0][0] == done[0][1] >= 2, done
    for g, e in zip(c(x), gm(x)):   # sums of 300 in another order: absolute slack
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4)


_KERNEL = """
@triton.jit
def kernel0(in0, out0, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out0 + x, tl.load(in0 + x) * 3.0)
"""


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_kernel_met_again_in_another_module_is_not_compiled_again(monkeypatch, tmp_path):
    """Two module texts holding the same kernel at different lines (another size class
    of a graph, an earlier kernel a line longer): the second compiles nothing and shares
    the first's binary; a kernel whose text differs compiles."""
    from kiln.kernels.codegen.triton import launcher as triton_gen
    from kiln.kernels.toolchain import cxx_build
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    head = "import triton\nimport triton.language as tl\n"
    kinfo = [("kernel0", ["in0", "out0"], [torch.float32, torch.float32], {"XBLOCK": 128}, 4, ())]
    first = head + "# one\n" * 3 + _KERNEL
    second = head + "# two\n" * 7 + _KERNEL
    other = head + _KERNEL.replace("3.0", "5.0")
    got = []
    for src in (first, second, other):
        mod, path = cxx_build.load_module("triton", src)
        before = triton_gen.stats["kernels_reused"]
        ready, _ = triton_gen.precompile(mod, kinfo, path)
        got.append((ready["kernel0"], triton_gen.stats["kernels_reused"] - before))
    assert got[1][0] is got[0][0] and got[1][1] == 1
    assert got[2][0] is not got[0][0] and got[2][1] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_second_process_launches_without_tritons_jit(tmp_path):
    """With a warm cache, a new process loads the kept binaries: nothing goes through
    Triton's JIT (it is made to fail there), and the results are right."""
    import subprocess
    import sys
    import textwrap
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {root!r})
        import torch, torch.fx as fx, triton.runtime.jit as jit
        import kiln.config; kiln.config.cache_dir = {str(tmp_path)!r}
        from kiln.kernels import compile_aten_graph
        from kiln.kernels.toolchain import triton_binaries
        from kiln.kernels.codegen.triton import launcher as triton_gen
        if sys.argv[1] == "warm":
            def no_jit(*a, **k):
                raise AssertionError("went through Triton's JIT")
            jit.JITFunction.run = no_jit
        aten = torch.ops.aten
        def f(x, y, z):
            return (aten._softmax.default(aten.mul.Tensor(x, y), -1, False),
                    aten.sum.dim_IntList(aten.relu.default(x), [0]),
                    aten.amax.default(z, [1]))          # big enough to be autotuned
        x, y = torch.randn(300, 257, device="cuda"), torch.randn(257, device="cuda")
        z = torch.randn(4096, 4096, device="cuda")
        c = compile_aten_graph(fx.symbolic_trace(f), [x, y, z])
        assert any(k[5] for k in c.artefacts["kinfo"]), "no autotuned kernel"
        for _ in range(2):
            a, b, m = c(x, y, z)
        torch.testing.assert_close(a, torch.softmax(x * y, -1))
        torch.testing.assert_close(b, torch.relu(x).sum(0))
        torch.testing.assert_close(m, z.amax(1))
        assert not triton_gen.Launcher.why, triton_gen.Launcher.why
        print(triton_binaries.stats["saved"], triton_binaries.stats["loaded"])
    """)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"))
    cold, warm = (subprocess.run([sys.executable, "-c", script, mode], capture_output=True,
                                 text=True, env=env) for mode in ("cold", "warm"))
    assert cold.returncode == 0, cold.stderr
    assert warm.returncode == 0, warm.stderr
    assert cold.stdout.split() == ["1", "0"]
    assert warm.stdout.split() == ["0", "1"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cold_process_builds_no_launcher(tmp_path):
    """On a cold cache, kernels (an autotuned one included) are compiled partly by the
    compile workers and launched through ``cuda_launch``: no C launcher is built once
    Triton's driver is up (building one is made to fail), the autotuned kernel's
    configs are timed by kiln, results are right."""
    import subprocess
    import sys
    import textwrap
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {root!r})
        import torch, torch.fx as fx
        import kiln.config; kiln.config.cache_dir = {str(tmp_path)!r}
        from kiln.kernels import compile_aten_graph
        from kiln.kernels.toolchain import triton_pool as compile_pool
        from kiln.kernels.codegen.triton import launcher as triton_gen
        from kiln.kernels.toolchain import triton_setup
        triton_setup.wait()
        hellos = compile_pool.wait_started()
        assert len(hellos) == 2 and all(h["torch_imported"] is False for h in hellos), hellos
        import triton.runtime.build as build
        def no_build(*a, **k):
            raise AssertionError("built a C module")
        build.compile_module_from_src = no_build
        try:
            import triton.backends.nvidia.driver as nvdriver
            nvdriver.compile_module_from_src = no_build
        except (ImportError, AttributeError):
            pass
        aten = torch.ops.aten
        def f(x, z):
            return (aten.sin.default(x), aten.amax.default(z, [1]))
        x, z = torch.randn(1000, device="cuda"), torch.randn(4096, 4096, device="cuda")
        c = compile_aten_graph(fx.symbolic_trace(f), [x, z])
        assert any(k[5] for k in c.artefacts["kinfo"]), "no autotuned kernel"
        for _ in range(3):
            a, m = c(x, z)
        torch.testing.assert_close(a, x.sin())
        torch.testing.assert_close(m, z.amax(1))
        assert not triton_gen.Launcher.why, triton_gen.Launcher.why
        assert compile_pool.stats["remote"] >= 1, compile_pool.stats
        print("ok")
    """)
    env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / "triton"), KILN_COMPILE_WORKERS="2")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_scatter_and_scan_into_a_cuda_constant():
    """An embedding-style gradient (zeros on ``device="cuda"`` — which symbolic tracing
    folds into a CUDA tensor constant, a get_attr node — then index_put with
    accumulation) and a cumsum compile to Triton kernels, not fallbacks: the constant's
    device is its own, not the CPU's."""
    import torch.fx as fx
    aten = torch.ops.aten
    i = torch.randint(-300, 300, (2000,), device="cuda")
    g = torch.randn(2000, 48, device="cuda")

    def f(i, g):
        z = aten.full.default([300, 48], 0.0, dtype=torch.float32, layout=torch.strided,
                              device=torch.device("cuda"), pin_memory=False)
        return (aten.index_put.default(z, [i], g, True), aten.cumsum.default(g, 0))
    c = compile_aten_graph(fx.symbolic_trace(f), [i, g])
    for got, want in zip(c(i, g), f(i, g)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert c.artefacts["fallbacks"] == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scatter_accumulates_in_float(dtype):
    """A bf16/fp16 embedding gradient: repeated rows sum in float32 and round once, as
    eager's sorted accumulation does, so a row hit 500 times stays within one rounding
    of eager's (bf16 atomics would round at every add)."""
    import torch.fx as fx
    aten = torch.ops.aten
    i = torch.cat([torch.zeros(500, dtype=torch.int64), torch.arange(64)]).cuda()
    g = torch.rand(564, 32, device="cuda").to(dtype)

    def f(i, g, w):
        return (aten.index_put.default(aten.mul.Tensor(w, 0.0), [i], g, True),)
    w = torch.randn(64, 32, device="cuda", dtype=dtype)
    c = compile_aten_graph(fx.symbolic_trace(f), [i, g, w])
    got, want = c(i, g, w)[0], f(i, g, w)[0]
    assert got.dtype == dtype and c.artefacts["fallbacks"] == []
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-3)
