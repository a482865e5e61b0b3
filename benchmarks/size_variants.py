"""What each new batch size of a dynamic graph costs the host, and how many kernel texts
a stream of sizes makes — without a GPU (plans only; nothing is compiled or run).

    python -m benchmarks.size_variants [--workload resnet18|llama] [--px 224]
        [--batches 64] [--target triton|cpp] [--dtype float32] [--json FILE]

Workloads (the ones ``benchmarks/dynamic_shapes.py`` serves):
- ``resnet18``: torchvision's resnet18 (inference), captured at batch 2 and 3 (the batch
  dim then symbolic), planned at batch sizes 1..N (``--batches``).
- ``llama``: transformers' ``LlamaForCausalLM`` (4 layers, hidden 512, intermediate 1408,
  8 heads, vocab 32000), batch 4, ``use_cache=False``, under ``torch.no_grad()``,
  captured at sequence lengths 40 and 48 (the length then symbolic), planned at
  ``--lengths`` (default 24) lengths in 33..512 (seeded, as ``dynamic_shapes``).

Each model is captured with kiln under a backend that stops after the autograd stage,
so the one symbolic inference graph is at hand (``autograd/specialize.PerSizeGraph``).
For each size the script then does what a new size costs the kiln backend before any
kernel is built: ``specialise`` (the graph at these sizes) and ``kernels.compile.plan``
(lowering, scheduling, code generation; the graph cache off unless ``--graph-cache``;
the garbage collector paused, as the backend pauses it while it builds a size), and counts

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
    p.add_argument("--workload", choices=["resnet18", "llama"], default="resnet18")
    p.add_argument("--px", type=int, default=224)
    p.add_argument("--lengths", type=int, default=24, help="llama: how many sequence lengths")
    p.add_argument("--batches", type=int, default=64)
    p.add_argument("--target", choices=["triton", "cpp"], default="triton")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default="")
    p.add_argument("--graph-cache", action="store_true",
                   help="plan with the graph cache on (kiln's default; a fresh cache directory): "
                        "each new size then also pays its key and storing its plan")
    p.add_argument("--sources", default="",
                   help="write each size's generated source to this JSON file (size -> text), "
                        "to compare two trees' output")
    return p.parse_args(argv)


def resnet18(a, dtype):
    """(the function captured, its inputs at two batch sizes, the sizes to plan)."""
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval().to(dtype)

    def run(x):
        return model(x)
    return run, [torch.randn(b, 3, a.px, a.px, dtype=dtype) for b in (2, 3)], \
        list(range(1, a.batches + 1))


def llama(a, dtype):
    """(the function captured, its inputs at two sequence lengths, the lengths to plan)."""
    import random

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=1024)
    cfg.use_cache = False
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    rng = random.Random(0)
    lengths = [rng.randint(33, 512) for _ in range(a.lengths)]

    def run(x):
        return model(x).logits[:, -1, :]
    return run, [torch.randint(0, cfg.vocab_size, (4, n)) for n in (40, 48)], lengths


WORKLOADS = {"resnet18": resnet18, "llama": llama}


def symbolic_graph(run, inputs):
    """(the PerSizeGraph of ``run``'s one symbolic inference graph, the arguments of its
    last call)."""
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
    specialize.PerSizeGraph.__init__, specialize.PerSizeGraph.__call__ = kept, seen
    try:
        c = kiln.compile(run, backend=backend)
        with torch.no_grad():
            for x in inputs:
                c(x)
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

        def take(part, *rest):
            if "@triton" in part:
                self.current.append(self.local(part))
            return self.orig(part, *rest)
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


def at_size(psg, base, n):
    """``base`` (a call's arguments) with the symbolic ones at the graph's one size
    symbol equal to ``n`` (new tensors of the same dtype; their contents do not matter
    to a plan)."""
    import sympy

    from kiln.autograd.specialize import _concrete

    (sym,) = psg.symbols
    values = {sym: sympy.Integer(n)}
    args = list(base)
    for i in psg.dynamic:
        v = psg.placeholders[i].meta["val"]
        if isinstance(v, torch.Tensor):
            args[i] = torch.empty_strided([_concrete(s, values) for s in v.shape],
                                          [_concrete(s, values) for s in v.stride()],
                                          dtype=base[i].dtype)
        else:
            args[i] = _concrete(v, values)
    return args


def main(argv=None) -> int:
    a = parse(argv)
    dtype = getattr(torch, a.dtype)
    from kiln import config, gc_pause
    from kiln.autograd import specialize
    from kiln.debug import timing
    from kiln.kernels import compile as kcompile

    torch.set_num_threads(1)
    run, inputs, sizes = WORKLOADS[a.workload](a, dtype)
    psg, base = symbolic_graph(run, inputs)
    modules, texts, rows, sources = set(), set(), [], {}
    stages = ["kernels.lowering", "kernels.scheduling", "kernels.codegen"]
    import tempfile
    cache = tempfile.TemporaryDirectory(prefix="kiln-size-variants-")
    with config.patch(graph_cache=a.graph_cache, cache_dir=cache.name), KernelTexts() as kt:
        for b in sizes:
            args = at_size(psg, base, b)
            t0 = time.perf_counter()
            values = specialize.solve(specialize._equations(psg.placeholders, args), psg.symbols)
            gm, keep, _ = specialize.specialise(psg.gm, values, args)
            t1 = time.perf_counter()
            before, kt.current = timing.totals(), []
            with gc_pause.paused():     # as the backend plans (``CompiledGraph._variant``)
                p = kcompile.plan(gm, [args[i] for i in keep], a.target)
            t2 = time.perf_counter()
            after = timing.totals()
            sources[b] = p.source
            new_module = p.source not in modules
            modules.add(p.source)
            new_texts = len(set(kt.current) - texts)
            texts |= set(kt.current)
            row = {"size": b, "specialise_ms": 1e3 * (t1 - t0), "plan_ms": 1e3 * (t2 - t1),
                   **{k.split(".")[1] + "_ms": 1e3 * (after.get(k, 0) - before.get(k, 0))
                      for k in stages},
                   "new_module": new_module, "new_kernel_texts": new_texts}
            rows.append(row)
            print(f"size {b:3d}: specialise {row['specialise_ms']:6.1f} ms, plan {row['plan_ms']:6.1f} ms "
                  f"(lowering {row['lowering_ms']:.1f}, scheduling {row['scheduling_ms']:.1f}, "
                  f"codegen {row['codegen_ms']:.1f}){'  new module' if new_module else ''}"
                  f"{f', {new_texts} new kernel texts' if new_texts else ''}", flush=True)
    med = {k: statistics.median(r[k] for r in rows)
           for k in ("specialise_ms", "plan_ms", "lowering_ms", "scheduling_ms", "codegen_ms")}
    what = f"resnet18 {a.px}px, batch 1..{a.batches}" if a.workload == "resnet18" else \
        f"llama batch 4, {len(sizes)} lengths in 33..512"
    print(f"{what}, {a.dtype}, target {a.target}: "
          f"median specialise {med['specialise_ms']:.1f} ms + plan {med['plan_ms']:.1f} ms per size "
          f"(lowering {med['lowering_ms']:.1f}, scheduling {med['scheduling_ms']:.1f}, "
          f"codegen {med['codegen_ms']:.1f}); "
          f"{len(modules)} distinct modules"
          + (f", {len(texts)} distinct kernel texts" if a.target == "triton" else ""))
    if a.sources:
        with open(a.sources, "w") as f:
            json.dump(sources, f)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"workload": a.workload, "px": a.px, "dtype": a.dtype, "target": a.target, "rows": rows,
                       "modules": len(modules), "kernel_texts": len(texts)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
