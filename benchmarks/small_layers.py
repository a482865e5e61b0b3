"""Host overhead of a whole compiled graph on the CPU: 40 Linear(16, 16) + ReLU layers on
one row, where every op is tiny and the cost is the Python around the calls (guards,
argument views, launches). Eager, torch.compile and kiln, interleaved, one thread.

    python -m benchmarks.small_layers [--layers 40] [--repeats 15] [--calls 200]

prints the median µs per call of each over ``repeats`` batches of ``calls`` calls.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def model(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU())
                                 for _ in range(layers)]).eval()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    import kiln
    m, x = model(a.layers), torch.randn(1, 16)
    fns = {"eager": m, "torch.compile": torch.compile(model(a.layers)),
           "kiln": kiln.compile(model(a.layers))}
    times = {k: [] for k in fns}
    with torch.no_grad():
        ref = m(x)
        for k, f in fns.items():
            for _ in range(5):
                y = f(x)
            torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6, msg=k)
        for _ in range(a.repeats):
            for k, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    f(x)
                times[k].append((time.perf_counter() - t0) / a.calls * 1e6)
    print(f"{a.layers} x (Linear(16, 16) + ReLU) on [1, 16], CPU, 1 thread; torch {torch.__version__}")
    for k, ts in times.items():
        print(f"  {k:14s} {statistics.median(ts):8.1f} us per call")


if __name__ == "__main__":
    main()
