"""Cross-entropy training through kiln's Triton kernels on the CPU: run as a script by
``test_cross_entropy_saves.py`` under ``TRITON_INTERPRET=1 KILN_KERNEL_TARGET=triton``
(set before Triton is imported). Loss and weight gradient against eager; the forward's
kernels store no logits-sized buffer, the backward's store one (the gradient). Prints
"ok"; exits non-zero otherwise."""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

import kiln
from kiln.kernels import compile as kcompile
from kiln.kernels import ir

N, V = 16, 300


def written(rt) -> list:
    return [name for name, b in rt.buffers.items()
            if isinstance(b, (ir.Pointwise, ir.Reduction)) and ir.numel_of(b.sizes) >= N * V]


def main() -> int:
    built = []
    build = kcompile.build
    kcompile.build = lambda *a, **k: built.append(build(*a, **k)) or built[-1]
    torch.manual_seed(0)
    h, w = torch.randn(N, 8), torch.randn(8, V)
    y = torch.randint(0, V, (N,))
    y[3] = -100

    def fn(h, w, y):
        return F.cross_entropy(h @ w, y)
    a, b = w.clone().requires_grad_(True), w.clone().requires_grad_(True)
    la = kiln.compile(fn, backend="kiln")(h, a, y)
    la.backward()
    lb = fn(h, b, y)
    lb.backward()
    bad = []
    for name, got, want in (("loss", la, lb), ("grad", a.grad, b.grad)):
        try:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        except AssertionError as e:
            bad.append(f"{name}: {e}")
    if len(built) != 2:
        bad.append(f"{len(built)} graphs built, not a forward and a backward")
    else:
        if written(built[0][0]):
            bad.append(f"forward stores {written(built[0][0])}")
        if len(written(built[1][0])) != 1:
            bad.append(f"backward stores {written(built[1][0])}")
    for m in bad:
        print(m)
    if not bad:
        print("ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
