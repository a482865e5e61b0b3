"""A compiled inference call's host time, layer by layer (CPU or GPU).

    python -m benchmarks.probes.call_layers --only resnet50/infer/bf16 [--device cuda] [--calls 200]

kiln's call passes through the capture entry (guards), the perf fallback's choice, the
autograd stage's runtime, the compiled graph's signature dispatch and the kernel
runtime (on a GPU, the CUDA-graph replay). Each layer's ``__call__`` is wrapped in a
timer after warm-up (and the perf trial); the table gives each layer's time with its
callees and without them (own), per call, mean over ``--calls`` calls, with the GPU
idle at entry. On a CPU the runtime's time includes the kernels. cProfile would
inflate the many C-level attribute reads the guards make; these timers do not.
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from benchmarks.backends import make_backend
from benchmarks.workloads import select

_LAYERS = [
    ("capture entry", None, None),
    ("perf choice", "kiln.kernels.runtime.perf_fallback", "InferenceChoice.__call__"),
    ("autograd runtime", "kiln.autograd.runtime", "AotFunction.__call__"),
    ("inference path", "kiln.autograd.runtime", "_Inference.__call__"),
    ("compiled graph", "kiln.kernels.compile", "CompiledGraph.__call__"),
    ("signature dispatch", "kiln.kernels.compile", "CompiledGraph._variant"),
    ("kernel runtime", "kiln.kernels.runtime.runner", "Runtime.__call__"),
    ("graph replay", "kiln.kernels.runtime.graph_replay", "GraphReplay.__call__"),
    ("replay launch", "torch.cuda", "CUDAGraph.replay"),
]


def _wrap(totals, stack, name, fn):
    def timed(*args, **kwargs):
        stack.append(0.0)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            inner = stack.pop()
            totals[name][0] += dt
            totals[name][1] += dt - inner
            if stack:
                stack[-1] += dt
    return timed


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--python", type=int, default=0, metavar="N",
                   help="also print cProfile's top N functions by own time (it inflates "
                        "C-level calls; for which Python functions, not how long)")
    a = p.parse_args(argv)
    import importlib
    for w in select(a.device, "all", False, a.only.split(",")):
        if w.mode != "infer":
            continue
        backend = make_backend("kiln")
        inst = w.build(a.device)
        compiled = backend.compile(inst.fn)
        with torch.no_grad():
            for i in range(60):
                compiled(*inst.inputs[i % len(inst.inputs)])
            backend.settle()
            for i in range(10):
                compiled(*inst.inputs[i % len(inst.inputs)])
        totals, stack, undo = defaultdict(lambda: [0.0, 0.0]), [], []
        for name, mod, attr in _LAYERS[1:]:
            cls_name, meth = attr.split(".")
            cls = getattr(importlib.import_module(mod), cls_name, None)
            if cls is None:
                continue
            orig = cls.__dict__[meth]
            setattr(cls, meth, _wrap(totals, stack, name, orig))
            undo.append((cls, meth, orig))
        entry = _wrap(totals, stack, "capture entry", compiled)
        try:
            with torch.no_grad():
                for i in range(a.calls):
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                    entry(*inst.inputs[i % len(inst.inputs)])
        finally:
            for cls, meth, orig in undo:
                setattr(cls, meth, orig)
        print(f"== {w.key} ({a.device}): us per call, with callees / own")
        for name, _, _ in _LAYERS:
            if name in totals:
                t, own = totals[name]
                print(f"  {name:20s} {t / a.calls * 1e6:9.1f} {own / a.calls * 1e6:9.1f}")
        if a.python:
            import cProfile
            import io
            import pstats
            prof = cProfile.Profile()
            with torch.no_grad():
                prof.enable()
                for i in range(a.calls):
                    compiled(*inst.inputs[i % len(inst.inputs)])
                prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(a.python)
            print(buf.getvalue())
        backend.reset()


if __name__ == "__main__":
    main()
