"""H100 probe: kiln's pointwise kernel (GELU on the MLP's 8192x16384 bf16 activation, and
sin+cos on 2^27 fp32) at several XBLOCK / num_warps, against eager and a device copy of
the same bytes; interleaved rounds of CUDA-event medians."""
import statistics, sys, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import torch
import torch.nn.functional as F
import kiln
from kiln.kernels.codegen.triton import kernel as tg
from probe_timing import median_ms  # noqa: E402  (benchmarks/probes on sys.path)

VARIANTS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16)]


def t(fn, reps=50):
    return median_ms(fn, reps)


def compiled(fn, xb, nw):
    tg.XBLOCK = xb
    tg.TritonKernel._pointwise_warps = lambda self, nw=nw: nw
    return kiln.compile(lambda t: fn(t))


cases = {
    "gelu_bf16": (lambda t: F.gelu(t), torch.randn(8192, 16384, device="cuda", dtype=torch.bfloat16)),
    "sincos_fp32": (lambda t: torch.sin(t) + torch.cos(t), torch.randn(1 << 27, device="cuda")),
}
with torch.no_grad():
    for name, (fn, x) in cases.items():
        out = torch.empty_like(x)
        fns = {"eager": lambda: fn(x), "copy": lambda: out.copy_(x)}
        ref = fn(x)
        for xb, nw in VARIANTS:
            k = compiled(fn, xb, nw)
            got = k(x)
            d = (got.float() - ref.float()).abs().max().item()
            nd = (got != ref).sum().item()
            print(f"{name} kiln {xb}x{nw}: maxdiff {d:.3g}, {nd} elements differ", flush=True)
            fns[f"kiln_{xb}x{nw}"] = (lambda k=k: k(x))
        rounds = {k: [] for k in fns}
        for r in range(6):
            ks = list(fns)
            for k in ks[r % len(ks):] + ks[:r % len(ks)]:
                rounds[k].append(t(fns[k]))
        base = statistics.median(rounds["eager"])
        cp = statistics.median(rounds["copy"])
        for k, v in rounds.items():
            m = statistics.median(v)
            print(f"{name} {k:14s} {m:.4f} ms  x{base / m:.3f} eager, {cp / m * 100:.1f}% of copy", flush=True)
        del x, out, ref
