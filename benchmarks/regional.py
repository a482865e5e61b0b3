"""Cold compile time of a GPT-2 against its depth: does a deep model compile in about
a shallow one's time (regional compilation, ``KILN_REGIONAL``)?

Each measurement is its own Python process with a fresh, empty cache folder (kiln's and
Inductor's): it builds a transformers GPT-2 (width 128, 4 heads, sequence 64, batch 2)
of N layers, times eager's first call (the process's first: library set-up included),
then compiles and times the compiled first call (forward under ``no_grad`` for
``infer``; forward and backward of the logits' sum for ``train``), checks it against
eager, and times steady calls (median). kiln's processes also split the compile by
stage, each stage's own time (``kiln.debug.timing.own``): capture (bytecode tracing),
autograd (aot trace + partition), lowering (+ scheduling), codegen, C++ compile, load
(the rest of the kernel stage: library load, runtime, graph cache, one-time probes).
The first call's CPU time (this process and the compilers it ran) is shown beside its
wall time: on a shared machine it varies less.

    python -m benchmarks.regional [--layers 2,6,12,24] [--modes infer,train]
                                  [--backends kiln,kiln:noregional,torch.compile] [--repeat 1]
                                  [--device cpu|cuda]

``kiln:noregional`` is kiln with ``KILN_REGIONAL=0``. With ``--repeat`` > 1, each cell is
the minimum (``--stat median``: the median) over that many processes, figure by figure
(the machine may be shared); the processes run in rounds, each
round every cell once.

    python -m benchmarks.regional --steps [--layers 4] [--modes infer,train]

times the compiled calls instead (the runtime cost of sharing kernels): in one process,
two compiles of the same model, with and without ``KILN_REGIONAL``, called in
alternating rounds; the median per call of each.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, resource, statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
backend, layers, mode, device = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=1000, n_positions=1024, n_embd=128, n_layer=layers, n_head=4,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)


class LM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.model = GPT2LMHeadModel(cfg)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


m = LM().to(device)
x = torch.randint(0, 1000, (2, 64), device=device)


def call(f):
    if mode == "train":
        y = f(x)
        y.sum().backward()
        y = y.detach()
    else:
        with torch.no_grad():
            y = f(x)
    if device == "cuda":
        torch.cuda.synchronize()
    return y


t0 = time.perf_counter()
ref = call(m)
eager_first = time.perf_counter() - t0
ref_grads = [p.grad.clone() for p in m.parameters()] if mode == "train" else []
m.zero_grad(set_to_none=True)
if backend.startswith("kiln"):
    import kiln
    from kiln.debug import timing
    compile_fn = kiln.compile
else:
    compile_fn = torch.compile


def cpu():
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


t0, c0 = time.perf_counter(), cpu()
f = compile_fn(m)
y = call(f)
first, first_cpu = time.perf_counter() - t0, cpu() - c0
err = (y - ref).abs().max().item()
for p, g in zip(m.parameters(), ref_grads):
    err = max(err, (p.grad - g).abs().max().item())
steps = []
for _ in range(15):
    m.zero_grad(set_to_none=True)
    t = time.perf_counter()
    call(f)
    steps.append(time.perf_counter() - t)
rec = {"backend": backend, "layers": layers, "mode": mode, "first_s": first, "cpu_s": first_cpu,
       "eager_first_s": eager_first, "max_err": err, "step_ms": 1e3 * statistics.median(steps[3:])}
if backend.startswith("kiln"):
    own = timing.own()
    groups = {"capture": ["capture (incl. backend)"],
              "autograd": [k for k in own if k.startswith("aot_")],
              "lowering": ["kernels.passes", "kernels.lowering", "kernels.scheduling"],
              "codegen": ["kernels.codegen"], "cxx": ["kernels.cxx"]}
    named = {k for ks in groups.values() for k in ks}
    rec["stages"] = {g: sum(own.get(k, 0.0) for k in ks) for g, ks in groups.items()}
    rec["stages"]["load"] = sum(v for k, v in own.items() if k not in named)
    rec["own"] = own
print("RESULT " + json.dumps(rec))
"""

STAGES = ("capture", "autograd", "lowering", "codegen", "cxx", "load")


