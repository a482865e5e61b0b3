"""Is a training-step gradient mismatch a compiler bug or the step's conditioning?

    python -m benchmarks.train_conditioning [--device cuda] [--batch 16] [--size 128]

One resnet18 training step (batch-16 BatchNorm) in fp32 under eager, aot_eager and
kiln, each compared with a float64 eager run of the same step: if eager fp32's own
error is of the same order as the compilers', the fp32 mismatch is conditioning. A
float64 run of each backend should agree with eager float64 to ~1e-14 (a real bug would
show there).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kiln  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--size", type=int, default=128)
    a = p.parse_args()
    import torchvision

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    base = torchvision.models.resnet18(num_classes=10).to(a.device).train()
    x = torch.randn(a.batch, 3, a.size, a.size, device=a.device)

    def step(m, xx, backend=None):
        f = kiln.compile(m, backend=backend, fullgraph=True) if backend else m
        m.zero_grad(set_to_none=True)
        f(xx).float().pow(2).mean().backward()
        return [q.grad.double() for q in m.parameters()]

    def err(gs, ref):
        return max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(gs, ref))

    ref64 = step(copy.deepcopy(base).double(), x.double())
    print(f"{'backend':10s} {'fp32 vs eager fp64':>20s} {'fp64 vs eager fp64':>20s}")
    for b in (None, "aot_eager", "kiln"):
        e32 = err(step(copy.deepcopy(base), x, b), ref64)
        kiln.reset()
        e64 = err(step(copy.deepcopy(base).double(), x.double(), b), ref64)
        kiln.reset()
        print(f"{b or 'eager':10s} {e32:20.1e} {e64:20.1e}")


if __name__ == "__main__":
    main()
