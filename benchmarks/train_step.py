"""The whole training step compiled: forward (optionally under autocast), loss,
``loss.backward()``, ``opt.step()``, ``opt.zero_grad()`` — one function handed to each
backend, in one process. With ``--autocast fp16`` every backend (eager too) runs the
step through a ``torch.amp.GradScaler``: ``scaler.scale(loss).backward()``,
``scaler.step(opt)``, ``scaler.update()`` — the inf checks and skipped steps included.

    python -m benchmarks.train_step [--model mlp|gpt2|resnet18] [--layers N] [--hidden H]
        [--batch B] [--seq S] [--vocab V] [--image PX] [--autocast none|bf16|fp16]
        [--optimizer adamw|adam|sgd] [--foreach auto|on|off] [--device cpu|cuda]
        [--backends eager,torch.compile,torch.compile-ro,kiln] [--runs N] [--json FILE]
        [--seed N]

The issue's GPU rows: GPT-2 small (12 layers, hidden 768, batch 8 x 512, bf16
autocast, AdamW), and torchvision resnet18 (random weights, batch 32 of 224 px images,
1000 classes, cross-entropy, SGD with momentum) under bf16, then fp16 with GradScaler:

    python -m benchmarks.train_step --device cuda --model gpt2 --layers 12 --hidden 768 \\
        --batch 8 --seq 512 --vocab 50257 --autocast bf16 --optimizer adamw --json gpt2.json
    python -m benchmarks.train_step --device cuda --model resnet18 --batch 32 \\
        --autocast bf16 --optimizer sgd --json rn18_bf16.json
    python -m benchmarks.train_step --device cuda --model resnet18 --batch 32 \\
        --autocast fp16 --optimizer sgd --json rn18_fp16.json

Each backend gets a fresh, identically seeded model and optimizer (``--seed N``: the
model's weights from ``torch.manual_seed(N)``, the inputs from a generator seeded N + 1;
the default 0 is the row as it always was). Reported per backend:
``first_s`` (wall time of the first step: tracing, compiling, one step), ``second_s``
(the second step: an optimizer graph specialised to its now-existing state compiles
there), ``median_ms`` over ``--runs`` timed steps after warm-up (CUDA events on a GPU),
``speedup`` against eager, ``loss_err``: the largest relative difference of the first
three losses from eager's (the optimizer's updates feed every later loss, so a wrong
update shows here), and ``update_err``: the parameters' total change over those three
steps against eager's, ``||dp - dp_eager|| / ||dp_eager||`` over all parameters (0:
the same updates; about 1: unrelated ones; under autocast, rounding alone gives some).
``err64`` is the same measure against an exact computation (``reference64``: the
steps in float64, no autocast; ``--no-ref64`` skips it): a compiled backend is as
correct as eager when its ``err64`` is about eager's (eager's own float32 is not exact:
resnet18's batch norms over few values amplify rounding, so ``update_err`` alone can
blame a backend for eager's error); ``loss_err64`` likewise takes the three losses
against the float64 steps' (``loss_err`` between two float32 runs can be as large as
their own distance from float64). With a GradScaler, ``scales`` (the scale after
each of the three steps) must equal eager's: a step skipped by one backend and not by
another changes it (where all three are skipped — the scale halving each time — the
update errors are 0 by construction). Fused optimizers are not used (``fused`` stays
off). kiln's perf fallback (on by default) times each graph against PyTorch running its
aten graph over its first calls, so some of the three checked steps may run that aten
graph; ``--perf-fallback off`` checks kiln's kernels alone.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.backends import make_backend  # noqa: E402
from benchmarks.measure import median, sync, time_calls  # noqa: E402

_AUTOCAST = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.train_step", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["mlp", "gpt2", "resnet18"], default="mlp")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence (gpt2)")
    p.add_argument("--vocab", type=int, default=1000, help="vocabulary size (gpt2)")
    p.add_argument("--image", type=int, default=224, help="image height and width (resnet18; default 224)")
    p.add_argument("--autocast", choices=list(_AUTOCAST), default="none",
                   help="run forward and loss under torch.autocast(device, dtype), inside the step")
    p.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw")
    p.add_argument("--foreach", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backends", default="eager,torch.compile,torch.compile-ro,kiln")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default="", help="also write the results here")
    p.add_argument("--seed", type=int, default=0,
                   help="weights from torch.manual_seed(SEED), inputs from a generator seeded SEED + 1")
    p.add_argument("--perf-fallback", choices=["default", "on", "off"], default="default",
                   help="kiln's perf fallback (off: the checked steps run kiln's kernels only)")
    p.add_argument("--no-ref64", dest="ref64", action="store_false",
                   help="skip the float64 reference of the three checked steps (err64)")
    return p.parse_args(argv)


class _MLP(torch.nn.Module):
    def __init__(self, layers, hidden):
        super().__init__()
        self.body = torch.nn.Sequential(*[m for _ in range(layers) for m in
                                          (torch.nn.Linear(hidden, hidden), torch.nn.GELU())])
        self.head = torch.nn.Linear(hidden, 1)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.head(self.body(x)).squeeze(-1), y)


class _GPT2(torch.nn.Module):
    def __init__(self, a):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(vocab_size=a.vocab, n_positions=max(1024, a.seq), n_embd=a.hidden,
                         n_layer=a.layers, n_head=max(1, a.hidden // 64), resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0)
        self.lm = GPT2LMHeadModel(cfg)

    def forward(self, ids, labels):
        return self.lm(input_ids=ids, labels=labels).loss


class _ResNet18(torch.nn.Module):
    """torchvision's resnet18, random weights, 1000 classes, cross-entropy loss."""

    def __init__(self, a):
        super().__init__()
        import torchvision

        self.net = torchvision.models.resnet18(num_classes=1000)

    def forward(self, x, y):
        return torch.nn.functional.cross_entropy(self.net(x), y)


