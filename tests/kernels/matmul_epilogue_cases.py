"""Matrix products with fused epilogues through Triton's interpreter (fp16: the
interpreter's bfloat16 arithmetic is not exact). Run by ``test_matmul_epilogue.py`` in a
child pytest with TRITON_INTERPRET=1 set before triton is imported."""
import os

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels import matmul_fusion
from kiln.kernels.codegen.triton import matmul_epilogue
from kiln.kernels.compile import build

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_matmul_epilogue.py)")
aten = torch.ops.aten
F16 = torch.float16


def mlp(x, w1, b1, w2, b2):
    h = aten.gelu.default(aten.addmm.default(b1, x, aten.t.default(w1)))
    return (aten.addmm.default(b2, h, aten.t.default(w2)),)


def mm_relu_residual(x, w, r):
    # B row-major ([K, N] contiguous), no bias; the epilogue reads another input too
    return (aten.add.Tensor(aten.relu.default(aten.mm.default(x, w)), r),)


def addmm_rowbias_two_outputs(x, w, b):
    # a [M, 1] bias (broadcast along N); the epilogue stores two buffers
    y = aten.addmm.default(b, x, aten.t.default(w))
    s = aten.sigmoid.default(y)
    return (aten.mul.Tensor(y, s), aten.tanh.default(y))


def product_also_returned(x, w):
    y = aten.mm.default(x, aten.t.default(w))
    return (y, aten.relu.default(y))


def _inputs(name):
    g = torch.Generator().manual_seed(0)

    def r(*s, scale=1.0):
        return (torch.randn(*s, generator=g) * scale).to(F16)
    M, K, N = 40, 48, 96        # none a multiple of the tiles: masked edges
    if name == "mlp":
        # N = 90: rows of 180 bytes, which TMA cannot store (plain masked stores)
        N = 90
        return mlp, [r(M, K), r(N, K, scale=0.15), r(N), r(K, N, scale=0.15), r(K)]
    if name == "mm_relu_residual":
        return mm_relu_residual, [r(M, K), r(K, N, scale=0.15), r(M, N)]
    if name == "addmm_rowbias_two_outputs":
        return addmm_rowbias_two_outputs, [r(M, K), r(N, K, scale=0.15), r(M, 1)]
    return product_also_returned, [r(M, K), r(N, K, scale=0.15)]


def _eager(fn, inputs):
    """Eager fp16 on the CPU, each op rounded to fp16 as a GPU library would."""
    return fn(*inputs)


@pytest.fixture(autouse=True)
def _fuse_all_sizes(monkeypatch):
    monkeypatch.setattr(config, "matmul_epilogue", "sync")
    monkeypatch.setattr(matmul_fusion, "MIN_MNK", 0)


@pytest.mark.parametrize("library_tier", [False, True], ids=["fused", "library"])
@pytest.mark.parametrize("name", ["mlp", "mm_relu_residual", "addmm_rowbias_two_outputs"])
def test_fused_epilogue_matches_eager(name, library_tier, monkeypatch):
    fn, inputs = _inputs(name)
    rt, art = build(fx.symbolic_trace(fn), inputs, "triton")
    assert "(fused)" in art["schedule"], art["schedule"]
    assert "_mm(kiln_a, kiln_b" in art["source"]
    # outputs with TMA-addressable rows are stored through descriptors, others plainly
    assert (".store([pid_m * BM" in art["source"]) == (name != "mlp")
    if library_tier:                   # the tier a GPU runs until the fused kernel is up
        monkeypatch.setattr(matmul_epilogue, "launch", lambda *a, **k: False)
    before = dict(matmul_epilogue.stats)
    got = rt(*inputs)
    fused = matmul_epilogue.stats["fused_launches"] - before["fused_launches"]
    assert fused == (0 if library_tier else 1)
    for g, e in zip(got, _eager(fn, inputs)):
        assert g.dtype == e.dtype and g.shape == e.shape
        # fp16 products: accumulation order differs from the CPU's (fp32 either way)
        torch.testing.assert_close(g, e, rtol=2e-3, atol=2e-3)


def test_product_read_elsewhere_is_not_fused():
    fn, inputs = _inputs("product_also_returned")
    rt, art = build(fx.symbolic_trace(fn), inputs, "triton")
    assert "(fused)" not in art["schedule"]
    for g, e in zip(rt(*inputs), fn(*inputs)):
        torch.testing.assert_close(g, e, rtol=2e-3, atol=2e-3)
