"""Where a replayed inference call's wall time goes beyond its kernels' time (GPU only).

    python -m benchmarks.probes.call_gaps --only mobilenet_v3_small/infer/bf16 \\
        [--backends torch.compile-ro,kiln] [--calls 50]

The suite times a call with CUDA events around it, so a call costs its kernels' time
plus what the GPU waits for: the host's work before the first launch, and idle time
between kernels inside the replay. Per backend, after the warm-up and kiln's perf
trial, this prints:

* back to back: event-timed calls without synchronising between them, as the suite
  times them, and the host's time per call meanwhile;
* ``wall``: an event-timed call after synchronising (median);
* ``host``: the call's own host time, from entry to return, with the GPU idle at entry;
* ``span``/``busy``/``idle``: from the profiler, first kernel start to last kernel end
  in one call, the kernels' summed time, and the difference; plus the largest gaps with
  the kernels on each side, and the runtime API calls per call (graph launches, copies,
  memsets), which say whether the call was one replay.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch

from benchmarks.backends import make_backend
from benchmarks.workloads import select


def _infer_step(backend, w, device):
    inst = w.build(device)
    compiled = backend.compile(inst.fn)
    ro = getattr(backend, "mode", None) == "reduce-overhead"

    def step(i=0):
        if ro:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.no_grad():
            return compiled(*inst.inputs[i % len(inst.inputs)])
    return step


def _wall_and_host(step, calls):
    walls, hosts = [], []
    for i in range(calls):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        out = step(i)
        e.record()
        hosts.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
        walls.append(s.elapsed_time(e))
        del out
    return statistics.median(walls), statistics.median(hosts)


def _back_to_back(step, calls):
    """As the suite times: events around each call, no synchronising between calls.
    (median event ms, median host ms per call): a host time near the event time says
    the call waited for the GPU (a synchronising operation in it)."""
    pairs, hosts = [], []
    torch.cuda.synchronize()
    for i in range(calls):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        step(i)
        e.record()
        hosts.append((time.perf_counter() - t0) * 1e3)
        pairs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs), statistics.median(hosts)


def _timeline(step, calls, top):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            torch.cuda.synchronize()
            with torch.profiler.record_function("probe_call"):
                out = step(i)
                torch.cuda.synchronize()
            del out
    events = prof.events()
    marks = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == "probe_call")
    gpu = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                 if e.device_type == torch.autograd.DeviceType.CUDA)
    runtime = Counter(e.name for e in events if e.name.startswith("cuda") and
                      e.device_type == torch.autograd.DeviceType.CPU)
    spans, busys, gaps = [], [], []
    for lo, hi in marks[1:]:            # the first profiled call pays the profiler's start
        ks = [k for k in gpu if lo <= k[0] <= hi]
        if not ks:
            continue
        spans.append(ks[-1][1] - ks[0][0])
        busys.append(sum(b - a for a, b, _ in ks))
        for prev, nxt in zip(ks, ks[1:]):
            gaps.append((nxt[0] - prev[1], prev[2][:60], nxt[2][:60]))
    n = max(len(spans), 1)
    by_pair: Counter = Counter()
    for g, before, after in gaps:
        by_pair[(before, after)] += g / n
    summary = {"span_ms": statistics.median(spans) / 1e3 if spans else float("nan"),
               "busy_ms": statistics.median(busys) / 1e3 if busys else float("nan"),
               "kernels": len([k for k in gpu if marks and k[0] >= marks[1][0]]) / n,
               "runtime": {k: v / calls for k, v in runtime.most_common(8)}}
    return summary, [(g, b, a) for (b, a), g in by_pair.most_common(top)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", required=True)
    p.add_argument("--backends", default="torch.compile-ro,kiln")
    p.add_argument("--calls", type=int, default=50)
    p.add_argument("--top", type=int, default=8)
    a = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for w in select("cuda", "all", False, a.only.split(",")):
        if w.mode != "infer":
            continue
        print(f"== {w.key}", flush=True)
        for name in a.backends.split(","):
            backend = make_backend(name)
            step = _infer_step(backend, w, "cuda")
            for i in range(60):          # compile, warm up, and kiln's perf trial
                step(i)
            if hasattr(backend, "settle"):
                backend.settle()
                for i in range(10):
                    step(i)
            wall, host = _wall_and_host(step, a.calls)
            b2b, b2b_host = _back_to_back(step, a.calls)
            print(f"  {name}: back to back (the suite's timing) {b2b:.3f} ms per call, "
                  f"host {b2b_host:.3f} ms per call", flush=True)
            s, gaps = _timeline(step, 12, a.top)
            print(f"  {name}: wall {wall:.3f} ms, host {host:.3f} ms, span {s['span_ms']:.3f} ms, "
                  f"busy {s['busy_ms']:.3f} ms, idle in span {s['span_ms'] - s['busy_ms']:.3f} ms, "
                  f"{s['kernels']:.0f} kernels/call", flush=True)
            print(f"    runtime calls per call: {s['runtime']}")
            for g, before, after in gaps:
                print(f"    gap {g:6.1f} us  {before}  ->  {after}")
            backend.reset()


if __name__ == "__main__":
    main()