def measure(backend: str, layers: int, mode: str, device: str = "cpu") -> dict:
    """One process, one fresh cache folder: the child's record (or an error)."""
    with tempfile.TemporaryDirectory(prefix="kiln-regional-") as d:
        env = dict(os.environ, KILN_CACHE_DIR=os.path.join(d, "kiln"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(d, "inductor"),
                   TRITON_CACHE_DIR=os.path.join(d, "triton"),
                   KILN_PERF_FALLBACK="0", TRANSFORMERS_VERBOSITY="error",
                   KILN_REGIONAL="0" if backend == "kiln:noregional" else "1")
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
        r = subprocess.run([sys.executable, "-c", CHILD, backend, str(layers), mode, device],
                           capture_output=True, text=True, env=env)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return {"backend": backend, "layers": layers, "mode": mode, "error": " | ".join(tail)}


def best(recs: list, stat=min) -> dict:
    """One record for a cell: ``stat`` (min or statistics.median) of each figure."""
    ok = [r for r in recs if "error" not in r]
    if not ok:
        return recs[0]
    out = dict(ok[0])
    for k in ("first_s", "step_ms", "cpu_s", "eager_first_s"):
        out[k] = stat([r[k] for r in ok])
    if "stages" in out:
        out["stages"] = {s: stat([r["stages"][s] for r in ok]) for s in STAGES}
    out["max_err"] = max(r["max_err"] for r in ok)
    return out


def table(rows: list) -> str:
    head = ("| mode | backend | layers | first call s | vs fewest | cpu s | vs fewest | "
            "eager first s | step ms | "
            + " | ".join(STAGES) + " | max err |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = {(r["mode"], r["backend"]): r for r in rows
            if "error" not in r and r["layers"] == min(x["layers"] for x in rows)}
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['mode']} | {r['backend']} | {r['layers']} | error: {r['error'][:120]} |")
            continue
        b = base.get((r["mode"], r["backend"])) or r
        st = r.get("stages")
        cells = [f"{st[s]:.2f}" for s in STAGES] if st else ["-"] * len(STAGES)
        lines.append(f"| {r['mode']} | {r['backend']} | {r['layers']} | {r['first_s']:.2f} | "
                     f"{r['first_s'] / b['first_s']:.2f}x | {r['cpu_s']:.2f} | "
                     f"{r['cpu_s'] / b['cpu_s']:.2f}x | {r['eager_first_s']:.3f} | {r['step_ms']:.1f} | "
                     + " | ".join(cells) + f" | {r['max_err']:.1e} |")
    return "\n".join(lines)


STEPS = r"""
import statistics, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import kiln
from kiln import config
layers, mode, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_error()
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=1000, n_positions=1024, n_embd=128, n_layer=layers, n_head=4,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
m = GPT2LMHeadModel(cfg)
x = torch.randint(0, 1000, (2, 64))


def call(f):
    if mode == "train":
        m.zero_grad(set_to_none=True)
        f(x).sum().backward()
    else:
        with torch.no_grad():
            f(x)


fns = {}
for on in (True, False):
    with config.patch(regional=on):
        fns[on] = kiln.compile(lambda i: m(input_ids=i).logits)
        for _ in range(3):
            call(fns[on])
times = {True: [], False: []}
for _ in range(rounds):
    for on in (True, False):
        t = time.perf_counter()
        for _ in range(5):
            call(fns[on])
        times[on].append((time.perf_counter() - t) / 5)
on, off = (1e3 * statistics.median(times[k]) for k in (True, False))
print(f"| {mode} | {layers} | {off:.2f} | {on:.2f} | {on / off:.3f} |")
"""


def steps(layers: list, modes: list, rounds: int = 20) -> str:
    lines = ["| mode | layers | KILN_REGIONAL=0 ms | KILN_REGIONAL=1 ms | ratio |",
             "|---|---|---|---|---|"]
    for mode in modes:
        for n in layers:
            with tempfile.TemporaryDirectory(prefix="kiln-regional-") as d:
                here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
                env = dict(os.environ, KILN_CACHE_DIR=d, KILN_PERF_FALLBACK="0",
                           PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
                r = subprocess.run([sys.executable, "-c", STEPS, str(n), mode, str(rounds)],
                                   capture_output=True, text=True, env=env)
            out = [l for l in r.stdout.splitlines() if l.startswith("|")]
            lines.append(out[0] if out else f"| {mode} | {n} | error: "
                         + " ".join((r.stderr or "").strip().splitlines()[-2:])[:200] + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="2,6,12,24")
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--backends", default="kiln,kiln:noregional,torch.compile")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--stat", choices=("min", "median"), default="min",
                    help="of the --repeat processes, each figure's minimum or median")
    ap.add_argument("--steps", action="store_true", help="time compiled calls, regional on/off")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where the model runs (cold compile: the first call of each process)")
    a = ap.parse_args(argv)
    if a.steps:
        layers = [4] if a.layers == ap.get_default("layers") else [int(v) for v in a.layers.split(",")]
        print(steps(layers, a.modes.split(",")))
        return 0
    # rounds outermost: each round measures every cell once, in the same order, so a
    # change of the machine's load falls on all cells alike
    cells = [(mode, backend, int(n)) for mode in a.modes.split(",")
             for backend in a.backends.split(",") for n in a.layers.split(",")]
    recs: dict = {c: [] for c in cells}
    for _ in range(a.repeat):
        for mode, backend, n in cells:
            rec = measure(backend, n, mode, a.device)
            print(json.dumps(rec), file=sys.stderr, flush=True)
            recs[mode, backend, n].append(rec)
    stat = statistics.median if a.stat == "median" else min
    print(table([best(recs[c], stat) for c in cells]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
