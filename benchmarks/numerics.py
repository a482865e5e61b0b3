"""Numerics of kiln's decompositions against eager's kernels, both measured from float64.

    python -m benchmarks.numerics [--only a,b] [--out F] [--no-models]

For each op (forward and backward) on inputs chosen to be hard (large reductions,
values with a large mean relative to their spread: cancellation), the max relative
error (max |y - y64| / max |y64|, per output, worst over outputs) of eager float32 and
of kiln's ``kiln`` backend (generated C++ kernels) float32, against eager float64 on the
same (float32-representable) inputs. Then the model zoo's training gradients
(``tests.models.zoo``): the same error over every parameter's gradient, for eager and
kiln, and their ratio. A ratio <= 2 is the target (issue 26, item 6).
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import kiln  # noqa: E402


def _rel(got, ref) -> float:
    scale = ref.abs().max().item()
    return (got.double() - ref).abs().max().item() / (scale if scale else 1.0)


def _inputs(shape, mean, spread, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * spread + mean).float()


def _bn_train(x, w, b):
    return F.batch_norm(x, None, None, w, b, training=True)


def _bn_eval(x, w, b):
    c = x.shape[1]
    rm = torch.full((c,), 0.5, dtype=x.dtype)
    rv = torch.full((c,), 2.0, dtype=x.dtype)
    return F.batch_norm(x, rm, rv, w, b, training=False)


def _ln(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def _gn(x, w, b):
    return F.group_norm(x, 4, w, b)


#: name -> (function of (x, weight, bias), x shape, channel dim of the affine, mean, spread)
OPS = {
    "batch_norm_train": (_bn_train, (32, 16, 16, 16), 1, 0.0, 1.0),
    "batch_norm_train_shift": (_bn_train, (32, 16, 16, 16), 1, 100.0, 1.0),
    "batch_norm_train_big": (_bn_train, (64, 8, 64, 64), 1, 10.0, 1.0),
    "batch_norm_eval": (_bn_eval, (32, 16, 16, 16), 1, 0.0, 1.0),
    "layer_norm": (_ln, (64, 1024), -1, 0.0, 1.0),
    "layer_norm_shift": (_ln, (64, 4096), -1, 100.0, 1.0),
    "group_norm_shift": (_gn, (8, 16, 32, 32), 1, 100.0, 1.0),
    "gelu": (lambda x, w, b: F.gelu(x), (256, 1024), None, 0.0, 3.0),
    "gelu_tanh": (lambda x, w, b: F.gelu(x, approximate="tanh"), (256, 1024), None, 0.0, 3.0),
    "softmax": (lambda x, w, b: torch.softmax(x, -1), (64, 4096), None, 0.0, 5.0),
    "softmax_shift": (lambda x, w, b: torch.softmax(x, -1), (64, 4096), None, 50.0, 5.0),
    "log_softmax": (lambda x, w, b: torch.log_softmax(x, -1), (64, 4096), None, 0.0, 5.0),
}


def _run(fn, x, w, b, gy, compiled):
    x = x.clone().requires_grad_()
    params = [p.clone().requires_grad_() for p in (w, b) if p is not None]
    pw, pb = (params + [None, None])[:2] if w is not None else (None, None)
    f = kiln.compile(fn, backend="kiln", fullgraph=True) if compiled else fn
    y = f(x, pw, pb)
    y.backward(gy)
    return [y.detach(), x.grad] + [p.grad for p in params]


def measure_op(name):
    """(eager error, kiln error) per output (forward, input grad, param grads) of one op."""
    fn, shape, cdim, mean, spread = OPS[name]
    x = _inputs(shape, mean, spread, 0)
    n = shape[cdim] if cdim is not None else None
    w = _inputs((n,), 1.0, 0.5, 1) if n else None
    b = _inputs((n,), 0.0, 0.5, 2) if n else None
    gy = _inputs(shape, 0.0, 1.0, 3)
    ref = _run(fn, x.double(), *(t.double() if t is not None else None for t in (w, b)),
               gy.double(), False)
    eager = _run(fn, x, w, b, gy, False)
    k = _run(fn, x, w, b, gy, True)
    kiln.reset()
    return ([_rel(e, r) for e, r in zip(eager, ref)], [_rel(e, r) for e, r in zip(k, ref)])


def _loss(out):
    """A fixed random projection of every floating output (``zoo._loss``'s, drawn in
    float32 whatever the output's dtype, so that the float64 reference uses the same)."""
    from tests.models import zoo
    g = torch.Generator().manual_seed(7)
    total = 0
    for t in zoo._leaves(out):
        if t.is_floating_point():
            proj = torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype)
            total = total + (t * proj).sum()
    return total


