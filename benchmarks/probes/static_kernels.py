"""kiln's GPU kernels of one static resnet18 call (bf16, batch 64, 224 px, inference),
from the profiler, biggest first: run with ``KILN_KERNEL_SIZE_ARGS=0`` and ``=1`` to see
what sizes as kernel arguments cost each kernel against literal sizes. The perf
fallback is off: its trial alternates the compiled graph with eager's ops during the
first calls, and a profile taken then mixes the two (a kernel that ran in 3 of the 5
profiled calls reads as 3/5 of its time).

    KILN_KERNEL_SIZE_ARGS=0|1 python -m benchmarks.probes.static_kernels
    KILN_TRITON_LITERAL_DIVISORS=0|1 python -m benchmarks.probes.static_kernels

Session 41 on an H200 (``results/cuda-2026-11-28-session41``): 1632 us a call with size
arguments, 1372 with literal sizes, 1394 with literal divisors and the other sizes
arguments (the default since).
"""
import os

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

import kiln

kiln.config.perf_fallback = False
torch.manual_seed(0)
m = torchvision.models.resnet18().to("cuda", torch.bfloat16).eval()
f = kiln.compile(m, dynamic=False)
x = torch.randn(64, 3, 224, 224, device="cuda", dtype=torch.bfloat16)
with torch.no_grad():
    for _ in range(10):
        f(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            f(x)
        torch.cuda.synchronize()
rows = sorted([(e.key, e.device_time_total / 5, e.count / 5) for e in prof.key_averages()
               if e.device_time_total > 0], key=lambda r: -r[1])
print("KILN_KERNEL_SIZE_ARGS", os.environ.get("KILN_KERNEL_SIZE_ARGS"),
      f"kernels per call {sum(r[1] for r in rows):.0f} us")
for k, t, n in rows[:8]:
    print(f"  {t:8.1f} us x{n:<4g} {k[:90]}")
