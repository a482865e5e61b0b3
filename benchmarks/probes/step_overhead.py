"""Where a distributed training step's host time goes, per backend.

    python -m benchmarks.probes.step_overhead --model llama --mode fsdp2 \\
        --backends torch.compile,kiln [--steps 20] [--top 30]

One process (world size 1; nccl on a GPU, gloo on the CPU), the models and wrapping
of ``benchmarks.distributed``. Per backend: warm-up steps, the median of ``--steps``
timed steps, then ``cProfile`` over 10 more steps (host time only; the GPU is
synchronised once per step), printed by own time and by cumulative time. FSDP2 steps
are host-bound on a fast GPU, so this says what kiln's per-call path costs against
torch.compile's.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time

import torch


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama")
    p.add_argument("--mode", default="fsdp2")
    p.add_argument("--backends", default="torch.compile,kiln")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)
    from benchmarks import distributed as D
    da, device = D.one_process(["--model", a.model, "--mode", a.mode], port=29533)
    for backend in a.backends.split(","):
        model, blocks = D.build_model(da, device)
        fn = D.wrap(backend, da, model, blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, da.vocab, (da.batch, da.seq), device=device)

        def step():
            D.train_step(fn, opt, ids, da, device)
            D.sync(device)

        for _ in range(a.warmup):
            step()
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(10):
            step()
        prof.disable()
        out = io.StringIO()
        st = pstats.Stats(prof, stream=out)
        st.sort_stats("tottime").print_stats(a.top)
        st.sort_stats("cumulative").print_stats(a.top)
        print(f"=== {backend}: median {1e3 * statistics.median(times):.2f} ms over {a.steps} steps")
        print(out.getvalue())
        sys.stdout.flush()
        del model, blocks, fn, opt
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
