"""Where a training step's GPU memory goes, per backend: saved activations, peak, held.

    python -m benchmarks.memory --only resnet18/train,llama/train [--backends eager,kiln,kiln-plain]

The harness reports one figure per cell, the peak over its timed calls. Judging
"peak memory no worse than eager" needs it split. For each selected workload (the
harness's own, built the same way) and backend, after three warm-up steps, one
training step (compiled forward+loss, backward, SGD step, ``zero_grad``) is measured:

- ``after fwd``: bytes allocated once the loss is computed, above the state before the
  step: what the forward leaves alive for the backward (saved activations, and any
  memory a replayed graph holds);
- ``peak``: the step's peak above that same base;
- ``held``: bytes still allocated after the step above the base of the fresh model
  (optimizer state, a replayed graph's outputs);
- ``total peak``: the step's peak allocated bytes above the state before the model was
  built;
- ``reserved``: the same for bytes the caching allocator reserved from the GPU. A CUDA
  graph's temporaries are not "allocated" while it replays (the allocator never sees
  them) but their pool stays reserved, so for a replayed graph this is the honest
  figure; for eager it adds the allocator's slack.

``kiln-plain`` is kiln with CUDA-graph replay off (``config.cudagraphs = "0"``), so the
replay's share is the difference between the two kiln rows.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.backends import make_backend  # noqa: E402
from benchmarks.workloads import select  # noqa: E402

MB = 2 ** 20


def measure(backend_name: str, w, device: str) -> dict:
    """Memory figures (MB) of one training step of ``w`` under one backend."""
    from kiln import config
    plain = backend_name == "kiln-plain"
    saved_setting = config.cudagraphs
    if plain:
        config.cudagraphs = "0"
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before_ids = {id(o) for o in _replays()}
        base0 = torch.cuda.memory_allocated()
        reserved0 = torch.cuda.memory_reserved()
        inst = w.build(device)
        compiled = make_backend("kiln" if plain else backend_name).compile(inst.fn)
        opt = torch.optim.SGD(inst.model.parameters(), lr=1e-3, momentum=0.9)
        model_bytes = torch.cuda.memory_allocated() - base0

        def step(probe=False):
            loss = compiled(*inst.inputs[0])
            fwd = torch.cuda.memory_allocated() if probe else 0
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return fwd

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd = step(probe=True)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        reserved = torch.cuda.max_memory_reserved()
        after = torch.cuda.memory_allocated()
        out = {"model": model_bytes / MB, "after fwd": (fwd - before) / MB,
               "peak": (peak - before) / MB, "held": (after - base0 - model_bytes) / MB,
               "total peak": (peak - base0) / MB,
               "reserved": (reserved - reserved0) / MB,
               "replays": "; ".join(_describe(o) for o in _replays()
                                    if id(o) not in before_ids) or "-"}
        del inst, compiled, opt
        return out
    finally:
        config.cudagraphs = saved_setting


def _replays():
    import gc

    from kiln.kernels.runtime import graph_replay
    return [o for o in gc.get_objects() if isinstance(o, graph_replay.GraphReplay)]


def _describe(g) -> str:
    """One kiln CUDA graph's state: calls, recordings, inputs copied in, outputs copied
    out, and why replay is off if it is."""
    s = f"{g.calls} calls, {g.records} rec"
    if g.moving:
        s += f", {len(g.moving)} in copied"
    if g.copied:
        s += f", {len(g.copied)} out copied"
    if g.disabled:
        s += f", off: {g.reason}"
    return s


def _cell(key: str, backend: str) -> str:
    """One measurement as a table row's cells (run in a fresh process by ``main``)."""
    w = next(w for w in select("cuda", "all", False, [key], all_dtypes=True) if w.key == key)
    try:
        r = measure(backend, w, "cuda")
        return " | ".join(f"{r[c]:.0f}" for c in COLS) + f" | {r['replays']}"
    except Exception as e:      # noqa: BLE001  (a row per failure, not a crash)
        return f"failed: {type(e).__name__}: {str(e)[:120]}"


COLS = ["model", "after fwd", "peak", "held", "total peak", "reserved"]


def main(argv=None):
    import subprocess
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated substrings of workload keys")
    p.add_argument("--backends", default="eager,torch.compile,kiln,kiln-plain")
    p.add_argument("--cell", nargs=2, metavar=("KEY", "BACKEND"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmarks.memory measures the CUDA allocator: it needs a GPU")
    if a.cell:
        print("CELL " + _cell(*a.cell), flush=True)
        return
    if not a.only:
        p.error("--only is required")
    print("| workload | backend | " + " | ".join(f"{c} MB" for c in COLS) + " | CUDA graphs |")
    print("|---|---|" + "---|" * (len(COLS) + 1))
    for w in select("cuda", "all", False, a.only.split(","), all_dtypes=True):
        if w.mode != "train" or w.missing():
            continue
        for b in a.backends.split(","):
            # a fresh process per cell: the allocator's reserved memory (and kiln's
            # CUDA-graph pool) is then this cell's alone
            r = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--cell", w.key, b],
                               capture_output=True, text=True)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CELL ")]
            cells = lines[-1][5:] if lines else f"failed: {r.stderr.strip()[-200:]}"
            print(f"| {w.key} | {b} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
