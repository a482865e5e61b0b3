"""Cold and warm compile time of one model, each in a fresh process: kiln against
torch.compile.

For each backend, two new Python processes share a fresh, empty cache folder (kiln's,
Triton's and Inductor's caches all pointed into it): the first compiles cold, the second
finds everything cached. Each times the model's first call (capture, autograd, kernels,
and the call itself, synchronised) after its imports; kiln's processes also print
``kiln.compile_times()``.

    python -m benchmarks.compile_time [--model resnet18] [--batch 16] [--size 128]
                                      [--dtype bf16] [--device cuda] [--backends kiln,torch.compile]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, torch, torchvision
import kiln
backend, model, batch, size, dtype, device = sys.argv[1:7]
dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
torch.manual_seed(0)
m = getattr(torchvision.models, model)().to(device=device, dtype=dt).eval()
x = torch.randn(int(batch), 3, int(size), int(size), device=device, dtype=dt)
f = kiln.compile(m) if backend == "kiln" else torch.compile(m)
with torch.no_grad():
    m(x)                           # eager once: library set-up is not compile time
if device == "cuda":
    torch.cuda.synchronize()
t0 = time.perf_counter()
with torch.no_grad():
    y = f(x)
if device == "cuda":
    torch.cuda.synchronize()
print(f"first call {time.perf_counter() - t0:.2f} s")
with torch.no_grad():
    err = (y.float() - m(x).float()).abs().max().item()
print(f"max abs error against eager {err:.3g}")
if backend == "kiln":
    print(kiln.compile_times())
"""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batch", default="16")
    ap.add_argument("--size", default="128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backends", default="kiln,torch.compile")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as d:
            env = dict(os.environ, KILN_CACHE_DIR=os.path.join(d, "kiln"),
                       TRITON_CACHE_DIR=os.path.join(d, "triton"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                       PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
            for phase in ("cold", "warm"):
                r = subprocess.run([sys.executable, "-c", CHILD, backend, args.model, args.batch,
                                    args.size, args.dtype, args.device],
                                   capture_output=True, text=True, env=env)
                print(f"== {backend}, {phase} cache ==")
                print(r.stdout.strip() or r.stderr[-2000:])


if __name__ == "__main__":
    main()
