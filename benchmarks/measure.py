"""Timing, memory and accuracy measurements, the same for every backend.

Times are per call: CUDA events around each call on a GPU (the device's own clock,
no host jitter from the synchronising), ``time.perf_counter`` on a CPU. Calls rotate
over a few input sets so that no backend is flattered by data left in caches.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.utils._pytree as pytree


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_first_call(call, device: str) -> tuple[float, object]:
    """Wall seconds of one call, device work included, and what it returned."""
    sync(device)
    t0 = time.perf_counter()
    out = call()
    sync(device)
    return time.perf_counter() - t0, out


def time_calls(call, n_inputs: int, device: str, runs: int, warmup: int) -> list[float]:
    """Per-call times in seconds of ``call(i)`` for ``runs`` calls after ``warmup`` calls,
    ``i`` cycling over ``range(n_inputs)``. Warm-up covers every input set at least once,
    so data-dependent paths (a branch taken for some inputs only) are compiled before
    the clock starts."""
    warmup = max(warmup, n_inputs)
    for i in range(warmup):
        call(i % n_inputs)
    sync(device)
    times = []
    if device == "cuda":
        pairs = []
        for i in range(runs):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            call(i % n_inputs)
            e.record()
            pairs.append((s, e))
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in pairs]
    else:
        for i in range(runs):
            t0 = time.perf_counter()
            call(i % n_inputs)
            times.append(time.perf_counter() - t0)
    return times


def median(xs):
    return statistics.median(xs) if xs else None


def tensor_leaves(x) -> list[torch.Tensor]:
    """Every tensor in a (possibly nested) output: tuples, lists, dicts, model outputs."""
    if hasattr(x, "to_tuple") and not isinstance(x, torch.Tensor):  # transformers' ModelOutput
        x = x.to_tuple()
    return [t for t in pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]


def scaled_error(got, ref, floor: float = 0.0) -> float:
    """max |got - ref| over every tensor, divided by that tensor's max |ref| (or by
    ``floor`` if larger).

    One number per output that reads as "relative error at the scale of the result";
    a shape or dtype mismatch, or NaN where the reference has none, is infinite.
    """
    g, r = tensor_leaves(got), tensor_leaves(ref)
    if len(g) != len(r):
        return math.inf
    worst = 0.0
    for a, b in zip(g, r):
        if a.shape != b.shape or a.dtype != b.dtype:
            return math.inf
        if a.numel() == 0:
            continue
        a64, b64 = a.detach().double(), b.detach().double()
        nan_a, nan_b = torch.isnan(a64), torch.isnan(b64)
        if not torch.equal(nan_a, nan_b):
            return math.inf
        a64, b64 = a64.masked_fill(nan_a, 0), b64.masked_fill(nan_b, 0)
        scale = max(b64.abs().max().item(), floor, 1e-30)
        worst = max(worst, (a64 - b64).abs().max().item() / scale)
    return worst


def clone_out(x):
    """A detached copy of a result, so later calls (which may reuse buffers) can't change it."""
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t,
                           x.to_tuple() if hasattr(x, "to_tuple") else x)


def grads_of(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for n, p in model.named_parameters() if p.requires_grad}


#: a gradient's error is scaled by at least this fraction of the largest gradient of
#: the model: some parameters' gradients are zero in exact arithmetic (a key bias in
#: attention, say) and hold only rounding noise, whose "relative error" means nothing
GRAD_SCALE_FLOOR = 1e-2


def grad_errors(got: dict, ref: dict) -> tuple[float, str]:
    """Worst scaled gradient error and the parameter it is on."""
    if set(got) != set(ref):
        return math.inf, "parameter sets differ"
    if not ref:
        return 0.0, ""
    top = max(r.abs().max().item() if r.numel() else 0.0 for r in ref.values())
    floor = GRAD_SCALE_FLOOR * top
    worst, where = 0.0, ""
    for name, r in ref.items():
        e = scaled_error(got[name], r, floor)
        if e > worst:
            worst, where = e, name
    return worst, where


class PeakMemory:
    """Peak bytes allocated on the GPU inside the block (None on a CPU: PyTorch's CPU
    allocator keeps no such statistics, and tracemalloc would not see its buffers)."""

    def __init__(self, device: str):
        self.device = device
        self.peak = None

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        return False
