"""GPU kernel figures (Triton path): eager vs torch.compile vs kiln, CUDA-event medians.

Same workloads as cpu_kernels.py (8-op pointwise chain, row softmax, 4096×4096 fp32).
Needs a CUDA GPU:  python benchmarks/gpu_kernels.py
"""
import os, sys
import torch, torch.fx as fx
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kiln.kernels import compile_aten_graph
aten = torch.ops.aten
def sm(x): return (aten._softmax.default(x, -1, False),)
def chain8(x, y):
    a = aten.mul.Tensor(x, y); a = aten.add.Tensor(a, 1.5); a = aten.sigmoid.default(a)
    a = aten.mul.Tensor(a, x); a = aten.exp.default(a); a = aten.sub.Tensor(a, y)
    a = aten.relu.default(a); a = aten.div.Tensor(a, 3.0); return (a,)
def t(fn, args, n=50):
    for _ in range(5): fn(*args)
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        s.record(); fn(*args); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[n // 2]
x = torch.randn(4096, 4096, device="cuda"); y = torch.randn(4096, 4096, device="cuda")
for name, f, eager, args in [("softmax", sm, lambda x: torch.softmax(x, -1), [x]),
                             ("chain8", chain8, lambda x, y: torch.relu(torch.exp(torch.sigmoid(x*y+1.5)*x)-y)/3.0, [x, y])]:
    c = compile_aten_graph(fx.symbolic_trace(f), args)
    err = (c(*args)[0] - eager(*args)).abs().max().item()
    tc = torch.compile(eager)
    print(f"{name}: eager {t(eager, args):.3f} ms  torch.compile {t(tc, args):.3f} ms  kiln {t(c, args):.3f} ms  err {err:.1e}")
