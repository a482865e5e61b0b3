"""An optimizer step alone, eager against kiln, over GPT-2-small-like parameters (148
tensors, 124M values on a GPU; the same count of small tensors on a CPU):

    python -m benchmarks.probes.optimizer_replay [--optimizer adamw|adam|sgd]
        [--device cuda|cpu] [--steps 20] [--no-perf-fallback] [--small]

Eager keeps Adam's step counters on the CPU (foreach, not capturable), so kiln's graph
reads CPU values beside its GPU kernels: it replays from a CUDA graph through its host
prologue (kiln/kernels/runtime/host_prologue.py). Prints the median ms per step of
each, whether they agree, and what the replay of the optimizer's graph did.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import kiln
import kiln.kernels.backend as kernel_backend
from kiln import config


def gpt2_shapes(hidden=768, layers=12, vocab=50257, positions=1024) -> list:
    """GPT-2's parameter shapes (tied output embedding): 4 + 12 a layer."""
    shapes = [(vocab, hidden), (positions, hidden)]
    for _ in range(layers):
        shapes += [(hidden,), (hidden,), (hidden, 3 * hidden), (3 * hidden,),
                   (hidden, hidden), (hidden,), (hidden,), (hidden,),
                   (hidden, 4 * hidden), (4 * hidden,), (4 * hidden, hidden), (hidden,)]
    return shapes + [(hidden,), (hidden,)]


OPTIMIZERS = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, foreach=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=True),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, foreach=True),
}


def _params(shapes, device, seed):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.nn.Parameter((torch.randn(*s, generator=g) * 0.02).to(device)) for s in shapes]
    for p in ps:
        p.grad = (torch.randn(*p.shape, generator=g) * 0.01).to(device)
    return ps


class _Recorder:
    """Keeps each compiled aten graph (to report its replay)."""

    def __init__(self, inner):
        self.inner, self.compiled = inner, []

    def __call__(self, gm, example_inputs, *a, **kw):
        c = self.inner(gm, example_inputs, *a, **kw)
        self.compiled.append(c)
        return c


def _median_ms(fn, device, steps):
    for _ in range(3):
        fn()
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _replay_report(rec) -> list:
    lines = []
    for c in rec.compiled:
        for rt in getattr(c, "variants", {}).values():
            kind = type(rt).__name__
            rt = getattr(rt, "compiled", rt)       # a perf-fallback trial still running
            g = getattr(rt, "graphs", None)
            if g is None:
                lines.append(f"  graph ({kind}): no CUDA-graph replay")
                continue
            host = "host prologue" if g.host is not None else "no host values"
            lines.append(f"  graph: calls {g.calls}, records {g.records}, replays {g.replays}, "
                         f"{host}; {g.reason or 'replay on'}")
        for rec_ in getattr(c, "perf_choices", {}).values():
            lines.append(f"  perf fallback: {rec_}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--optimizer", default="adamw", choices=sorted(OPTIMIZERS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--small", action="store_true", help="small shapes (the default on a CPU)")
    ap.add_argument("--no-perf-fallback", action="store_true")
    a = ap.parse_args(argv)
    small = a.small or a.device == "cpu"
    shapes = gpt2_shapes(32, 12, 256, 64) if small else gpt2_shapes()
    if a.no_perf_fallback:
        config.perf_fallback = False
    n = sum(torch.Size(s).numel() for s in shapes)
    print(f"{a.optimizer} over {len(shapes)} tensors, {n / 1e6:.1f}M values, on {a.device}")

    eager_ps = _params(shapes, a.device, 0)
    kiln_ps = _params(shapes, a.device, 0)
    eager_opt, kiln_opt = OPTIMIZERS[a.optimizer](eager_ps), OPTIMIZERS[a.optimizer](kiln_ps)

    rec = _Recorder(kernel_backend.compile_aten_graph)
    kernel_backend.compile_aten_graph = rec
    try:
        @kiln.compile
        def kiln_step():
            kiln_opt.step()

        eager_ms = _median_ms(eager_opt.step, a.device, a.steps)
        kiln_ms = _median_ms(kiln_step, a.device, a.steps)
    finally:
        kernel_backend.compile_aten_graph = rec.inner
    same = all(torch.allclose(p, q, rtol=1e-4, atol=1e-6) for p, q in zip(eager_ps, kiln_ps))
    steps_of = [s.get("step") for s in kiln_opt.state.values()]
    where = {str(t.device) for t in steps_of if isinstance(t, torch.Tensor)}
    print(f"eager {eager_ms:.3f} ms   kiln {kiln_ms:.3f} ms   "
          f"(median of {a.steps} steps; parameters agree: {same}; step counters on {where or '-'})")
    for line in _replay_report(rec):
        print(line)


if __name__ == "__main__":
    main()
