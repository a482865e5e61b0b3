"""Where the whole-step training benchmark's time goes, per backend (a probe, not a
benchmark: the profiler slows launches).

    python -m benchmarks.probes.train_step_profile --device cuda --model gpt2 --layers 12 \
        --hidden 768 --batch 8 --seq 512 --vocab 50257 --autocast bf16 --optimizer adamw \
        --backends kiln,torch.compile-ro

For each backend: the synchronised host time of a step, the GPU's busy time, the kernel
count, and the kernels taking the most GPU time (aggregated by name), so a gap between
kiln and a peer reads as launch-bound (host ≫ GPU) or as named kernels that lose.
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict

import torch

from benchmarks.backends import make_backend
from benchmarks.train_step import _AUTOCAST, build, make_step, parse


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def profile(name, a, top):
    be = make_backend(name)
    be.reset()
    model, opt, inputs = build(a)
    step = be.compile(make_step(model, opt, a.device, _AUTOCAST[a.autocast]))
    for i in range(6):
        step(*inputs[i % len(inputs)])
    _sync(a.device)
    t0 = time.perf_counter()
    for i in range(5):
        step(*inputs[i % len(inputs)])
    _sync(a.device)
    host_ms = (time.perf_counter() - t0) / 5 * 1e3
    acts = [torch.profiler.ProfilerActivity.CPU]
    if a.device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for i in range(3):
            step(*inputs[i % len(inputs)])
        _sync(a.device)
    by = defaultdict(lambda: [0.0, 0])
    gpu_us = 0.0
    n = 0
    for ev in prof.events():
        if a.device == "cuda" and ev.device_type == torch.autograd.DeviceType.CUDA:
            d = ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            by[ev.name][0] += d
            by[ev.name][1] += 1
            gpu_us += d
            n += 1
    print(f"\n== {name}: host {host_ms:.2f} ms/step, GPU busy {gpu_us / 3e3:.2f} ms/step, "
          f"{n / 3:.0f} kernels/step", flush=True)
    for k, (us, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 3e3:8.3f} ms  x{c / 3:5.0f}  {k[:110]}", flush=True)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    top = 30
    if "--top" in argv:
        i = argv.index("--top")
        top = int(argv[i + 1])
        del argv[i:i + 2]
    a = parse(argv)
    for name in [b for b in a.backends.split(",") if b]:
        profile(name, a, top)


if __name__ == "__main__":
    main()
