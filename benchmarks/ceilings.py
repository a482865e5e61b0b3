"""What the machine can do at best, measured in the same run as the benchmarks.

Copy bandwidth (a large ``copy_``, bytes read + written) bounds every memory-bound
kernel; matmul TFLOP/s bounds compute-bound ones. Micro rows are reported as a
fraction of these, which says how much is left to gain independent of any peer.
"""
from __future__ import annotations

import torch

from benchmarks.measure import median, time_calls

#: (copy elements fp32, matmul sizes per dtype) per device profile
_SIZES = {
    "cuda": (1 << 28, {"fp32": 8192, "bf16": 8192}),
    "cpu": (1 << 24, {"fp32": 1024}),
    "cpu-quick": (1 << 23, {"fp32": 512}),
}


def measure(device: str, quick: bool) -> dict:
    profile = "cuda" if device == "cuda" else ("cpu-quick" if quick else "cpu")
    n, mm = _SIZES[profile]
    out: dict = {}
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = median(time_calls(lambda i: dst.copy_(src), 1, device, runs=30, warmup=5))
    out["copy_GBps"] = 2 * n * 4 / t / 1e9
    out["copy_bytes"] = 2 * n * 4
    del src, dst
    out["matmul_TFLOPs"] = {}
    for name, size in mm.items():
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        a = torch.randn(size, size, device=device, dtype=dtype)
        b = torch.randn(size, size, device=device, dtype=dtype)
        t = median(time_calls(lambda i: a @ b, 1, device, runs=30, warmup=3))
        out["matmul_TFLOPs"][name] = 2 * size**3 / t / 1e12
        out.setdefault("matmul_size", {})[name] = size
    if device == "cuda":
        out["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return out
