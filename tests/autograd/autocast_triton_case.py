"""One autocast (bf16) training graph through kiln's Triton kernels on the CPU: run as a
script by ``test_autocast_training.py`` under ``TRITON_INTERPRET=1
KILN_KERNEL_TARGET=triton`` (set before Triton is imported). Prints the number of
Triton kernels generated and "ok"; exits non-zero on a mismatch with eager."""
from __future__ import annotations

import logging
import sys

import torch
import torch.nn.functional as F

import kiln
from kiln.debug.logs import log_for


class _Kernels(logging.Handler):
    def __init__(self):
        super().__init__()
        self.triton = 0

    def emit(self, record):
        self.triton += record.getMessage().count("@triton.jit")


def fn(x, w1, b1, w2, b2):
    with torch.autocast("cpu", torch.bfloat16):
        h = F.gelu(F.linear(x, w1, b1))
        y = F.linear(h, w2, b2)
    return y, (y.float() * 0.5).sum()


def _bf16_ulps(t: torch.Tensor, n: int) -> float:
    """n units in the last place of bfloat16 at ``t``'s largest magnitude: kiln's Triton
    kernels compute bf16 ops in float32 and round once at the store, where eager rounds
    after each op (a linear's matmul and bias add, GELU, the second linear: each
    rounding may land one unit apart)."""
    m = t.detach().abs().max().item()
    return n * 2.0 ** (torch.tensor(m).log2().floor().item() - 7) if m else 0.0


def main() -> int:
    kernels = _Kernels()
    log = log_for("output_code")
    log.setLevel(logging.INFO)
    log.addHandler(kernels)
    torch.manual_seed(0)
    x = torch.randn(8, 16)
    params = [torch.randn(32, 16), torch.randn(32), torch.randn(4, 32), torch.randn(4)]
    eager_p = [p.clone().requires_grad_() for p in params]
    comp_p = [p.clone().requires_grad_() for p in params]
    ye, le = fn(x, *eager_p)
    yc, lc = kiln.compile(fn, backend="kiln")(x, *comp_p)
    le.backward()
    lc.backward()
    bad = []
    if (yc.dtype, lc.dtype) != (ye.dtype, le.dtype):
        bad.append(f"dtypes {yc.dtype} {lc.dtype} vs {ye.dtype} {le.dtype}")
    for name, got, want in [("y", yc, ye), ("loss", lc, le)] + [
            (f"grad{i}", q.grad, p.grad) for i, (p, q) in enumerate(zip(eager_p, comp_p))]:
        try:
            assert got.dtype == want.dtype, (got.dtype, want.dtype)
            torch.testing.assert_close(got, want, rtol=0, atol=_bf16_ulps(want, 4))
        except AssertionError as e:
            bad.append(f"{name}: {e}")
    print("triton kernels:", kernels.triton)
    if kernels.triton == 0:
        bad.append("no Triton kernel was generated")
    for b in bad:
        print(b)
    if not bad:
        print("ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
