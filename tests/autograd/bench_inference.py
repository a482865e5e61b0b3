"""Inference speed of aot_eager vs eager, through ``kiln.compile``. A script, not a
test: ``python -m tests.autograd.bench_inference [--device cuda] [--models resnet18,...]``.

For each model (eval, no_grad): eager; ``kiln.compile(backend="eager")`` (capture only);
``kiln.compile(backend="aot_eager")`` (the "eager" op set: batch norm & co. kept whole,
ops called through eager's bindings); the "eager" op set with ops called as
``OpOverload``s (no ``eager_calls``); and the "core" op set (everything decomposed,
OpOverload calls: what aot_eager did before op-set profiles). Median of N timed calls
(CUDA events on GPU). ``--train``: a training step (train mode, forward + backward).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

import kiln
from kiln.autograd import aot_compile


def _core_aot_eager(gm, example_inputs):
    return aot_compile(gm, example_inputs, decompositions="core")


def _eager_ops_aten_calls(gm, example_inputs):
    return aot_compile(gm, example_inputs, decompositions="eager")


def _time(fn, x, reps, device, train=False):
    if train:
        def step(x):
            fn(x).float().sum().backward()
        with torch.enable_grad():
            return _time_calls(step, x, reps, device)
    with torch.no_grad():
        return _time_calls(fn, x, reps, device)


def _time_calls(fn, x, reps, device):
    if True:
        for _ in range(5):
            fn(x)
        times = []
        for _ in range(reps):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn(x)
                b.record()
                torch.cuda.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn(x)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _model(name):
    import torchvision
    return getattr(torchvision.models, name)()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--train", action="store_true",
                    help="time a training step (train mode, forward + backward)")
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    print(f"device={device} dtype={dtype} batch={args.batch} size={args.size} "
          f"{'training step' if args.train else 'inference'}, median of {args.reps} ms")
    for name in args.models.split(","):
        torch.manual_seed(0)
        m = _model(name).train(args.train).to(device=device, dtype=dtype)
        x = torch.randn(args.batch, 3, args.size, args.size, device=device, dtype=dtype)
        with torch.no_grad():
            ref = copy.deepcopy(m)(x)
        rows = {"eager": m}
        for label, backend in [("kiln eager", "eager"), ("aot_eager", "aot_eager"),
                               ("eager ops, aten", _eager_ops_aten_calls),
                               ("aot_eager core", _core_aot_eager)]:
            rows[label] = kiln.compile(copy.deepcopy(m), backend=backend)
        base = None
        for label, fn in rows.items():
            with torch.no_grad():
                err = (fn(x).float() - ref.float()).abs().max().item()
            ms = _time(fn, x, args.reps, device, args.train)
            base = base or ms
            print(f"{name:<10} {label:<16} {ms:8.3f} ms  {base / ms:5.2f}x eager  "
                  f"max|diff| {err:.3g}")


if __name__ == "__main__":
    main()
