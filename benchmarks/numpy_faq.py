"""The FAQ's NumPy example on the CPU: NumPy itself, torch.compile and kiln, in one process.

``np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))`` on two 1024x64 float64 arrays
(torch.compile's FAQ, "Can I compile NumPy code using torch.compile?"). Each compiler
runs the same NumPy function (torch.compile with its default inductor backend; kiln with
its default backend); the figure is the median time per call after warm-up.

    python -m benchmarks.numpy_faq [--repeat N] [--threads T]

Prints a table and writes it to ``benchmarks/results/cpu/numpy_faq_threads<T>.md``. Set
``OMP_NUM_THREADS`` (read by torch, inductor's and kiln's kernels alike) to pin the
thread count of every runner; on a machine shared with other work, OpenMP's barriers
make multi-threaded figures noisy.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def numpy_fn(X, Y):
    return np.sum(X[:, :, None] * Y[:, None, :], axis=(-2, -1))


def _time_interleaved(fns, X, Y, repeat, rounds=10, warmup=3):
    """Median seconds per call of each function, timed in alternating rounds so that
    changes in the machine's load fall on every runner alike."""
    for fn in fns:
        for _ in range(warmup):
            fn(X, Y)
    times = [[] for _ in fns]
    per = max(1, repeat // rounds)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            for _ in range(per):
                t0 = time.perf_counter()
                fn(X, Y)
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--d", type=int, default=64)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((args.n, args.d))
    Y = rng.standard_normal((args.n, args.d))
    want = numpy_fn(X, Y)
    rows = []  # name, fn, first call (s), status

    def record(name, make):
        t0 = time.perf_counter()
        try:
            fn = make()
            got = fn(X, Y)
            first = time.perf_counter() - t0
            ok = isinstance(got, np.ndarray) and got.dtype == want.dtype and np.allclose(got, want)
            rows.append([name, fn, first, "ok" if ok else "WRONG RESULT"])
        except Exception as e:  # noqa: BLE001 -- a failing backend is a row, not a crash
            rows.append([name, None, time.perf_counter() - t0, f"error: {type(e).__name__}: {e}"[:80]])

    record("numpy", lambda: numpy_fn)
    import kiln

    record("kiln", lambda: kiln.compile(numpy_fn, fullgraph=True))
    record("torch.compile (inductor)", lambda: torch.compile(numpy_fn, fullgraph=True))
    timed = [r for r in rows if r[1] is not None]
    for r, med in zip(timed, _time_interleaved([r[1] for r in timed], X, Y, args.repeat)):
        r[1] = med
    for r in rows:
        if r[1] is None:
            r[1] = float("nan")
    base = rows[0][1]
    lines = [f"# FAQ NumPy example on the CPU ({args.n}x{args.d} float64, torch threads: "
             f"{torch.get_num_threads()}, cores: {os.cpu_count()})", "",
             "| runner | median per call (ms) | speed-up vs NumPy | first call (s) | result |",
             "|---|---:|---:|---:|---|"]
    for name, med, first, status in rows:
        lines.append(f"| {name} | {med * 1e3:.3f} | {base / med:.2f}x | {first:.2f} | {status} |")
    lines += ["", f"`OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python -m benchmarks.numpy_faq` "
              f"(repeat {args.repeat}; torch {torch.__version__}, NumPy {np.__version__})"]
    text = "\n".join(lines)
    print(text)
    out = os.path.join(os.path.dirname(__file__), "results", "cpu",
                       f"numpy_faq_threads{torch.get_num_threads()}.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
