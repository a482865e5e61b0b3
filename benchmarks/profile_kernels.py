"""Where a workload's time goes, per backend: host-bound or GPU-bound, and which kernels.

    python -m benchmarks.profile_kernels --only mobilenet_v3_small/train [--backends eager,kiln]
                                         [--steps 10] [--top 20] [--device cuda]

For each selected workload (the harness's own, built the same way) and backend, it runs
the harness's step (inference call, or training step: compiled forward+loss, backward,
SGD step) under ``torch.profiler`` and prints per step: the host time (what a user
waits, synchronised), the GPU's busy time and kernel count, and the kernels that take
the most GPU time, aggregated by name (on a CPU: the profiled ops by self time; kiln's
own C++ kernels are not profiled ops, so they are the gap to the host time). A backend whose host time is far above its GPU
time is launch-bound; one whose GPU time is above eager's names the kernels that lose.
Not a benchmark (the profiler slows launches): ratios come from ``python -m benchmarks``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.backends import make_backend  # noqa: E402
from benchmarks.harness import make_train_step  # noqa: E402
from benchmarks.workloads import select  # noqa: E402


def _step_of(backend, w, device):
    inst = w.build(device)
    compiled = backend.compile(inst.fn)
    if w.mode == "train":
        step, _ = make_train_step(compiled, inst)
        return lambda: step(0)

    def infer():
        with torch.no_grad():
            return compiled(*inst.inputs[0])
    return infer


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def python_profile(step, steps: int, device: str, top: int) -> str:
    """cProfile's functions by own time over ``steps`` steps (after warm-up): where a
    launch-bound backend spends its host time."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    _sync(device)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def profile(step, steps: int, device: str) -> tuple[float, dict]:
    """(host ms per step, {kernel name: (GPU ms per step, launches per step)},
    {CPU-side op: (self CPU ms per step, calls per step)})."""
    for _ in range(3):          # compile and warm up outside the profile
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    _sync(device)
    host = (time.perf_counter() - t0) * 1e3 / steps
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    kernels: dict = defaultdict(lambda: [0.0, 0])
    ops = {e.key: (e.self_cpu_time_total / 1e3 / steps, e.count / steps)
           for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU}
    if device == "cuda":
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels[e.name]
                k[0] += e.device_time_total / 1e3 / steps
                k[1] += 1 / steps
    else:   # no kernel events on a CPU: the ops by their own (self) time instead
        kernels.update(ops)
    return host, dict(kernels), ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", required=True, help="comma-separated substrings of workload keys")
    p.add_argument("--backends", default="eager,kiln")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--python", type=int, default=0, metavar="N",
                   help="also print cProfile's top N functions by own time")
    p.add_argument("--ops", type=int, default=0, metavar="N",
                   help="also print the N profiled CPU-side ops called most per step")
    a = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False      # as the harness (fp32 rows are fp32)
    torch.backends.cudnn.allow_tf32 = False
    for w in select(a.device, "all", False, a.only.split(","), all_dtypes=True):
        print(f"== {w.key}", flush=True)
        for name in a.backends.split(","):
            backend = make_backend(name)
            try:
                step = _step_of(backend, w, a.device)
                host, kernels, ops = profile(step, a.steps, a.device)
            except Exception as e:  # a backend that cannot run the workload is a row
                print(f"  {name}: {type(e).__name__}: {str(e)[:200]}")
                continue
            busy = sum(t for t, _ in kernels.values())
            launches = sum(n for _, n in kernels.values())
            what = "GPU busy" if a.device == "cuda" else "in profiled ops"
            print(f"  {name}: host {host:.3f} ms/step, {what} {busy:.3f} ms, "
                  f"{launches:.0f} {'kernels' if a.device == 'cuda' else 'op calls'}/step",
                  flush=True)
            for kname, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:a.top]:
                print(f"    {t:8.3f} ms  {n:5.0f}x  {kname[:110]}")
            if a.ops:
                print("   CPU-side ops by calls per step (self CPU ms per step):")
                for oname, (t, n) in sorted(ops.items(), key=lambda kv: -kv[1][1])[:a.ops]:
                    print(f"    {n:6.0f}x  {t:8.3f} ms  {oname[:100]}")
            if a.python:
                print(python_profile(step, a.steps, a.device, a.python))
            backend.reset()


if __name__ == "__main__":
    main()
