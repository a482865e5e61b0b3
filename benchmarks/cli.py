"""Command line: ``python -m benchmarks [--device cpu|cuda] [--suite micro|models|all]
[--backends eager,torch.compile,kiln-eager,kiln-aot_eager,kiln] [--quick] [--out DIR]``."""
from __future__ import annotations

import argparse
import os
import sys

from benchmarks.backends import DEFAULT_BACKENDS

#: a cuda run of the whole suite must end within 10 minutes: cells stop starting here
DEFAULT_CUDA_BUDGET_S = 520


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--suite", choices=["micro", "models", "all"], default="micro")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help="comma-separated; also torch.compile:<backend>, kiln:<backend>")
    p.add_argument("--quick", action="store_true", help="small sizes, 30 runs: < 3 min on a 2-core CPU")
    p.add_argument("--out", default="benchmark-results", help="folder for results.json, table, chart")
    p.add_argument("--only", default="", help="comma-separated substrings of workload keys to keep")
    p.add_argument("--all-dtypes", action="store_true",
                   help="every model in inference and training at both fp32 and bf16 (default: the "
                        "rows that fit the 10-minute GPU run: bf16 inference, fp32 training)")
    p.add_argument("--runs", type=int, default=30, help="minimum timed runs per cell (>= 30)")
    p.add_argument("--rounds", type=int, default=None,
                   help="time each workload's backends again in this many interleaved rounds "
                        "and report the pooled median (default 6; 0 with --quick)")
    p.add_argument("--no-warm", action="store_true", help="skip the warm-cache subprocess")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"stop starting cells after this long (default {DEFAULT_CUDA_BUDGET_S} on cuda, none on cpu)")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for PyTorch and OpenMP kernels (default: 1 for a --quick CPU run, "
                        "else leave as is); "
                        "1 gives steadier CPU timings on a shared machine")
    p.add_argument("--tf32", choices=["off", "on", "default"], default="off",
                   help="TF32 for fp32 matmul/convolution on GPUs (default off: fp32 rows are real "
                        "fp32, so gradients can be checked tightly; 'default' leaves PyTorch's)")
    p.add_argument("--keep-cache", action="store_true", help="keep the per-cell cache folders")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if a.quick and a.device == "cpu" and not a.threads:
        a.threads = 1  # the quick run is a smoke test on shared 2-core machines: keep it steady
    if a.threads:  # before torch and any OpenMP kernel library loads; subprocesses inherit
        os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # workloads and timings live in this process: no other process should share the GPU
    import torch

    from benchmarks import harness, report
    from benchmarks.workloads import select

    if a.threads:
        torch.set_num_threads(a.threads)
    if a.tf32 != "default":
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "on"
        os.environ["KILN_BENCH_TF32"] = a.tf32  # the warm-cache subprocess does the same
    if a.device == "cpu" and os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: "
              "other processes compete, CPU timings will be noisy (try --threads 1)", flush=True)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU visible", file=sys.stderr)
        return 2
    budget = a.budget_s if a.budget_s is not None else (DEFAULT_CUDA_BUDGET_S if a.device == "cuda" else 0)
    opts = harness.Options(device=a.device, backends=[b for b in a.backends.split(",") if b],
                           quick=a.quick, min_runs=max(30, a.runs), warm_compile=not a.no_warm,
                           budget_s=budget, keep_cache=a.keep_cache,
                           interleave_rounds=(a.rounds if a.rounds is not None else
                                              0 if a.quick else 6),
                           target_s=0.5 if a.device == "cuda" else 1.0,
                           log=lambda s: print(s, flush=True))
    workloads = select(a.device, a.suite, a.quick, [s for s in a.only.split(",") if s] or None,
                       all_dtypes=a.all_dtypes)
    result = harness.run(workloads, opts)
    paths = report.write_all(result, a.out)
    print()
    print(report.table(result))
    print()
    print("wrote " + ", ".join(os.path.abspath(p) for p in paths.values()))
    return 0
