"""GELU-MLP probe: TunableOp-tuned cuBLAS, and chunked GELU overlapped on a side stream."""
import os, sys, json, statistics, time
import torch, torch.nn.functional as F

B, D, H = 8192, 4096, 16384
dt = torch.bfloat16
torch.manual_seed(0)
x = torch.randn(B, D, device="cuda", dtype=dt)
w1 = torch.randn(H, D, device="cuda", dtype=dt) * D ** -0.5
b1 = torch.randn(H, device="cuda", dtype=dt) * 0.1
w2 = torch.randn(D, H, device="cuda", dtype=dt) * H ** -0.5
b2 = torch.randn(D, device="cuda", dtype=dt) * 0.1
print("carveout api:", hasattr(torch._C, "_set_sm_carveout_experimental"), flush=True)

def eager():
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)

side = torch.cuda.Stream()
def chunked(k, overlap=True):
    def run():
        cur = torch.cuda.current_stream()
        xs = x.chunk(k)
        out = torch.empty(B, D, device="cuda", dtype=dt)
        outs = out.chunk(k)
        hs = [None] * k; gs = [None] * k; evs = [None] * k; dn = [None] * k
        def mm1(i):
            hs[i] = F.linear(xs[i], w1, b1)
            e = torch.cuda.Event(); e.record(cur); evs[i] = e
        def gelu(i):
            s = side if overlap else cur
            s.wait_event(evs[i])
            with torch.cuda.stream(s):
                gs[i] = F.gelu(hs[i]); hs[i].record_stream(s); gs[i].record_stream(s)
                e = torch.cuda.Event(); e.record(s); dn[i] = e
        def mm2(i):
            cur.wait_event(dn[i])
            torch.addmm(b2, gs[i], w2.t(), out=outs[i])
        mm1(0); gelu(0)
        for i in range(1, k):
            mm1(i); gelu(i); mm2(i - 1)
        mm2(k - 1)
        return out
    return run

def time_it(fn, n=30):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b))
    return statistics.median(ts)

ref = eager()
cands = {"eager": eager}
for k in (2, 4, 8):
    cands[f"chunk{k}_serial"] = chunked(k, False)
    cands[f"chunk{k}_overlap"] = chunked(k, True)
for name, f in cands.items():
    err = (f().float() - ref.float()).abs().max().item()
    print(name, "maxdiff", err, flush=True)

res = {n: [] for n in cands}
names = list(cands)
for r in range(8):
    order = names if r % 2 == 0 else names[::-1]
    for n in order:
        res[n].append(time_it(cands[n]))
for n in names:
    print(f"{n:20s} {statistics.median(res[n]):.3f} ms  rounds {[round(v,3) for v in res[n]]}", flush=True)

if hasattr(torch._C, "_set_sm_carveout_experimental"):
    for co in (4, 8, 16):
        torch._C._set_sm_carveout_experimental(co)
        f = chunked(4, True)
        ts = [time_it(f) for _ in range(4)]
        torch._C._set_sm_carveout_experimental(0)
        te = [time_it(eager) for _ in range(4)]
        print(f"carveout {co}: chunk4_overlap {statistics.median(ts):.3f} eager {statistics.median(te):.3f}", flush=True)
    torch._C._set_sm_carveout_experimental(None) if False else None

# TunableOp
import torch.cuda.tunable as tn
tn.enable(True); tn.tuning_enable(True); tn.set_filename(os.environ.get("OUT", "/tmp") + "/tunableop.csv")
t0 = time.time(); y = eager(); torch.cuda.synchronize(); print("tuning took", time.time() - t0, flush=True)
tn.tuning_enable(False)
print("results", tn.get_results(), flush=True)
print("tuned maxdiff", (y.float() - ref.float()).abs().max().item())
tu, un = [], []
for r in range(6):
    tn.enable(True); tu.append(time_it(eager))
    tn.enable(False); un.append(time_it(eager))
print(f"tuned {statistics.median(tu):.3f} untuned {statistics.median(un):.3f}", tu, un, flush=True)
