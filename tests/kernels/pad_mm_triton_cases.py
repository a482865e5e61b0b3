"""pad_mm through the Triton code generator, under TRITON_INTERPRET=1.

Not collected by the normal run: ``test_pad_mm.py`` runs this file in a child pytest
with the interpreter switched on before triton is imported."""
import os

import pytest
import torch
import torch.fx as fx

from kiln import config
from kiln.kernels.compile import build

aten = torch.ops.aten

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs TRITON_INTERPRET=1 (see test_pad_mm.py)")


def _head(x, w):
    """An LM head under autocast: the fp32 weight cast to bf16, read transposed, vocab 37."""
    wb = aten._to_copy.default(w, dtype=torch.bfloat16)
    logits = aten.mm.default(x, aten.t.default(wb))
    return (aten.mul.Tensor(logits, 2),)


def test_padded_head_matches_eager_and_pads_in_the_cast_kernel():
    torch.manual_seed(0)
    x, w = torch.randn(16, 24).to(torch.bfloat16), torch.randn(37, 24)
    with config.patch(pad_mm="always", pad_mm_min_flops=0, graph_cache=False):
        rt, art = build(fx.symbolic_trace(_head), [x, w], "triton")
    with config.patch(pad_mm="0", graph_cache=False):
        rt0, _ = build(fx.symbolic_trace(_head), [x, w], "triton")
    got, unpadded, want = rt(x, w)[0], rt0(x, w)[0], _head(x, w)[0]
    assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
    # CPU bf16 products round by layout: the padded result is the unpadded one's, and
    # both are within bf16 rounding of the exact product
    torch.testing.assert_close(got, unpadded, rtol=1e-2, atol=1e-2)
    exact = (x.double() @ w.to(torch.bfloat16).double().t()) * 2
    torch.testing.assert_close(got.double(), exact, rtol=0, atol=0.02 * exact.abs().max().item())
    assert any("padded" in line for line in art["passes"])
    # the cast is computed inside the padding kernel: one pointwise buffer of the padded
    # weight, and no bf16 copy of the unpadded one
    lines = art["ir"].splitlines()
    assert any(("[40, 24]" in ln or "[24, 40]" in ln) and "pointwise" in ln and "cast(" in ln
               and "where(" in ln for ln in lines), art["ir"]
    assert not any("bfloat16[37, 24]" in ln or "bfloat16[24, 37]" in ln for ln in lines), art["ir"]
    assert "@triton.jit" in art["source"]
