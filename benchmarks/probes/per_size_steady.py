"""A size stream's steady state, size by size: after the first pass, the settle passes
and kiln's background work, each size's call timed alone (synchronised before and after,
median of ``REPS``) for eager, torch.compile and kiln, then the GPU kernels of chosen
sizes (``PROFILE=8,64``) per backend from the profiler, and kiln's host time at chosen
sizes (``HOSTPROF=1,8``: cProfile over 50 synchronised calls, by own time): where a
steady-state gap between the backends comes from.

    python -m benchmarks.probes.per_size_steady cuda resnet18|llama
"""
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.dynamic_shapes import kiln_waited, llama, resnet18, sync  # noqa: E402

dev, wl = sys.argv[1], sys.argv[2]
reps = int(os.environ.get("REPS", "15"))
profile_at = [int(s) for s in os.environ.get("PROFILE", "").split(",") if s]
host_at = [int(s) for s in os.environ.get("HOSTPROF", "").split(",") if s]
make = {"llama": llama, "resnet18": resnet18}[wl]


def build(name, model):
    if name == "eager":
        return model
    if name == "torch.compile":
        return torch.compile(model)
    import kiln
    return kiln.compile(model)


def kernels(fn, run, x, label):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run(fn, x)
        sync(dev)
    rows = [(e.key, e.device_time_total / 5, e.count // 5) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(key=lambda r: -r[1])
    total = sum(r[1] for r in rows)
    print(f"  {label}: {total:.0f} us of kernels per call, {sum(r[2] for r in rows)} launches")
    for k, t, n in rows[:12]:
        print(f"    {t:8.1f} us  x{n:<3} {k[:110]}")


def host(fn, run, x, label):
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        run(fn, x)
        sync(dev)
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    print(f"  {label}: host profile, 50 calls")
    print("\n".join("    " + ln for ln in out.getvalue().splitlines()[6:24]))


table = {}
for name in ["eager", "torch.compile", "kiln"]:
    model, inputs, run, labels = make(dev, os.environ.get("SMALL") == "1")
    fn = build(name, model)
    with torch.no_grad():
        for p in range(3):
            held = [run(fn, x) for x in inputs]
            if name == "kiln" and p == 0:
                kiln_waited()
        sync(dev)
        del held
        times = {}
        for _ in range(reps):
            for x, lab in zip(inputs, labels):
                sync(dev)
                t0 = time.perf_counter()
                run(fn, x)
                sync(dev)
                times.setdefault(lab, []).append(time.perf_counter() - t0)
        table[name] = {lab: 1e3 * statistics.median(ts) for lab, ts in times.items()}
        for lab, x in zip(labels, inputs):
            if any(lab.endswith(f" {n}") for n in profile_at):
                kernels(fn, run, x, f"{name} {lab}")
            if name == "kiln" and any(lab.endswith(f" {n}") for n in host_at):
                host(fn, run, x, f"{name} {lab}")
    print(f"{name}: done", flush=True)

labs = sorted(table["eager"], key=lambda s: int(s.split()[-1]))
print(f"{'size':<10} {'eager ms':>9} {'tc ms':>8} {'kiln ms':>8} {'kiln/tc':>8}")
for lab in labs:
    e, t, k = table["eager"][lab], table["torch.compile"][lab], table["kiln"][lab]
    print(f"{lab:<10} {e:9.3f} {t:8.3f} {k:8.3f} {k / t:8.2f}")
tot = {n: sum(table[n].values()) for n in table}
print(f"{'sum':<10} {tot['eager']:9.2f} {tot['torch.compile']:8.2f} {tot['kiln']:8.2f} "
      f"{tot['kiln'] / tot['torch.compile']:8.2f}")
