"""A stream of input sizes: how many compiles, the first pass, the steady state.

    python -m benchmarks.dynamic_shapes --workload llama [--device cuda] \\
        [--backends eager,torch.compile,kiln] [--json FILE]
    python -m benchmarks.dynamic_shapes --workload resnet18 [--device cuda] \\
        [--order shuffled|ascending]

Workloads (issue 23's rows):
- ``llama``: serving a LLaMA-style model (transformers ``LlamaForCausalLM``, 4 layers,
  512 wide, 8 heads; bf16 on a GPU) with batch 4 and 24 random sequence lengths in
  33..512 (seeded), inference under ``torch.no_grad()``.
- ``resnet18``: torchvision resnet18 inference (eval, 224 px; bf16 on a GPU) over batch
  sizes 1..64, shuffled (``--order shuffled``, the default) or ascending (a sweep: batch 1
  compiled static, batch 2 makes the dim dynamic — 2 compiles).
On the CPU both shrink (``--small`` is implied) so the run stays short.

Per backend, in one process: ``compiles`` (graphs captured: kiln's tracer handing a
graph to its backend, torch.compile's unique graphs), the first pass over all sizes
(compiles included; kiln's row also says how long its background plans and compiles
ran on after it, ``first_pass_background_s``, waited for before the next pass), the steady state (median of ``--passes`` later passes, after ``--settle`` untimed ones, over the
same sizes, in the same order; kiln's background compiles waited for before them, the
wait reported as ``background_wait_s``) and the largest error of the last pass's outputs against
eager's (relative to eager's largest value; a slice of each output so it fits in memory).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.dynamic_shapes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["llama", "resnet18"], default="llama")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="eager,torch.compile,kiln")
    p.add_argument("--passes", type=int, default=3, help="steady-state passes after the first")
    p.add_argument("--settle", type=int, default=2,
                   help="untimed passes between the first and the steady ones, each the same "
                        "loop as a timed one (its outputs held until the next pass ends): work a "
                        "backend leaves to a size's second or third call (kiln: a CUDA-graph "
                        "recording, sizes its perf trial ran eagerly, recording again around "
                        "outputs the caller holds) is not steady state")
    p.add_argument("--order", choices=["shuffled", "ascending"], default="shuffled",
                   help="the order of the sizes in a pass")
    p.add_argument("--batches", type=int, default=0,
                   help="resnet18: batch sizes 1..N (default 64, 8 with --small)")
    p.add_argument("--small", action="store_true", help="tiny sizes (the default on the CPU)")
    p.add_argument("--json", default="")
    return p.parse_args(argv)


def llama(device, small, order="shuffled", batches=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if small:
        cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
        lengths, batch, dtype = random.Random(0).sample(range(5, 65), 10), 2, torch.float32
    else:
        cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                          num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)
        rng = random.Random(0)
        lengths, batch, dtype = [rng.randint(33, 512) for _ in range(24)], 4, torch.bfloat16
    if order == "ascending":
        lengths = sorted(lengths)
    cfg.use_cache = False
    model = LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randint(0, cfg.vocab_size, (batch, n), generator=g).to(device) for n in lengths]

    def run(fn, x):
        return fn(x).logits[:, -1, :]
    return model, inputs, run, [f"len {n}" for n in lengths]


def resnet18(device, small, order="shuffled", batches=0):
    import torchvision

    torch.manual_seed(0)
    dtype = torch.float32 if small or device == "cpu" else torch.bfloat16
    model = torchvision.models.resnet18().to(device=device, dtype=dtype).eval()
    sizes = list(range(1, (batches or (8 if small else 64)) + 1))
    if order == "shuffled":
        random.Random(0).shuffle(sizes)
    px = 32 if small else 224
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, 3, px, px, generator=g).to(device=device, dtype=dtype) for b in sizes]

    def run(fn, x):
        return fn(x)
    return model, inputs, run, [f"batch {b}" for b in sizes]


class KilnGraphs:
    """Counts the graphs kiln's tracer captures (not the per-size compiles a backend
    then makes of one captured graph), and keeps the per-size variant tables
    (``kiln/shapes/variants.py``) made meanwhile: how many sizes were compiled and how
    many calls ran op by op instead."""

    def __init__(self):
        self.n = 0
        self.tables = []

    def __enter__(self):
        from kiln.capture import tracer
        from kiln.shapes import variants
        self.mod, self.orig = tracer, tracer._compile_graph
        self.vmod, self.vinit = variants.SizeVariants, variants.SizeVariants.__init__

        def counted(*a, **k):
            out = self.orig(*a, **k)
            self.n += bool(out)
            return out

        def kept(table):
            self.vinit(table)
            self.tables.append(table)
        tracer._compile_graph = counted
        variants.SizeVariants.__init__ = kept
        return self

    def __exit__(self, *exc):
        self.mod._compile_graph = self.orig
        self.vmod.__init__ = self.vinit

    def sizes(self) -> dict:
        return {"size_compiles": sum(t.compiles for t in self.tables),
                "uncompiled_calls": sum(t.uncompiled_calls for t in self.tables)}


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def one_backend(name, a, make):
    model, inputs, run, labels = make(a.device, a.small or a.device == "cpu", a.order, a.batches)
    counter = None
    if name == "eager":
        fn = model
    elif name == "torch.compile":
        import importlib
        importlib.import_module("torch._dynamo").reset()
        fn = torch.compile(model)
    elif name == "kiln":
        import kiln
        fn = kiln.compile(model)
        counter = KilnGraphs().__enter__()
    else:
        raise ValueError(name)
    before = _tc_graphs()
    extra = {}
    outs = []
    with torch.no_grad():
        sync(a.device)
        t0 = time.perf_counter()
        for x in inputs:
            run(fn, x)
        sync(a.device)
        first = time.perf_counter() - t0
        if name == "kiln":
            # what kiln left to threads in the first pass (sizes planned and compiled
            # while their calls ran op by op): waited for here, so that the first pass
            # and the time until every size of it is compiled are both reported
            t1 = time.perf_counter()
            kiln_waited()
            extra["first_pass_background_s"] = round(time.perf_counter() - t1, 3)
        settle = []
        last = None
        for p in range(a.settle):
            t0 = time.perf_counter()
            last = [run(fn, x) for x in inputs]     # held as the timed passes hold them
            sync(a.device)
            settle.append(time.perf_counter() - t0)
        if name == "kiln":
            # kernels kiln compiles in the background (a size's large matmuls fused with
            # their epilogues; until ready, calls run the library product and a kernel)
            # are not steady state either: waited for, as train_step does, and reported
            t0 = time.perf_counter()
            extra["background_wait_s"] = round(time.perf_counter() - t0, 3) if \
                kiln_waited() else 0.0
        passes = []
        for p in range(a.passes):
            t0 = time.perf_counter()
            last = [run(fn, x) for x in inputs]
            sync(a.device)
            passes.append(time.perf_counter() - t0)
        outs = [o.float().cpu() for o in last]
    if counter is not None:
        counter.__exit__()
        compiles = counter.n
        extra.update(counter.sizes())
    elif name == "torch.compile":
        compiles = _tc_graphs() - before
    else:
        compiles = 0
    return {"backend": name, "compiles": compiles, "first_pass_s": first,
            "steady_pass_ms": 1e3 * statistics.median(passes), "calls": len(inputs),
            "settle_pass_ms": [1e3 * t for t in settle], "steady_passes_ms": [1e3 * t for t in passes],
            **extra, "labels": labels}, outs


def kiln_waited() -> bool:
    """Wait for kiln's background compiles; True if any were under way."""
    import kiln
    return bool(kiln.wait_for_compiles(600))


