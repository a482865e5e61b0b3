"""GPU probe for ``kiln/kernels/pad_mm.py``: what padding misaligned products buys.

    python benchmarks/probes/pad_mm_probe.py [--tokens 4096] [--hidden 768] [--vocab 50257]
        [--skip-cublas] [--skip-kiln]

Figures measured with it: ``benchmarks/results/cuda-2026-11-27/README.md``.

1. cuBLAS alone (torch.mm), per dtype (bf16, fp16, fp32, fp32 under TF32): the GPT-2 LM
   head's three products (forward ``x @ W.t()``, the input gradient ``G @ W``, the weight
   gradient ``G.t() @ x``) on the vocabulary as it is and padded to the alignment, the
   cost of padding G alone, and three generic cases: M misaligned on a row-major operand
   (no leading dimension: padding should buy nothing), K misaligned, N misaligned.
2. kiln: the LM head under bf16 autocast with cross-entropy, forward and backward, one
   compiled function per ``config.pad_mm`` setting ("0", "1"), checked against eager and
   timed per step.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from probe_timing import median_ms  # noqa: E402


def cublas_rows(t, h, v):
    print(f"cuBLAS, ms (T={t} H={h} V={v}; P: padded to the alignment)")
    cols = ["fwd", "fwdP", "dX", "dXP", "dW", "dWP", "padG", "Mrow", "MrowP", "K", "KP", "N", "NP"]
    print(f"{'dtype':10}" + "".join(f"{c:>8}" for c in cols))
    for name in ("bf16", "fp16", "fp32", "tf32"):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(name, torch.float32)
        torch.backends.cuda.matmul.fp32_precision = "tf32" if name == "tf32" else "ieee"
        align = 8 if dt != torch.float32 else 4
        p = v + (-v % align)

        def r(*s):
            return torch.randn(*s, device="cuda", dtype=dt)
        x, w, g = r(t, h), r(v, h), r(t, v)
        wp, gp = F.pad(w, (0, 0, 0, p - v)), F.pad(g, (0, p - v))
        row = [median_ms(lambda: x @ w.t()), median_ms(lambda: x @ wp.t()),
               median_ms(lambda: g @ w), median_ms(lambda: gp @ wp),
               median_ms(lambda: g.t() @ x), median_ms(lambda: gp.t() @ x),
               median_ms(lambda: F.pad(g, (0, p - v)))]
        a, b = r(4097, 1024), r(1024, 4096)
        ap = F.pad(a, (0, 0, 0, -4097 % align))
        row += [median_ms(lambda: a @ b), median_ms(lambda: ap @ b)]
        a, b = r(4096, 1001), r(1001, 4096)
        ap, bp = F.pad(a, (0, -1001 % align)), F.pad(b, (0, 0, 0, -1001 % align))
        row += [median_ms(lambda: a @ b), median_ms(lambda: ap @ bp)]
        a, b = r(4096, 1024), r(1024, 4095)
        bp = F.pad(b, (0, 1))
        row += [median_ms(lambda: a @ b), median_ms(lambda: a @ bp)]
        print(f"{name:10}" + "".join(f"{x:8.3f}" for x in row), flush=True)
    torch.backends.cuda.matmul.fp32_precision = "ieee"


def kiln_rows(t, h, v):
    import kiln
    from kiln import config

    def step(x, w, tgt):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = x @ w.t()
            loss = F.cross_entropy(logits.float(), tgt)
        loss.backward()
        return loss.detach()

    tgt = torch.randint(0, v, (t,), device="cuda")
    x0, w0 = torch.randn(t, h, device="cuda"), torch.randn(v, h, device="cuda") * 0.02
    ref = None
    print("kiln, LM head forward + backward under bf16 autocast, ms per step")
    for mode in ("eager", "0", "1"):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        fn = step if mode == "eager" else kiln.compile(step)
        with config.patch(pad_mm=mode if mode != "eager" else "0"):
            loss = fn(x, w, tgt)
            gw = w.grad.clone()

            def run():
                x.grad = w.grad = None
                fn(x, w, tgt)
            ms = median_ms(run, reps=20)
        if ref is None:
            ref = (loss, gw)
        err = ((gw - ref[1]).abs().max() / ref[1].abs().max()).item()
        print(f"  pad_mm={mode:6} {ms:8.3f} ms   loss {loss.item():.5f}   "
              f"weight grad rel. err vs eager {err:.2e}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--skip-cublas", action="store_true")
    p.add_argument("--skip-kiln", action="store_true")
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    if not a.skip_cublas:
        cublas_rows(a.tokens, a.hidden, a.vocab)
    if not a.skip_kiln:
        kiln_rows(a.tokens, a.hidden, a.vocab)


if __name__ == "__main__":
    main()
