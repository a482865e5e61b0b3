"""What each new batch size of a dynamic graph costs the host, and how many kernel texts
a stream of sizes makes — without a GPU (plans only; nothing is compiled or run).

    python -m benchmarks.size_variants [--px 224] [--batches 64] [--target triton|cpp]
        [--dtype float32] [--json FILE]

torchvision's resnet18 (inference) is captured with kiln at batch 2 and 3 (the batch
dim then symbolic) under a backend that stops after the autograd stage, so the one
symbolic inference graph is at hand (``autograd/specialize.PerSizeGraph``). For each
batch size 1..N the script then does what a new size costs the kiln backend before any
kernel is built: ``specialise`` (the graph at these sizes) and ``kernels.compile.plan``
(lowering, scheduling, code generation; the graph cache off), and counts

- modules: distinct generated sources (C++ library / Triton module texts: a new one is a
  compiler run or a module load with its kernels' compiles);
- kernel texts: distinct Triton kernels with their size arguments numbered per kernel
  and comments dropped (what Triton's own cache tells apart), or C++ libraries.

Run on a CPU; the Triton target needs no GPU here (the source is generated, not built).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

_MARK = re.compile("\x01(-?[0-9]+)\x02")


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.size_variants", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--px", type=int, default=224)
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--target", choices=["triton", "cpp"], default="triton")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default="")
    return p.parse_args(argv)


def symbolic_graph(px, dtype):
    """(the PerSizeGraph of resnet18's symbolic inference graph, the arguments of its
    batch-3 call)."""
    import torchvision

    import kiln
    from kiln.autograd import specialize
    from kiln.autograd.runtime import aot_compile

    made, calls = [], []
    init, call = specialize.PerSizeGraph.__init__, specialize.PerSizeGraph.__call__

    def kept(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    def seen(self, *args):
        calls.append(args)
        return call(self, *args)

    def backend(gm, example_inputs):       # the aten graphs run as they are
        return aot_compile(gm, example_inputs, fw_compiler=lambda g, e: g,
                           bw_compiler=lambda g, e: g, inference_compiler=lambda g, e: g)
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().to(dtype)

    def run(x):
        return model(x)
    specialize.PerSizeGraph.__init__, specialize.PerSizeGraph.__call__ = kept, seen
    try:
        c = kiln.compile(run, backend=backend)
        with torch.no_grad():
            for b in (2, 3):
                c(torch.randn(b, 3, px, px, dtype=dtype))
    finally:
        specialize.PerSizeGraph.__init__, specialize.PerSizeGraph.__call__ = init, call
    if len(made) != 1:
        raise RuntimeError(f"expected one symbolic inference graph, got {len(made)}")
    return made[0], calls[-1]


class KernelTexts:
    """Collects each generated Triton kernel's text with its size arguments numbered
    per kernel (by first appearance, each with the divisibility and width class its
    read encodes) and comments dropped."""

    def __init__(self):
        self.current = []

    def __enter__(self):
        from kiln.kernels.codegen.triton import source
        self.mod, self.orig = source, source._take_sizes

        def take(part, vals):
            if "@triton" in part:
                self.current.append(self.local(part))
            return self.orig(part, vals)
        source._take_sizes = take
        return self

    def __exit__(self, *exc):
        self.mod._take_sizes = self.orig

    @staticmethod
    def local(text: str) -> str:
        names = {}

        def name(m):
            v = int(m.group(1))
            i = names.setdefault(v, len(names))
            return f"ks{i}[{'d' if v % 16 == 0 else ''}{'' if -2**31 <= v < 2**31 else 'w'}]"
        text = _MARK.sub(name, text)
        return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def main(argv=None) -> int:
    a = parse(argv)
    dtype = getattr(torch, a.dtype)
    from kiln import config
    from kiln.autograd import specialize
    from kiln.debug import timing
    from kiln.kernels import compile as kcompile

    torch.set_num_threads(1)
    psg, base = symbolic_graph(a.px, dtype)
    image = next(i for i, x in enumerate(base) if isinstance(x, torch.Tensor)
                 and tuple(x.shape) == (3, 3, a.px, a.px))
    modules, texts, rows = set(), set(), []
    stages = ["kernels.lowering", "kernels.scheduling", "kernels.codegen"]
    with config.patch(graph_cache=False), KernelTexts() as kt:
        for b in range(1, a.batches + 1):
            args = list(base)
            args[image] = torch.empty(b, 3, a.px, a.px, dtype=dtype)
            t0 = time.perf_counter()
            values = specialize.solve(specialize._equations(psg.placeholders, args), psg.symbols)
            gm, keep, _ = specialize.specialise(psg.gm, values, args)
            t1 = time.perf_counter()
            before, kt.current = timing.totals(), []
            p = kcompile.plan(gm, [args[i] for i in keep], a.target)
            t2 = time.perf_counter()
            after = timing.totals()
            new_module = p.source not in modules
            modules.add(p.source)
            new_texts = len(set(kt.current) - texts)
            texts |= set(kt.current)
            row = {"batch": b, "specialise_ms": 1e3 * (t1 - t0), "plan_ms": 1e3 * (t2 - t1),
                   **{k.split(".")[1] + "_ms": 1e3 * (after.get(k, 0) - before.get(k, 0))
                      for k in stages},
                   "new_module": new_module, "new_kernel_texts": new_texts}
            rows.append(row)
            print(f"batch {b:3d}: specialise {row['specialise_ms']:6.1f} ms, plan {row['plan_ms']:6.1f} ms "
                  f"(lowering {row['lowering_ms']:.1f}, scheduling {row['scheduling_ms']:.1f}, "
                  f"codegen {row['codegen_ms']:.1f}){'  new module' if new_module else ''}"
                  f"{f', {new_texts} new kernel texts' if new_texts else ''}", flush=True)
    med = {k: statistics.median(r[k] for r in rows) for k in ("specialise_ms", "plan_ms")}
    print(f"resnet18 {a.px}px {a.dtype}, target {a.target}, batch 1..{a.batches}: "
          f"median specialise {med['specialise_ms']:.1f} ms + plan {med['plan_ms']:.1f} ms per size; "
          f"{len(modules)} distinct modules"
          + (f", {len(texts)} distinct kernel texts" if a.target == "triton" else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"px": a.px, "dtype": a.dtype, "target": a.target, "rows": rows,
                       "modules": len(modules), "kernel_texts": len(texts)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
