"""Why a compiled graph's CUDA-graph replay records again, call by call.

    python -m benchmarks.probes.replay_trace [--model llama] [--mode fsdp2] [--steps 8]

Runs ``benchmarks.distributed``'s step (world size 1, kiln) and wraps
``GraphReplay.__call__`` to print, per call of each graph: the inputs that moved since
its last call (position, shape, whether an nn.Parameter), and before each recording
the outputs someone still holds (whose graph, which positions). GPU only.
"""
from __future__ import annotations

import argparse
from collections import defaultdict

import torch


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama")
    p.add_argument("--mode", default="fsdp2")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--layers", type=int, default=3)
    a = p.parse_args(argv)
    from benchmarks import distributed as D
    from kiln.kernels.runtime import graph_replay as G
    names, last = {}, {}
    counts = defaultdict(int)
    orig_call, orig_record = G.GraphReplay.__call__, G.GraphReplay._record

    def name(g):
        return names.setdefault(id(g), f"g{len(names)}")

    def call(self, rt, args):
        ptrs = [args[pos].data_ptr() for pos, _ in rt.inputs]
        prev = last.get(id(self))
        last[id(self)] = ptrs
        moved = [] if prev is None else [i for i, (x, y) in enumerate(zip(ptrs, prev)) if x != y]
        desc = [(i, tuple(args[rt.inputs[i][0]].shape), isinstance(args[rt.inputs[i][0]], torch.nn.Parameter))
                for i in moved]
        held = [] if self.graph is None else self.pool.held_after(self.seq)
        counts[id(self)] += 1
        print(f"{name(self)} call {counts[id(self)]} n_in={len(ptrs)} moved={desc[:6]}{'...' if len(desc) > 6 else ''} "
              f"(#{len(desc)}) moving={sorted(self.moving)[:8]} held={[(name(h[0]) if h[0] else 'retired', sorted(h[1])[:4]) for h in held][:6]} "
              f"records={self.records} disabled={self.disabled}", flush=True)
        return orig_call(self, rt, args)

    G.GraphReplay.__call__ = call
    da, device = D.one_process(["--model", a.model, "--mode", a.mode, "--layers", str(a.layers)], port=29534)
    model, blocks = D.build_model(da, device)
    fn = D.wrap("kiln", da, model, blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, da.vocab, (da.batch, da.seq), device=device)
    for s in range(a.steps):
        print(f"--- step {s}", flush=True)
        D.train_step(fn, opt, ids, da, device)
        D.sync(device)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
