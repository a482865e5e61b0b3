"""CPU kernel figures: eager vs torch.compile vs kiln's compiled aten graph, one process.

Two workloads: a chain of 8 pointwise ops on a large tensor, and a row softmax over a
4096×4096 fp32 matrix. Each figure is the median of ``--runs`` (≥30) timed calls
(time.perf_counter) after warm-up, the contenders' calls interleaved. kiln compiles the aten graph directly
(``kiln.kernels.compile_aten_graph``); torch.compile is the peer to beat (``--no-inductor``
skips it).

    .venv/bin/python benchmarks/cpu_kernels.py [--runs 30] [--no-inductor]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.fx as fx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kiln.kernels import compile_aten_graph  # noqa: E402

aten = torch.ops.aten


def chain8(x, y):
    a = aten.mul.Tensor(x, y)
    a = aten.add.Tensor(a, 1.5)
    a = aten.sigmoid.default(a)
    a = aten.mul.Tensor(a, x)
    a = aten.exp.default(a)
    a = aten.sub.Tensor(a, y)
    a = aten.relu.default(a)
    a = aten.div.Tensor(a, 3.0)
    return (a,)


def softmax(x):
    return (aten._softmax.default(x, -1, False),)


def eager_chain8(x, y):
    a = torch.relu(torch.exp(torch.sigmoid(x * y + 1.5) * x) - y) / 3.0
    return (a,)


def eager_softmax(x):
    return (torch.softmax(x, -1),)


def bench(fns, args, runs):
    """Median ms of each function; runs are interleaved (a, b, c, a, b, c, ...) so that
    load from other processes on a shared machine hits every contender alike."""
    for fn in fns:
        for _ in range(3):
            fn(*args)
    ts = [[] for _ in fns]
    for _ in range(runs):
        for fn, acc in zip(fns, ts):
            t0 = time.perf_counter()
            fn(*args)
            acc.append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in ts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--no-inductor", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    cases = [
        ("chain of 8 pointwise, 16M fp32", chain8, eager_chain8,
         [torch.randn(4096, 4096), torch.randn(4096, 4096)]),
        ("row softmax 4096x4096 fp32", softmax, eager_softmax, [torch.randn(4096, 4096)]),
    ]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, median of {a.runs} runs (ms)")
    print(f"{'workload':34s} {'eager':>9s} {'torch.compile':>14s} {'kiln':>9s} {'kiln/eager':>11s}")
    for name, aten_fn, eager_fn, args in cases:
        gm = fx.symbolic_trace(aten_fn)
        t0 = time.perf_counter()
        kiln_fn = compile_aten_graph(gm, args)
        ct = time.perf_counter() - t0
        ref = eager_fn(*args)[0]
        got = kiln_fn(*args)[0]
        err = (ref - got).abs().max().item()
        fns = [eager_fn, kiln_fn]
        if not a.no_inductor:
            comp = torch.compile(eager_fn)
            comp(*args)
            fns.append(comp)
        times = bench(fns, args, a.runs)
        te, tk = times[0], times[1]
        tc = times[2] if len(times) > 2 else float("nan")
        print(f"{name:34s} {te:9.2f} {tc:14.2f} {tk:9.2f} {te / tk:10.2f}x"
              f"   (max |err| {err:.1e}, kiln compile {ct:.2f}s)")


if __name__ == "__main__":
    main()