_MODELS = {"mlp": lambda a: _MLP(a.layers, a.hidden), "gpt2": _GPT2, "resnet18": _ResNet18}


def _inputs(a, g):
    """One (input, target) pair for ``a.model``, drawn from ``g`` on the CPU."""
    if a.model == "mlp":
        return torch.randn(a.batch, a.hidden, generator=g), torch.randn(a.batch, generator=g)
    if a.model == "resnet18":
        return (torch.randn(a.batch, 3, a.image, a.image, generator=g),
                torch.randint(0, 1000, (a.batch,), generator=g))
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
    return ids, ids


def build(a):
    """A fresh, seeded model on the device, its optimizer, and a few input sets."""
    torch.manual_seed(a.seed)
    model = _MODELS[a.model](a).to(a.device)
    foreach = {"auto": None, "on": True, "off": False}[a.foreach]
    params = model.parameters()
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)
    else:
        cls = torch.optim.AdamW if a.optimizer == "adamw" else torch.optim.Adam
        opt = cls(params, lr=1e-4, foreach=foreach)
    g = torch.Generator().manual_seed(a.seed + 1)
    inputs = [tuple(t.to(a.device) for t in _inputs(a, g)) for _ in range(3)]
    return model, opt, inputs


def make_scaler(a):
    """fp16 needs loss scaling: a GradScaler for every backend alike (None otherwise)."""
    return torch.amp.GradScaler(a.device) if a.autocast == "fp16" else None


