"""Upper bound of the fused Linear+GELU: the same fused kernel with erf replaced by the
identity (wrong values; timing only) beside the real fused kernel and the library tier."""
import os, statistics, copy
os.environ["KILN_GRAPH_CACHE"] = "0"
import torch
import kiln
from kiln import config
from kiln.kernels import ops
from benchmarks.workloads.micro import GeluMLP

torch.manual_seed(0)
m = GeluMLP(4096, 16384).cuda().to(torch.bfloat16).eval()
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
orig = ops.OPS["erf"]
fns = {"eager": m}
with torch.no_grad():
    ref = m(x)
    for name, mode, erf in [("lib", "off", orig), ("fused", "sync", orig),
                            ("fused_noerf", "sync", (orig[0], "({0})"))]:
        config.matmul_epilogue = mode
        ops.OPS["erf"] = erf
        kiln.reset()
        f = kiln.compile(copy.deepcopy(m))
        y = f(x); y = f(x)
        kiln.wait_for_compiles()
        y = f(x)
        torch.cuda.synchronize()
        print(name, "maxdiff", (y.float() - ref.float()).abs().max().item(), flush=True)
        fns[name] = f
    ops.OPS["erf"] = orig

    def time_it(f, n=30):
        for _ in range(3): f(x)
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
            a.record(); f(x); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
        return statistics.median(ts)
    res = {k: [] for k in fns}
    names = list(fns)
    for r in range(10):
        for k in (names if r % 2 == 0 else names[::-1]):
            res[k].append(time_it(fns[k]))
    e = statistics.median(res["eager"])
    for k in names:
        med = statistics.median(res[k])
        ratios = [round(a / b, 3) for a, b in zip(res["eager"], res[k])]
        print(f"{k:12s} {med:.3f} ms  vs eager {e / med:.3f}x  per-round {ratios}", flush=True)
