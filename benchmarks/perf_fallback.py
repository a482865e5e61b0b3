"""The perf fallback's effect: eager, kiln with ``perf_fallback`` off, and kiln with it on,
side by side in one process (``kiln.compile(options={"perf_fallback": ...})``).

Rows: ``torch.topk`` at three sizes (the issue's "CPU topk 3-4x slower"), ``logsumexp``
over dim 0 (a reduction kiln's C++ path runs slower than eager), and resnet18 inference
at 128 px, batch 1 (the issue's CPU model row; batch 16 with ``--device cuda``). Each
compiled function first gets ``--warmup`` calls (more than a trial takes: the decision
is made before the clock starts), then ``--runs`` interleaved rounds (eager, off, on; the
order rotating each round); figures are medians in ms. Each decision is printed as
``KILN_LOGS=perf`` logs it.

    python -m benchmarks.perf_fallback [--runs 60] [--warmup 40] [--only topk,resnet18]
                                       [--threads N] [--device cuda]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

import kiln
from kiln.debug.logs import log_for


DEVICE = "cpu"


def _topk(n):
    return lambda: ((lambda x: torch.topk(x, 5)), (torch.randn(n, device=DEVICE),))


def _logsumexp():
    return (lambda x: torch.logsumexp(x, 0)), (torch.randn(4096, 1024, device=DEVICE),)


def _resnet18():
    import torchvision
    m = torchvision.models.resnet18().eval().to(DEVICE)
    batch = 16 if DEVICE == "cuda" else 1       # the issue's rows: H100 16, CPU 1
    return torch.no_grad()(m), (torch.randn(batch, 3, 128, 128, device=DEVICE),)


ROWS = {
    "topk_100": _topk(100),
    "topk_10k": _topk(10_000),
    "topk_1M": _topk(1_000_000),
    "logsumexp_dim0_4096x1024": _logsumexp,
    "resnet18_b1_128px": _resnet18,
}


class _Decisions(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def run_row(make, runs, warmup):
    fn, args = make()
    off = kiln.compile(fn, options={"perf_fallback": False})
    on = kiln.compile(fn, options={"perf_fallback": True})
    fns = [fn, off, on]
    with torch.no_grad():
        for f in fns:
            for _ in range(warmup):
                f(*args)
        ts = [[] for _ in fns]
        order = list(range(len(fns)))
        for r in range(runs):
            # the order rotates: a call right after kiln's C++ kernels can pay for them
            # (OpenMP threads still busy), so no contender always follows another
            for k in order[r % 3:] + order[:r % 3]:
                _sync()
                t0 = time.perf_counter()
                fns[k](*args)
                _sync()
                ts[k].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in ts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--only", default="")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: as is)")
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    decisions = _Decisions()
    log = log_for("perf")
    log.addHandler(decisions)
    log.setLevel(logging.INFO)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"median of {a.runs} interleaved calls after {a.warmup} (ms)")
    print(f"{'workload':26s} {'eager':>9s} {'kiln off':>9s} {'kiln on':>9s} "
          f"{'off vs eager':>12s} {'on vs eager':>11s}")
    keys = [k for k in ROWS if not a.only or any(s in k for s in a.only.split(","))]
    for key in keys:
        decisions.lines.clear()
        e, off, on = run_row(ROWS[key], a.runs, a.warmup)
        print(f"{key:26s} {e:9.3f} {off:9.3f} {on:9.3f} {e / off:11.2f}x {e / on:10.2f}x",
              flush=True)
        for line in decisions.lines:
            print(f"    {line}")


if __name__ == "__main__":
    main()