def make_step(model, opt, device, dtype, scaler=None):
    """The step every backend compiles (eager runs it as it is)."""
    def forward(x, y):
        with torch.autocast(device, dtype) if dtype is not None else contextlib.nullcontext():
            return model(x, y)

    def train_step(x, y):
        loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def scaled_train_step(x, y):
        loss = forward(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step if scaler is None else scaled_train_step


def _new_step_each_call(step):
    """torch.compile's reduce-overhead mode told that each call is a new training step
    (``cudagraph_mark_step_begin``): its CUDA graphs may then reuse the last step's
    memory. Without it, resnet18's SGD step reads a momentum buffer that a later graph
    overwrote and raises."""
    def marked(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args)
    return marked


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def loss_error(losses, ref) -> float:
    """The largest relative difference of ``losses`` from ``ref``'s, step by step."""
    return max(abs(x - r) / max(abs(r), 1e-12) for x, r in zip(losses, ref))


def update_error(p0, got, ref):
    """||(got - p0) - (ref - p0)|| / ||ref - p0|| over all parameters together."""
    num = sum(float(((g.double() - r.double()) ** 2).sum()) for g, r in zip(got, ref))
    den = sum(float(((r.double() - s.double()) ** 2).sum()) for r, s in zip(ref, p0))
    return (num / den) ** 0.5 if den > 0 else (0.0 if num == 0 else float("inf"))


def run_backend(name, a, ref=None):
    """One backend's row. ``ref``: eager's row, whose ``_params`` (parameters after the
    three checked steps) and ``_p0`` (before them) the update error is taken against."""
    be = make_backend(name)
    be.reset()
    model, opt, inputs = build(a)
    scaler = make_scaler(a)
    step = be.compile(make_step(model, opt, a.device, _AUTOCAST[a.autocast], scaler))
    if getattr(be, "mode", None) == "reduce-overhead":
        step = _new_step_each_call(step)
    row = {"backend": name, "_p0": _params(model)}
    try:
        losses, scales = [], []
        for i in range(3):
            sync(a.device)
            t0 = time.perf_counter()
            losses.append(float(step(*inputs[i])))
            sync(a.device)
            if i < 2:
                row[("first_s", "second_s")[i]] = round(time.perf_counter() - t0, 3)
            if scaler is not None:
                scales.append(scaler.get_scale())
        row["_params"] = _params(model)
        if scaler is not None:
            row["scales"] = scales
        if ref is not None and "_params" in ref:
            row["update_err"] = update_error(ref["_p0"], row["_params"], ref["_params"])
            if "_params64" in ref:
                row["err64"] = update_error(ref["_p0"], row["_params"], ref["_params64"])
            if scaler is not None and scales != ref.get("scales"):
                row["error"] = f"GradScaler scales {scales} differ from eager's {ref.get('scales')}"
        if hasattr(be, "settle"):
            be.settle()
        warmup = a.warmup + (be.trial_calls() if hasattr(be, "trial_calls") else 0)
        times = time_calls(lambda i: step(*inputs[i]), len(inputs), a.device, a.runs, warmup)
        row["median_ms"] = round(median(times) * 1e3, 3)
        row["losses"] = losses
        if ref is not None and "losses" in ref:
            row["loss_err"] = loss_error(losses, ref["losses"])
    except Exception as e:  # noqa: BLE001 -- a failing backend is a row, not the end of the run
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        row["error"] = f"{type(e).__name__}: {msg}"
    return row


def reference64(a, scales=None):
    """The three checked steps run eagerly in float64 without autocast; where eager's
    GradScaler skipped a step (its scale fell), ``opt.step()`` is skipped here too, so
    the updates are the ones an exact computation would make. Returns the parameters
    and the three losses."""
    model, opt, inputs = build(a)
    model.double()          # the same Parameter objects: the optimizer keeps them
    prev = make_scaler(a)._init_scale if scales else None
    losses = []
    for i in range(3):
        x, y = (t.double() if t.is_floating_point() else t for t in inputs[i])
        loss = model(x, y)
        losses.append(float(loss))
        loss.backward()
        if not scales or scales[i] >= prev:
            opt.step()
        if scales:
            prev = scales[i]
        opt.zero_grad(set_to_none=True)
    return _params(model), losses


def _public(row):
    return {k: v for k, v in row.items() if not k.startswith("_")}


def main(argv=None) -> int:
    a = parse(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU visible", file=sys.stderr)
        return 2
    if a.perf_fallback != "default":
        from kiln import config
        config.perf_fallback = a.perf_fallback == "on"
    names = [b for b in a.backends.split(",") if b]
    if "eager" in names:  # the reference goes first
        names.remove("eager")
    names.insert(0, "eager")
    rows = []
    for name in names:
        print(f"# {name}: compiling and timing", flush=True)
        rows.append(run_backend(name, a, rows[0] if rows else None))
        if len(rows) == 1 and a.ref64 and "_params" in rows[0]:
            rows[0]["_params64"], rows[0]["_losses64"] = reference64(a, rows[0].get("scales"))
            rows[0]["err64"] = update_error(rows[0]["_p0"], rows[0]["_params"], rows[0]["_params64"])
        if rows[0].get("_losses64") and rows[-1].get("losses"):
            rows[-1]["loss_err64"] = loss_error(rows[-1]["losses"], rows[0]["_losses64"])
        if len(rows) > 1:   # only eager's parameters are needed later
            rows[-1].pop("_params", None)
            rows[-1].pop("_p0", None)
        print(json.dumps(_public(rows[-1])), flush=True)
    rows = [_public(r) for r in rows]
    base = rows[0].get("median_ms")
    shape = {"mlp": f"layers={a.layers} hidden={a.hidden}",
             "gpt2": f"layers={a.layers} hidden={a.hidden} seq={a.seq} vocab={a.vocab}",
             "resnet18": f"image={a.image}"}[a.model]
    print(f"\n{a.model} {shape} batch={a.batch} autocast={a.autocast}"
          f"{' +GradScaler' if a.autocast == 'fp16' else ''} optimizer={a.optimizer} "
          f"foreach={a.foreach} device={a.device}")
    print(f"{'backend':<18} {'first_s':>8} {'second_s':>9} {'median_ms':>10} {'speedup':>8} "
          f"{'loss_err':>9} {'update_err':>10} {'err64':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<18} error: {r['error']}")
            continue
        sp = base / r["median_ms"] if base and r.get("median_ms") else float("nan")
        r["speedup"] = round(sp, 3)
        print(f"{r['backend']:<18} {r['first_s']:>8.2f} {r['second_s']:>9.2f} {r['median_ms']:>10.3f} "
              f"{sp:>8.2f} {r.get('loss_err', 0.0):>9.1e} {r.get('update_err', 0.0):>10.1e} "
              f"{r.get('err64', float('nan')):>8.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