def _tc_graphs() -> int:
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def main(argv=None) -> int:
    a = parse(argv)
    make = {"llama": llama, "resnet18": resnet18}[a.workload]
    rows, ref = [], None
    for name in [b.strip() for b in a.backends.split(",") if b.strip()]:
        try:
            row, outs = one_backend(name, a, make)
        except Exception as e:  # noqa: BLE001  (one backend's failure is a row)
            rows.append({"backend": name, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        if name == "eager":
            ref = outs
        elif ref is not None:
            scale = max(float(r.abs().max()) for r in ref) or 1.0
            row["max_err"] = max(float((o - r).abs().max()) for o, r in zip(outs, ref)) / scale
        rows.append(row)
        print(f"# {name}: {json.dumps({k: v for k, v in row.items() if k != 'labels'})}", flush=True)
    eager = next((r for r in rows if r["backend"] == "eager" and "error" not in r), None)
    tc = next((r for r in rows if r["backend"] == "torch.compile" and "error" not in r), None)
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(f"{a.workload} on {dev}, torch {torch.__version__}, {rows[0].get('calls', '?')} sizes per pass "
          f"({a.order})")
    print(f"{'backend':<14} {'compiles':>8} {'first pass s':>13} {'+ background s':>15} {'steady ms':>10} {'vs eager':>9} {'vs tc':>7} {'max err':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<14} error: {r['error']}")
            continue
        ve = eager["steady_pass_ms"] / r["steady_pass_ms"] if eager else float("nan")
        vt = tc["steady_pass_ms"] / r["steady_pass_ms"] if tc else float("nan")
        print(f"{r['backend']:<14} {r['compiles']:>8} {r['first_pass_s']:>13.2f} "
              f"{r.get('first_pass_background_s', 0.0):>15.2f} {r['steady_pass_ms']:>10.2f} "
              f"{ve:>8.2f}x {vt:>6.2f}x {r.get('max_err', 0.0):>9.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": a.workload, "order": a.order, "device": dev, "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
