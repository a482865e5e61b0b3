"""What recomputing shared pointwise values (``kiln/kernels/lowering/recompute.py``,
KILN_RECOMPUTE_POINTWISE) saves on a GPT-2 training step under bf16 autocast: the
bytes kiln's kernels write and read in each compiled graph with the setting off and on
(a plan-level count: each kernel writes the buffers it stores and reads each buffer it
takes from outside once; library calls not counted), and with ``--time`` the step's
median time each way.

    TRITON_INTERPRET=1 KILN_KERNEL_TARGET=triton python -m benchmarks.recompute_traffic
    python -m benchmarks.recompute_traffic --device cuda --layers 12 --embd 768 \\
        --batch 8 --seq 512 --time 20
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln
from kiln import config
from kiln.kernels import compile as kernels_compile


def traffic(plan) -> tuple:
    """(kernels, bytes written, bytes read) of one plan's own kernels."""
    by = {b.name: b for b in plan.lowered.buffers}
    kernels = written = read = 0
    for g in plan.sched.groups:
        if g.extern is not None:
            continue
        kernels += 1
        written += sum(n.numel * n.dtype.itemsize for n in g.nodes
                       if n.name not in plan.sched.locals)
        outside = set().union(*(n.reads() for n in g.nodes)) - g.names
        read += sum(by[b].numel * by[b].dtype.itemsize for b in outside)
    return kernels, written, read


def _model(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, vocab_size=a.vocab,
                     n_positions=a.seq, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    return GPT2LMHeadModel(cfg).to(a.device)


def _step_fn(m, device):
    def step(ids):
        with torch.autocast(device, dtype=torch.bfloat16):
            return m(ids, labels=ids).loss
    return step


def _timed(m, ids, n, device) -> float:
    kiln.reset()
    f = kiln.compile(_step_fn(m, device), backend="kiln")
    times = []
    for i in range(n + 2):                 # two warm-up steps (compile, first replay)
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        f(ids).backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--time", type=int, default=0, help="time this many steps each way")
    a = p.parse_args(argv)
    m = _model(a)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    graphs, plan = [], kernels_compile.plan

    def recording(gm, example_inputs, target="cpp"):
        graphs.append((gm, example_inputs, target))
        return plan(gm, example_inputs, target)
    kernels_compile.plan = recording
    try:
        kiln.reset()
        kiln.compile(_step_fn(m, a.device), backend="kiln")(ids).backward()
    finally:
        kernels_compile.plan = plan
    saved = config.recompute_pointwise, config.graph_cache
    try:
        config.graph_cache = False
        for i, (gm, inputs, target) in enumerate(graphs):
            row = {}
            for on in (False, True):
                config.recompute_pointwise = on
                row[on] = traffic(plan(gm, inputs, target))
            (k0, w0, r0), (k1, w1, r1) = row[False], row[True]
            print(f"graph {i}: kernels {k0} -> {k1}; written {w0 / 1e6:.2f} -> {w1 / 1e6:.2f} MB;"
                  f" read {r0 / 1e6:.2f} -> {r1 / 1e6:.2f} MB")
        config.graph_cache = saved[1]
        for on in (False, True) if a.time else ():
            config.recompute_pointwise = on
            print(f"recompute {'on ' if on else 'off'}: step {_timed(m, ids, a.time, a.device):.2f} ms"
                  f" (median of {a.time})")
    finally:
        config.recompute_pointwise, config.graph_cache = saved


if __name__ == "__main__":
    main()
