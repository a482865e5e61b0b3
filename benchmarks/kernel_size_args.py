"""Kernels with sizes as arguments against the same kernels with sizes as literals (C++).

Each row is one graph compiled twice by kiln (``compile_aten_graph``), with
``kernel_size_args`` off (literals, one library per size) and on (``ks0``… arguments,
one library per size class: ``kiln/kernels/codegen/size_args.py``); the best of
``--runs`` calls of each, blocks of the two interleaved, under
``torch.set_num_threads(--threads)``. Also prints the C++ builds a stream of sizes cost
each way.

    python -m benchmarks.kernel_size_args [--runs 30] [--threads 2]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.kernels import compile_aten_graph
from kiln.kernels.toolchain import cxx_build

CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(2048, 1000),)),
    "layernorm": (lambda x: F.layer_norm(x, x.shape[-1:]), lambda: (torch.randn(2048, 768),)),
    "gelu_add": (lambda x, y: F.gelu(x + y), lambda: (torch.randn(2048, 1000), torch.randn(1000))),
    "transpose": (lambda x: (x.t() * 2).contiguous(), lambda: (torch.randn(1000, 2048),)),
    "sum0": (lambda x: x.sum(0), lambda: (torch.randn(4096, 1000),)),
    "bcast3d": (lambda x, y: (x * y + 1).relu(),
                lambda: (torch.randn(16, 512, 768), torch.randn(512, 1))),
    "permute_sum": (lambda x: x.permute(0, 2, 1).sum(-1), lambda: (torch.randn(32, 256, 384),)),
    "avg_pool": (lambda x: F.avg_pool2d(x, 3, 1, 1), lambda: (torch.randn(8, 64, 56, 56),)),
    "batch_norm": (lambda x: F.batch_norm(x, None, None, training=True),
                   lambda: (torch.randn(32, 64, 28, 28),)),
}


def _best(cg, args, runs):
    for _ in range(3):
        cg(*args)
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        cg(*args)
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def _stream_builds(on: bool) -> int:
    """C++ compiler runs for softmax + layernorm over rows of 33..64 columns each."""
    runs = []
    real = cxx_build._run_compiler
    cxx_build._run_compiler = lambda cmd: (runs.append(cmd), real(cmd))
    try:
        alive = []
        with kiln.config.patch(kernel_size_args=on):
            for cols in range(33, 65):
                x = torch.randn(64, cols)
                fn = CASES["softmax"][0]
                alive.append(compile_aten_graph(make_fx(fn)(x), [x], "cpp", perf_fallback=False))
    finally:
        cxx_build._run_compiler = real
    return len(runs)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"{'graph':12s} {'literals us':>12s} {'arguments us':>13s}")
    for name, (fn, make) in CASES.items():
        args = make()
        g = make_fx(fn)(*args)
        cgs = {}
        for on in (False, True):
            with kiln.config.patch(kernel_size_args=on):
                cgs[on] = compile_aten_graph(g, list(args), "cpp", perf_fallback=False)
        res = {on: [] for on in cgs}
        for _ in range(3):
            for on in cgs:
                res[on].append(_best(cgs[on], args, a.runs))
        print(f"{name:12s} {min(res[False]):12.1f} {min(res[True]):13.1f}")
    print(f"softmax over 64 x 33..64: {_stream_builds(False)} C++ builds with literals, "
          f"{_stream_builds(True)} with size arguments")


if __name__ == "__main__":
    main()
