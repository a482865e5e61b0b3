"""Compile time of resnet18's training graph: kiln's aot_eager vs
torch.compile(backend="aot_eager"). A script, not a test:
``python -m tests.autograd.bench_compile_time``."""
from __future__ import annotations

import copy
import time

import torch
import torchvision

from kiln.autograd.backend import aot_eager
from kiln.autograd.lift import lift


def step(fn, *args):
    out = fn(*args)
    out = out[0] if isinstance(out, tuple) else out
    out.sum().backward()


def main():
    torch.manual_seed(0)
    m = torchvision.models.resnet18().train()
    x = torch.randn(2, 3, 64, 64)
    t0 = time.perf_counter()
    step(copy.deepcopy(m), x)
    eager = time.perf_counter() - t0

    m1 = copy.deepcopy(m)
    t0 = time.perf_counter()
    gm, state = lift(m1)
    t_lift = time.perf_counter() - t0
    t0 = time.perf_counter()
    fn = aot_eager(gm, [*state, x])
    t_kiln = time.perf_counter() - t0
    t0 = time.perf_counter()
    step(fn, *state, x)
    t_kiln_run = time.perf_counter() - t0

    m2 = copy.deepcopy(m)
    compiled = torch.compile(m2, backend="aot_eager")
    t0 = time.perf_counter()
    step(compiled, x)
    t_torch = time.perf_counter() - t0
    print(f"eager training step                         {eager:7.2f} s")
    print(f"kiln: fx.symbolic_trace + lifting            {t_lift:7.2f} s")
    print(f"kiln: aot_eager compile (trace+partition)    {t_kiln:7.2f} s")
    print(f"kiln: first step after compile               {t_kiln_run:7.2f} s")
    print(f"torch.compile(aot_eager): first step (dynamo+aot+run) {t_torch:7.2f} s")


if __name__ == "__main__":
    main()
