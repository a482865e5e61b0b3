"""Library products fused with their pointwise reader (``kernels/codegen/triton/matmul_epilogue.py``):
which products fuse, the fused code under Triton's interpreter (a child pytest), and
the two tiers on a GPU."""
import os
import subprocess
import sys

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import ir
from kiln.kernels.lowering import engine as lowering
from kiln.kernels import matmul_fusion
from kiln.kernels.codegen.triton import matmul_epilogue
from kiln.kernels.scheduler import schedule

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
aten = torch.ops.aten


def _groups(fn, inputs, fuse=True):
    gm = fx.symbolic_trace(fn)
    lo = lowering.GraphLowering(gm, inputs, "triton").run()
    outs = {v.buf for v in lowering.pytree.tree_leaves(
        lo.outputs, is_leaf=lambda x: isinstance(x, lowering.View)) if isinstance(v, lowering.View)}
    return schedule(lo.buffers, outs | lo.pinned, matmul_epilogues=fuse).groups


def _linear_gelu(x, w, b):
    return (aten.gelu.default(aten.addmm.default(b, x, aten.t.default(w))),)


def _meta(*shapes, dtype=torch.bfloat16):
    return [torch.empty(s, dtype=dtype, device="meta") for s in shapes]


@pytest.mark.parametrize("dtype,size,fused", [
    (torch.bfloat16, 4096, True), (torch.float16, 4096, True),
    (torch.float32, 4096, False),          # tf32 would differ from eager's fp32 product
    (torch.bfloat16, 256, False),          # small: the library call and a plain kernel
])
def test_which_products_fuse(dtype, size, fused, monkeypatch):
    groups = _groups(_linear_gelu, _meta((size, size), (size, size), (size,), dtype=dtype))
    assert [g.matmul is not None for g in groups if g.extern is None] == [fused]
    assert any(g.extern is not None for g in groups) != fused


def test_unaligned_operand_and_off_switch_keep_the_library_call():
    # K = 4100 elements: a row stride TMA cannot take (not a multiple of 16 bytes)
    inputs = _meta((4096, 4100), (4096, 4100), (4096,))
    assert all(g.matmul is None for g in _groups(_linear_gelu, inputs))
    inputs = _meta((4096, 4096), (4096, 4096), (4096,))
    assert all(g.matmul is None for g in _groups(_linear_gelu, inputs, fuse=False))


@pytest.mark.slow      # the Triton interpreter: minutes of the quick subset's budget
def test_interpreter_cases(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1", KILN_TEST_CACHE_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           os.path.join(HERE, "matmul_epilogue_cases.py"), "--rootdir", ROOT]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "7 passed" in r.stdout.splitlines()[-1], r.stdout[-2000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["sync", "background"])
def test_gpu_tiers_match_eager(mode, monkeypatch):
    """On the GPU: bf16 Linear-GELU-Linear and a row-major product with a residual,
    shapes off the tile grid; "sync" runs the fused kernel from the first call,
    "background" starts on the library tier and moves to the fused kernel."""
    from kiln.kernels import compile_aten_graph
    monkeypatch.setattr(config, "matmul_epilogue", mode)
    monkeypatch.setattr(matmul_fusion, "MIN_MNK", 1 << 20)
    g = torch.Generator(device="cuda").manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g, device="cuda") * scale).to(torch.bfloat16)
    M, K, N = 1000, 1032, 2056

    def mm_residual(x, w, res):
        return (aten.add.Tensor(aten.relu.default(aten.mm.default(x, w)), res),)

    cases = [(_linear_gelu, [r(M, K), r(N, K, scale=0.03), r(N)]),
             (mm_residual, [r(M, K), r(K, N, scale=0.03), r(M, N)])]
    for fn, inputs in cases:
        compiled = compile_aten_graph(fx.symbolic_trace(fn), inputs)
        assert "(fused)" in compiled.artefacts["schedule"]
        before = matmul_epilogue.stats["fused_launches"]
        for _ in range(2 if mode == "sync" else 1):
            got = compiled(*inputs)[0]
        if mode == "background":
            matmul_epilogue.wait(300)
            got_library = got
            got = compiled(*inputs)[0]
            # cuBLAS and kiln's plain kernel: eager's own arithmetic, to an ulp
            torch.testing.assert_close(got_library, fn(*inputs)[0], rtol=8e-3, atol=1e-5)
        assert matmul_epilogue.stats["fused_launches"] > before
        ref = fn(*inputs)[0]
        # one bf16 rounding of the product (as cuBLAS), then the epilogue in fp32:
        # differences are accumulation order, at most an ulp of the output or two
        torch.testing.assert_close(got, ref, rtol=1.6e-2, atol=1e-2)
        ref32 = fn(*[t.float() for t in inputs])[0]
        err_kiln = (got.float() - ref32).abs().max().item()
        err_eager = (ref.float() - ref32).abs().max().item()
        assert err_kiln <= 1.5 * err_eager + 1e-3, (err_kiln, err_eager)
