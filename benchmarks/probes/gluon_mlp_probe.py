"""H100 probe: the warp-specialised Gluon Linear+GELU against cuBLAS addmm + GELU, and the
whole Linear-GELU-Linear MLP against eager, interleaved rounds of CUDA-event medians."""
import os, sys, time, statistics, json
sys.path.insert(0, os.path.dirname(__file__))
import torch
import torch.nn.functional as F
import triton
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
import ws_gemm_probe as W
from probe_timing import median_ms  # noqa: E402  (benchmarks/probes on sys.path)

OUT = os.environ.get("OUT", "/tmp")
torch.manual_seed(0)
dev = "cuda"
M, K, N = 8192, 4096, 16384
x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
fc1 = torch.nn.Linear(K, N).to(dev, torch.bfloat16)
fc2 = torch.nn.Linear(N, K).to(dev, torch.bfloat16)
w1, b1 = fc1.weight.detach(), fc1.bias.detach()
nsm = torch.cuda.get_device_properties(0).multi_processor_count
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), nsm, "SMs", flush=True)


def make(BM=128, BN=256, BK=64, STAGES=3, GROUP_M=8, CH=16, EPI_WARPS=4, EPI_REGS=168, grid=None, GELU=1):
    la, lb, lc = W.layouts(BM, BN, BK, True)
    out = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    ad = TensorDescriptor.from_tensor(x, [BM, BK], la)
    bd = TensorDescriptor.from_tensor(w1, [BN, BK], lb)
    cd = TensorDescriptor.from_tensor(out, [BM, BN], lc)
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    g = (min(grid or nsm, tiles),)

    def run():
        W.linear_gelu_ws[g](ad, bd, cd, b1, M, N, K, HAS_BIAS=True, B_KMAJOR=True, STAGES=STAGES,
                            GROUP_M=GROUP_M, CH=CH, EPI_WARPS=EPI_WARPS, EPI_REGS=EPI_REGS, GELU=GELU,
                            num_warps=8, maxnreg=168)
        return out
    return run


def eager_l1():
    return F.gelu(F.linear(x, w1, b1))


def time_it(fn, reps=40):
    return median_ms(fn, reps)


ref = eager_l1()
results = {}
variants = {"s3": {}, "s3_ch64": {"CH": 64}, "s3_nogelu": {"GELU": 0}, "s3_cheap": {"GELU": 2}, "epi_only_gelu": {"GELU": 3}}
runs = {}
for name, kw in variants.items():
    t0 = time.time()
    try:
        fn = make(**kw)
        got = fn(); torch.cuda.synchronize()
    except Exception as e:
        print(name, "FAILED", type(e).__name__, str(e)[:400], flush=True)
        continue
    if kw.get("GELU", 1) != 1:
        runs[name] = fn; print(name, "compiled", flush=True); continue
    d = (got.float() - ref.float()).abs()
    ndiff = (got != ref).sum().item()
    print(f"{name}: compile+first {time.time()-t0:.1f}s maxdiff {d.max().item():.3g} "
          f"differing {ndiff} of {ref.numel()} ({ndiff/ref.numel():.2e})", flush=True)
    runs[name] = fn

# error against a float64 reference on 64 rows, for eager and the fused kernel
rows = slice(0, 64)
r64 = F.gelu(F.linear(x[rows].double(), w1.double(), b1.double()))
def relerr(t):
    return ((t[rows].double() - r64).norm() / r64.norm()).item()
print("relerr vs fp64: eager", relerr(ref), {n: relerr(f()) for n, f in runs.items() if variants[n].get("GELU", 1) == 1}, flush=True)

# GEMM-only reference points
print("cuBLAS addmm alone", time_it(lambda: F.linear(x, w1, b1)), "ms", flush=True)

def mlp_eager():
    return fc2(F.gelu(fc1(x)))
fused_best = runs.get("s3_ch16")
def mlp_fused(fn):
    return lambda: F.linear(fn(), fc2.weight, fc2.bias)

cands = {"eager_l1": eager_l1, "cublas_addmm": lambda: F.linear(x, w1, b1), **{f"fused_{n}": f for n, f in runs.items()}}
mlps = {"mlp_eager": mlp_eager, **{f"mlp_{n}": mlp_fused(f) for n, f in runs.items() if variants[n].get("GELU", 1) == 1}}
for group in (cands, mlps):
    table = {k: [] for k in group}
    for r in range(6):
        names = list(group)
        names = names[r % len(names):] + names[:r % len(names)]
        for k in names:
            table[k].append(time_it(group[k]))
    base = statistics.median(table[list(group)[0]])
    for k, v in table.items():
        med = statistics.median(v)
        print(f"{k:18s} {med:.3f} ms  x{base/med:.3f}  rounds {[round(t, 3) for t in v]}", flush=True)
    results.update({k: v for k, v in table.items()})
json.dump(results, open(os.path.join(OUT, "gluon_probe.json"), "w"))
