"""Cold and warm compile time of each workload, each in a fresh process: kiln against
torch.compile.

For each workload and backend, two new Python processes share a fresh, empty cache
folder (kiln's, Triton's and Inductor's caches all pointed into it): the first compiles
cold, the second finds everything cached. Each times the first call (capture, autograd,
kernels, and the call itself, synchronised) after its imports and one eager call (library
set-up is not compile time; that call, eager's own first call in a fresh process, is
printed beside them); kiln's processes also print ``kiln.compile_times()``.
The timer starts before the ``compile`` call, so the imports each compiler makes for
itself count (torch.compile imports its stack there, kiln at its first call).

Every module either compiler imports is byte-compiled first, by unmeasured runs of each
backend (first and last workload) with ``PYTHONPYCACHEPREFIX`` pointed at a shared folder, as an installed
package would be (the GPU machine's site-packages has no bytecode, which would add
seconds of source compiling to whichever process imports a module first).

    python -m benchmarks.compile_time [--workloads sin_cos,softmax,layernorm,gelu_mlp,resnet18/infer]
                                      [--device cuda] [--backends kiln,torch.compile]

``--workloads`` takes substrings of the harness's workload keys (``python -m benchmarks
--list``); the default is the issue's five.
"""
from __future__ import annotations

import argparse
import compileall
import os
import re
import subprocess
import sys
import tempfile

CHILD = r"""
import sys, time, torch
import kiln                         # 0.05 s: everything else it needs is imported lazily
from benchmarks.workloads import find
backend, key, device = sys.argv[1:4]
torch.manual_seed(0)
w = find(key, device, quick=False)
inst = w.build(device)
args = inst.inputs[0]
train = w.mode == "train"


def call(fn):
    if train:
        out = fn(*args)
        out.backward()
        return out.detach()
    with torch.no_grad():
        return fn(*args)


if device == "cuda":
    torch.cuda.synchronize()
te = time.perf_counter()
ref = call(inst.fn)                 # eager once: library set-up is not compile time
if device == "cuda":
    torch.cuda.synchronize()
print(f"eager first call {time.perf_counter() - te:.3f} s")
t0 = time.perf_counter()
f = kiln.compile(inst.fn) if backend == "kiln" else torch.compile(inst.fn)
t1 = time.perf_counter()
y = call(f)
if device == "cuda":
    torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"first call {t2 - t0:.2f} s (compile() {t1 - t0:.2f} s, the call {t2 - t1:.2f} s)")
ys, rs = (y, ref) if isinstance(y, (tuple, list)) else ((y,), (ref,))
err = max((a.float() - b.float()).abs().max().item() for a, b in zip(ys, rs))
print(f"max abs error against eager {err:.3g}")
if backend == "kiln":
    print(kiln.compile_times())
"""
DEFAULT = "sin_cos,softmax,layernorm,gelu_mlp,resnet18/infer"


def _keys(patterns: str, device: str) -> list:
    from benchmarks.workloads import select
    return [w.key for w in select(device, "all", False, only=patterns.split(","))]


def eager_first_call(text: str) -> float | None:
    m = re.search(r"eager first call ([0-9.]+) s", text)
    return float(m.group(1)) if m else None


def first_call(text: str) -> float | None:
    m = re.search(r"^first call ([0-9.]+) s", text, re.MULTILINE)
    return float(m.group(1)) if m else None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", default=DEFAULT)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backends", default="kiln,torch.compile")
    args = ap.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    compileall.compile_dir(os.path.join(root, "kiln"), quiet=1)
    keys = _keys(args.workloads, args.device)
    pycache = tempfile.mkdtemp(prefix="kiln-compile-time-pycache-")

    def run(backend, key, d):
        env = dict(os.environ, KILN_CACHE_DIR=os.path.join(d, "kiln"),
                   TRITON_CACHE_DIR=os.path.join(d, "triton"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                   PYTHONPYCACHEPREFIX=pycache,
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return subprocess.run([sys.executable, "-c", CHILD, backend, key, args.device],
                              capture_output=True, text=True, env=env, cwd=root)

    for backend in args.backends.split(","):      # byte-compile what each imports
        for key in dict.fromkeys([keys[0], keys[-1]]):
            with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as d:
                run(backend, key, d)
    table = {}
    for key in keys:
        for backend in args.backends.split(","):
            with tempfile.TemporaryDirectory(prefix="kiln-compile-time-") as d:
                for phase in ("cold", "warm"):
                    r = run(backend, key, d)
                    print(f"== {key}: {backend}, {phase} cache ==")
                    print(r.stdout.strip() or r.stderr[-2000:], flush=True)
                    table[key, backend, phase] = first_call(r.stdout)
                    if phase == "cold":
                        table.setdefault((key, "eager", "first"), eager_first_call(r.stdout))
    backends = args.backends.split(",")
    print("\n| workload | eager's first call | " + " | ".join(f"{b} cold | {b} warm" for b in backends)
          + (" | cold ratio |" if len(backends) == 2 else " |"))
    print("|---" * (2 + 2 * len(backends) + (len(backends) == 2)) + "|")
    for key in dict.fromkeys(k for k, b, _ in table if b != "eager"):
        cells = [table.get((key, b, ph)) for b in backends for ph in ("cold", "warm")]
        eager = table.get((key, "eager", "first"))
        row = [f"{eager:.3f} s" if eager is not None else "-"]
        row += [f"{c:.2f} s" if c is not None else "failed" for c in cells]
        if len(backends) == 2:
            a, b = cells[0], cells[2]
            row.append(f"{a / b:.2f}×" if a and b else "-")
        print(f"| {key} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
