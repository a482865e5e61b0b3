"""What a new shape costs each attention kernel and a matmul at their first call (the
GPU's plan building), then at the second: bf16, causal, 4 x 8 heads x L x 64.

    python -m benchmarks.probes.attention_first_call

cuDNN's attention builds an execution plan per shape; a size stream meets a new shape at
every call, which is why a per-size graph leaves cuDNN out (``kiln/autograd/sdpa.in_stream``).
"""
import contextlib
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def first_and_second(length, backends):
    q = torch.randn(4, 8, length, 64, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    out = []
    with backends():
        for _ in range(2):
            t0 = time.perf_counter()
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            torch.cuda.synchronize()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def main():
    first_and_second(100, contextlib.nullcontext)          # the library's own set-up
    kinds = {"default": contextlib.nullcontext,
             "flash": lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION),
             "efficient": lambda: sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION),
             "cudnn": lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)}
    for shift, (name, backends) in enumerate(kinds.items()):
        rows = []
        for length in (137, 251, 333, 419):
            length += shift                                 # a shape no kernel met yet
            try:
                a, b = first_and_second(length, backends)
                rows.append(f"L={length}: {a:.2f} / {b:.2f} ms")
            except RuntimeError as e:
                rows.append(f"L={length}: {type(e).__name__}")
        print(f"{name:9s} first / second call: " + ", ".join(rows))
    for m in (137, 251, 333):
        a = torch.randn(4 * m, 512, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(512, 1376, device="cuda", dtype=torch.bfloat16)
        times = []
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            a @ w
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        print(f"matmul M={4 * m}: first {times[0]:.2f} ms, second {times[1]:.2f} ms")


if __name__ == "__main__":
    main()
