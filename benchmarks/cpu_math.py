"""Micro-benchmark of the C++ path's scalar math: one op per row, 16M fp32 elements.

Each row is one aten op compiled alone by kiln (``kiln.kernels.compile_aten_graph``),
timed against eager and, unless ``--no-inductor``, torch.compile — the median of
``--runs`` interleaved calls (time.perf_counter) after warm-up, all under
``torch.set_num_threads(--threads)``. Inputs lie in each function's domain. The table
is printed and written to ``benchmarks/results/cpu/cpu_math_<date>.txt`` (with
``KILN_CPU_VECTOR_MATH=0``, scalar libm: ``..._scalar_libm.txt``).

    python -m benchmarks.cpu_math [--runs 15] [--threads 2] [--no-inductor] [--ops sin,erf]
"""
from __future__ import annotations

import argparse
import datetime
import os

import torch
import torch.fx as fx

import kiln.config
from kiln.kernels import compile_aten_graph

from benchmarks.cpu_kernels import bench   # interleaved medians, as the other CPU rows

aten = torch.ops.aten
N = 1 << 24

# name: (aten op, eager function, input maker(s) from a uniform [0, 1) tensor)
_wide = lambda u: u * 20 - 10                    # noqa: E731
_unit = lambda u: u * 2 - 1                      # noqa: E731
_pos = lambda u: u * 100 + 1e-3                  # noqa: E731
ROWS = {
    "sin": (aten.sin.default, torch.sin, [_wide]),
    "cos": (aten.cos.default, torch.cos, [_wide]),
    "tan": (aten.tan.default, torch.tan, [_wide]),
    "erf": (aten.erf.default, torch.erf, [_wide]),
    "gelu": (aten.gelu.default, torch.nn.functional.gelu, [_wide]),
    "exp": (aten.exp.default, torch.exp, [_wide]),
    "exp2": (aten.exp2.default, torch.exp2, [_wide]),
    "expm1": (aten.expm1.default, torch.expm1, [_wide]),
    "log": (aten.log.default, torch.log, [_pos]),
    "log2": (aten.log2.default, torch.log2, [_pos]),
    "log10": (aten.log10.default, torch.log10, [_pos]),
    "log1p": (aten.log1p.default, torch.log1p, [_pos]),
    "tanh": (aten.tanh.default, torch.tanh, [_wide]),
    "sinh": (aten.sinh.default, torch.sinh, [_wide]),
    "cosh": (aten.cosh.default, torch.cosh, [_wide]),
    "asin": (aten.asin.default, torch.asin, [_unit]),
    "acos": (aten.acos.default, torch.acos, [_unit]),
    "atan": (aten.atan.default, torch.atan, [_wide]),
    "asinh": (aten.asinh.default, torch.asinh, [_wide]),
    "atanh": (aten.atanh.default, torch.atanh, [_unit]),
    "sigmoid": (aten.sigmoid.default, torch.sigmoid, [_wide]),
    "sqrt": (aten.sqrt.default, torch.sqrt, [_pos]),
    "pow": (aten.pow.Tensor_Tensor, torch.pow, [_pos, _unit]),
    "atan2": (aten.atan2.default, torch.atan2, [_wide, _wide]),
}


def _graph(op, nargs):
    names = [f"x{i}" for i in range(nargs)]
    src = f"def f({', '.join(names)}):\n    return (op({', '.join(names)}),)\n"
    ns = {"op": op}
    exec(src, ns)
    return fx.symbolic_trace(ns["f"])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-inductor", action="store_true")
    ap.add_argument("--ops", default=",".join(ROWS))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "cpu"))
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    lines = [f"torch {torch.__version__}, threads {a.threads}, {N} fp32 elements, "
             f"median of {a.runs} runs (ms), kiln vector math "
             f"{'on' if kiln.config.cpu_vector_math else 'off (KILN_CPU_VECTOR_MATH=0)'}",
             f"{'op':8s} {'eager':>8s} {'t.compile':>10s} {'kiln':>8s} {'kiln/eager':>11s}"
             f" {'max|err|':>9s}"]
    print("\n".join(lines), flush=True)
    for name in a.ops.split(","):
        op, eager, makers = ROWS[name]
        args = [m(torch.rand(N)) for m in makers]
        kiln_fn = compile_aten_graph(_graph(op, len(args)), args)
        ns = {"f": eager}     # a code object per row: torch.compile keys its cache on it
        exec("def eager_fn(*xs):\n    return (f(*xs),)\n", ns)
        eager_fn = ns["eager_fn"]
        ref, got = eager_fn(*args)[0], kiln_fn(*args)[0]
        err = (ref - got).abs().nan_to_num(0.0).max().item()
        fns = [eager_fn, kiln_fn]
        if not a.no_inductor:
            comp = torch.compile(eager_fn)
            comp(*args)
            fns.append(comp)
        t = bench(fns, args, a.runs)
        tc = f"{t[2]:10.2f}" if len(t) > 2 else f"{'-':>10s}"
        line = f"{name:8s} {t[0]:8.2f} {tc} {t[1]:8.2f} {t[0] / t[1]:10.2f}x {err:9.1e}"
        lines.append(line)
        print(line, flush=True)
    os.makedirs(a.out, exist_ok=True)
    tag = "" if kiln.config.cpu_vector_math else "_scalar_libm"
    path = os.path.join(a.out, f"cpu_math_{datetime.date.today().isoformat()}{tag}.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("written", path)


if __name__ == "__main__":
    main()