MODELS = ["tv.resnet18", "tv.shufflenet_v2_x0_5", "tv.mobilenet_v3_small", "hf.bert", "hf.gpt2"]


def _zoo_names() -> list:
    """The zoo's models whose training step it checks (``ModelSpec.train``)."""
    from tests.models import zoo
    return [s.name for s in zoo.REGISTRY if s.train]


def _channels_last(m, a):
    """The model and its 4-D tensor arguments in channels-last memory format (eager then
    runs other convolution and normalisation kernels, summing in other orders)."""
    m = m.to(memory_format=torch.channels_last)
    return m, type(a)(t.contiguous(memory_format=torch.channels_last)
                      if torch.is_tensor(t) and t.dim() == 4 else t for t in a)


def gradient_errors(name, runs=(("eager", None), ("kiln", "kiln")), input_seed=0,
                    weight_seed=0) -> dict:
    """run -> max relative error over the parameters' gradients of one training step in
    float32, against the same step in float64 eager. ``runs``: (label, backend) pairs,
    backend None for eager, ``"channels_last"`` for eager in that memory format."""
    from tests.models import zoo
    spec = zoo.by_name(name)
    torch.manual_seed(weight_seed)
    base = spec.build()
    zoo._zero_randomness(base)
    base.train()
    args, kwargs = spec.inputs(input_seed)

    def grads(dtype, backend):
        m = copy.deepcopy(base).to(dtype)
        a, kw = zoo._cast(args, dtype), zoo._cast(kwargs, dtype)
        if backend == "channels_last":
            m, a = _channels_last(m, a)
        f = kiln.compile(m, backend=backend, fullgraph=True) if backend not in (
            None, "channels_last") else m
        _loss(f(*a, **kw)).backward()
        return [p.grad.double() for p in m.parameters() if p.grad is not None]

    ref = grads(torch.float64, None)
    got = {label: grads(torch.float32, backend) for label, backend in runs}
    kiln.reset()
    # Per tensor, relative to its own largest element, floored at 1e-4 of the largest
    # gradient anywhere: a gradient that is zero up to rounding (a bias before a
    # normalisation) is noise relative to its own elements.
    floor = 1e-4 * max(r.abs().max().item() for r in ref)
    err = lambda gs: max((g - r).abs().max().item() / max(r.abs().max().item(), floor)
                         for g, r in zip(gs, ref))
    return {label: err(gs) for label, gs in got.items()}


def measure_model(name):
    """(eager, kiln) max relative error over the parameters' gradients of one training
    step in float32, against the same step in float64 eager."""
    e = gradient_errors(name)
    return e["eager"], e["kiln"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--only", default="")
    p.add_argument("--out", default="")
    p.add_argument("--no-models", action="store_true")
    p.add_argument("--zoo", action="store_true",
                   help="every model of the zoo that trains, not the five of MODELS")
    a = p.parse_args(argv)
    only = set(filter(None, a.only.split(",")))
    lines = ["## Ops (float32 vs float64 eager, max relative error; outputs: y, dx, dw, db)", "",
             "| op | eager | kiln | worst kiln/eager |", "|---|---|---|---|"]
    for name in OPS:
        if only and name not in only:
            continue
        e, k = measure_op(name)
        ratio = max(kk / max(ee, 1e-7) for ee, kk in zip(e, k))
        fmt = lambda v: " ".join(f"{x:.1e}" for x in v)
        lines.append(f"| {name} | {fmt(e)} | {fmt(k)} | {ratio:.2f} |")
        print(lines[-1], flush=True)
    if not a.no_models:
        lines += ["", "## Zoo training gradients (float32 vs float64 eager, max relative error)",
                  "", "| model | eager | kiln | kiln/eager |", "|---|---|---|---|"]
        ratios, failed = [], []
        for name in _zoo_names() if a.zoo else MODELS:
            if only and name not in only:
                continue
            try:
                e, k = measure_model(name)
            except Exception as exc:  # noqa: BLE001  (a row of its own; the table goes on)
                kiln.reset()
                failed.append(name)
                lines.append(f"| {name} | error | {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:100] if str(exc) else ''} | |")
                print(lines[-1], flush=True)
                continue
            ratios.append((k / max(e, 1e-12), name))
            lines.append(f"| {name} | {e:.1e} | {k:.1e} | {ratios[-1][0]:.2f} |")
            print(lines[-1], flush=True)
        if ratios:
            worst = max(ratios)
            lines += ["", f"{sum(r <= 2 for r, _ in ratios)} of {len(ratios)} models at most 2x "
                      f"eager's error; the worst {worst[1]} at {worst[0]:.2f}x"
                      + (f"; {len(failed)} failed: {', '.join(failed)}" if failed else "")]
            print(lines[-1], flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
