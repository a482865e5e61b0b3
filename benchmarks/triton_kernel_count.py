"""How many distinct Triton kernels (each one binary to compile on a GPU) kiln emits, and
how many launches run them, for

* ``adamw``: AdamW's foreach step over GPT-2-small's 148 parameter shapes (the
  optimizer graph of ``benchmarks/train_step.py``'s whole step), and
* ``gpt2``: a small GPT-2 (transformers, ``--layers`` blocks of GPT-2-small's width)
  forward and backward.

Each graph is captured by kiln (``backend="kiln"``, the graphs run by PyTorch) and
planned for Triton (``kernels.compile.plan``: source generated, nothing compiled), so
it runs on a CPU. Kernels that differ only in their sizes are one kernel
(``codegen/triton/source.py``: each kernel numbers its size arguments itself).

    TRITON_INTERPRET=1 python -m benchmarks.triton_kernel_count [--layers 2]
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch


def captured(fn, *args, calls=2) -> list:
    """The aten graphs (with their example inputs) kiln's kernel compiler is handed
    for ``calls`` calls of ``fn(*args)``."""
    import kiln
    import kiln.kernels.backend as kernel_backend
    from kiln.kernels.runtime.perf_fallback import EagerVariant
    graphs = []

    def keep(gm, example_inputs, *a, **kw):
        graphs.append((gm, list(example_inputs)))
        return EagerVariant(gm)
    inner, kernel_backend.compile_aten_graph = kernel_backend.compile_aten_graph, keep
    try:
        compiled = kiln.compile(fn, backend="kiln")
        for _ in range(calls):
            compiled(*args)
    finally:
        kernel_backend.compile_aten_graph = inner
    return graphs


def counts(gm, example) -> tuple:
    """(distinct Triton kernels, kernel launches) of ``gm`` planned for Triton."""
    from kiln.kernels import compile as kc
    p = kc.plan(gm, example, "triton")
    return len(p.kinfo or ()), len(p.size_args.grids) if p.size_args else 0


def gpt2_small_parameters() -> list:
    """GPT-2-small's 148 parameters (zeros, gradients of ones)."""
    d, ff, layers = 768, 3072, 12
    shapes = [(50257, d), (1024, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,),
                   (d, ff), (ff,), (ff, d), (d,)]
    shapes += [(d,), (d,)]
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    for p in params:
        p.grad = torch.ones_like(p)
    return params


def adamw(as_on_gpu: bool) -> list:
    """AdamW's later-step graph. ``as_on_gpu``: traced as for CUDA parameters (eager's
    default ``capturable=False``: the step counters and bias corrections on the CPU,
    two kernels a parameter) and planned on meta stand-ins for the device tensors, as
    ``tests/kernels/host_prologue_cases.optimizer_graph`` does; else as on the CPU."""
    import kiln.capture.optimizers as capture_optimizers
    params = gpt2_small_parameters()
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, foreach=True)

    def step(opt):
        opt.step()
    see = capture_optimizers._see_capturable
    if as_on_gpu:
        capture_optimizers._see_capturable = lambda tx, opt: []
    try:
        graphs = [(gm, ex) for gm, ex in captured(step, opt)
                  if any("_foreach_" in str(n.target) for n in gm.graph.nodes)]
    finally:
        capture_optimizers._see_capturable = see
    if not as_on_gpu:
        return [counts(*graphs[-1])]
    # the first step's graph (its counters CPU constants: the later one's, CPU inputs
    # stacked by ``cat``, cannot be lowered on the meta stand-in)
    gm, example = graphs[0]
    used = [bool(n.users) for n in gm.graph.nodes if n.op == "placeholder"]
    example = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
               if t.dim() or not u else torch.zeros((), dtype=t.dtype)
               for t, u in zip(example, used)]
    return [counts(gm, example)]


def gpt2(layers: int) -> list:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=128, vocab_size=50257,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (2, 64))

    def fwd_bwd(model, ids):
        model(ids, labels=ids).loss.backward()
    return [counts(gm, [torch.zeros_like(t, device="cpu") if t.is_meta else t for t in ex])
            for gm, ex in captured(fwd_bwd, model, ids, calls=1)]   # (a backward's are meta)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-count-"))
    for name, rows in (("adamw_gpu_layout", lambda: adamw(True)),
                       ("adamw_cpu_layout", lambda: adamw(False)),
                       (f"gpt2_{args.layers}l_fwd_bwd", lambda: gpt2(args.layers))):
        rows = rows()
        kernels, launches = sum(r[0] for r in rows), sum(r[1] for r in rows)
        print(f"{name}: {len(rows)} graph(s), {kernels} distinct Triton kernels, "
              f"{launches} launches  (per graph: {rows})", flush=True)


if __name__ == "__main__":
    main()
