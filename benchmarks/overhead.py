"""Per-call overhead (issue 2): what a compiled wrapper costs on a call that does
almost nothing, kiln beside torch.compile, both with backend="eager" so that only the
guard checks and the dispatch into the captured code are measured.

``python -m benchmarks.overhead [--repeats 20] [--calls 1000]`` prints, per function
and wrapper, the median µs per call over ``repeats`` batches of ``calls`` calls, and
that minus plain eager's time (the overhead itself).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.harness import short_error
from benchmarks.workloads.micro import toy_example


def add(a, b):
    return a + b


def _inputs():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, generator=g), torch.randn(4, generator=g)
    return {"a + b (4 elements)": (add, (a, b)),
            # b's sum is positive here: the graph break and both graphs run on each call
            "toy_example (2 graphs)": (toy_example, (a, b.abs()))}


def _torch_compile_eager(fn):
    import torch._dynamo

    torch._dynamo.reset()
    return torch.compile(fn, backend="eager")


def _kiln_eager(fn):
    import kiln

    kiln.reset()
    return kiln.compile(fn, backend="eager")


WRAPPERS = {"eager": lambda fn: fn,
            "torch.compile(backend='eager')": _torch_compile_eager,
            "kiln.compile(backend='eager')": _kiln_eager}


def per_call_us(f, args, repeats: int, calls: int) -> float:
    for _ in range(10):  # compile, then settle
        f(*args)
    batches = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            f(*args)
        batches.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(batches)


def measure(repeats: int = 20, calls: int = 1000) -> list[dict]:
    rows = []
    for label, (fn, args) in _inputs().items():
        base = None
        for wname, wrap in WRAPPERS.items():
            row = {"function": label, "wrapper": wname}
            try:
                compiled = wrap(fn)
                expect = fn(*args)
                if not torch.equal(compiled(*args), expect):
                    raise AssertionError("result differs from eager")
                row["us_per_call"] = per_call_us(compiled, args, repeats, calls)
                if wname == "eager":
                    base = row["us_per_call"]
                if base is not None:
                    row["overhead_us"] = row["us_per_call"] - base
            except Exception as e:  # noqa: BLE001 — kiln may be unfinished
                row["error"] = short_error(e)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    out = [f"{'function':<24}  {'wrapper':<32}  {'µs/call':>9}  {'overhead µs':>11}"]
    for r in rows:
        if "error" in r:
            out.append(f"{r['function']:<24}  {r['wrapper']:<32}  ERROR: {r['error'][:80]}")
        else:
            out.append(f"{r['function']:<24}  {r['wrapper']:<32}  {r['us_per_call']:9.2f}  "
                       f"{r.get('overhead_us', 0):11.2f}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--json", default="", help="also write the rows to this JSON file")
    a = p.parse_args(argv)
    rows = measure(a.repeats, a.calls)
    print(table(rows))
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
