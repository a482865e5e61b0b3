"""The whole training step compiled: forward (optionally under autocast), loss,
``loss.backward()``, ``opt.step()``, ``opt.zero_grad()`` — one function handed to each
backend, in one process.

    python -m benchmarks.train_step [--model mlp|gpt2] [--layers N] [--hidden H]
        [--batch B] [--seq S] [--vocab V] [--autocast none|bf16|fp16]
        [--optimizer adamw|adam|sgd] [--foreach auto|on|off] [--device cpu|cuda]
        [--backends eager,torch.compile,torch.compile-ro,kiln] [--runs N] [--json FILE]

The issue's GPU row (GPT-2 small, 12 layers, hidden 768, batch 8 x 512, bf16 autocast,
AdamW):

    python -m benchmarks.train_step --device cuda --model gpt2 --layers 12 --hidden 768 \\
        --batch 8 --seq 512 --vocab 50257 --autocast bf16 --optimizer adamw

Each backend gets a fresh, identically seeded model and optimizer. Reported per backend:
``first_s`` (wall time of the first step: tracing, compiling, one step), ``second_s``
(the second step: an optimizer graph specialised to its now-existing state compiles
there), ``median_ms`` over ``--runs`` timed steps after warm-up (CUDA events on a GPU),
``speedup`` against eager, and ``loss_err``: the largest relative difference of the
first three losses from eager's (the optimizer's updates feed every later loss, so a
wrong update shows here). Fused optimizers are not used (``fused`` stays off).
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
    p.add_argument("--model", choices=["mlp", "gpt2"], default="mlp")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=32, help="tokens per sequence (gpt2)")
    p.add_argument("--vocab", type=int, default=1000, help="vocabulary size (gpt2)")
    p.add_argument("--autocast", choices=list(_AUTOCAST), default="none",
                   help="run forward and loss under torch.autocast(device, dtype), inside the step")
    p.add_argument("--optimizer", choices=["adamw", "adam", "sgd"], default="adamw")
    p.add_argument("--foreach", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--backends", default="eager,torch.compile,torch.compile-ro,kiln")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", default="", help="also write the results here")
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


def build(a):
    """A fresh, seeded model on the device, its optimizer, and a few input sets."""
    torch.manual_seed(0)
    model = (_MLP(a.layers, a.hidden) if a.model == "mlp" else _GPT2(a)).to(a.device)
    foreach = {"auto": None, "on": True, "off": False}[a.foreach]
    params = model.parameters()
    if a.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)
    else:
        cls = torch.optim.AdamW if a.optimizer == "adamw" else torch.optim.Adam
        opt = cls(params, lr=1e-4, foreach=foreach)
    g = torch.Generator().manual_seed(1)
    inputs = []
    for _ in range(3):
        if a.model == "mlp":
            inputs.append((torch.randn(a.batch, a.hidden, generator=g).to(a.device),
                           torch.randn(a.batch, generator=g).to(a.device)))
        else:
            ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(a.device)
            inputs.append((ids, ids))
    return model, opt, inputs


def make_step(model, opt, device, dtype):
    def train_step(x, y):
        with torch.autocast(device, dtype) if dtype is not None else contextlib.nullcontext():
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return train_step


def run_backend(name, a, ref_losses=None):
    be = make_backend(name)
    be.reset()
    model, opt, inputs = build(a)
    step = be.compile(make_step(model, opt, a.device, _AUTOCAST[a.autocast]))
    row = {"backend": name}
    try:
        losses = []
        for i in range(3):
            sync(a.device)
            t0 = time.perf_counter()
            losses.append(float(step(*inputs[i])))
            sync(a.device)
            if i < 2:
                row[("first_s", "second_s")[i]] = round(time.perf_counter() - t0, 3)
        if hasattr(be, "settle"):
            be.settle()
        warmup = a.warmup + (be.trial_calls() if hasattr(be, "trial_calls") else 0)
        times = time_calls(lambda i: step(*inputs[i]), len(inputs), a.device, a.runs, warmup)
        row["median_ms"] = round(median(times) * 1e3, 3)
        row["losses"] = losses
        if ref_losses is not None:
            row["loss_err"] = max(abs(x - r) / max(abs(r), 1e-12) for x, r in zip(losses, ref_losses))
    except Exception as e:  # noqa: BLE001 -- a failing backend is a row, not the end of the run
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


def main(argv=None) -> int:
    a = parse(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU visible", file=sys.stderr)
        return 2
    names = [b for b in a.backends.split(",") if b]
    if "eager" in names:  # the reference goes first
        names.remove("eager")
    names.insert(0, "eager")
    rows = []
    for name in names:
        rows.append(run_backend(name, a, rows[0]["losses"] if rows and "losses" in rows[0] else None))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0].get("median_ms")
    print(f"\n{a.model} layers={a.layers} hidden={a.hidden} batch={a.batch} seq={a.seq} "
          f"autocast={a.autocast} optimizer={a.optimizer} foreach={a.foreach} device={a.device}")
    print(f"{'backend':<18} {'first_s':>8} {'second_s':>9} {'median_ms':>10} {'speedup':>8} {'loss_err':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:<18} error: {r['error']}")
            continue
        sp = base / r["median_ms"] if base and r.get("median_ms") else float("nan")
        r["speedup"] = round(sp, 3)
        print(f"{r['backend']:<18} {r['first_s']:>8.2f} {r['second_s']:>9.2f} {r['median_ms']:>10.3f} "
              f"{sp:>8.2f} {r.get('loss_err', 0.0):>9.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
