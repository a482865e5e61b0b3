"""The model zoo's training check under autocast (issue 21): every zoo model
(``tests/models/zoo.py``) runs one training step — forward under
``torch.autocast(device, dtype)``, loss, backward — eagerly and compiled, and both are
measured against an exact computation.

    python -m tests.models.zoo_autocast --device cuda --autocast bf16 --backend kiln \\
        --out zoo_bf16.json
    python -m tests.models.zoo_autocast --device cpu --only tv.alexnet,hf.bert

Why not compare compiled with eager directly: under bf16 autocast eager is itself off by
rounding (bf16 keeps 8 significant bits; a batch norm over two images amplifies that to
tens of percent in some gradients), and a compiled step that rounds at other places —
fused kernels keep float32 intermediates that eager stores as bf16 — differs from eager
by as much as eager differs from the truth, while being no worse. So each model is also
run in float64 without autocast (the reference), and the error of eager-autocast and of
compiled-autocast against it is taken, normwise: ``err = ||x - x64|| / ||x64||`` (L2).
The rules, with ``err_e`` eager's error and ``err_c`` the compiled step's:

* outputs (all floating outputs as one vector) and gradients (every parameter's
  gradient as one vector): ``err_c <= factor * err_e + floor``;
* each tensor alone (each output, each gradient, each floating buffer after the step:
  batch-norm running statistics): ``err_c <= tensor_factor * err_e + floor`` (a tensor
  zero in float64 up to float64's rounding — a bias before a batch norm — is measured
  against its group's norm). Where eager's own value of a tensor is noise
  (``err_e >= 1``: no correct digit, as for a squeeze-excitation layer's weights behind
  a batch norm over two values), two roundings of a cancellation differ by far more
  than their errors' ratio allows, so there the floor is taken at the group's scale:
  ``||c - t64|| <= tensor_factor * ||e - t64|| + floor * ||group64||``;
* dtypes, layouts and presence: the loss, every output and every gradient has eager's
  dtype, every output eager's strides, and a gradient exists compiled exactly where it
  exists in eager.

``factor`` (2) allows a compiled step its own, different rounding of the same size as
eager's; the groups are large vectors, whose error norms vary little from one rounding
to another. A single small tensor's error (a bias, a gradient that is zero up to
rounding, like a key projection's bias) varies more, hence ``tensor_factor`` (8), there
to catch one wrong tensor hidden in the groups. ``floor`` (one unit of the autocast
dtype at 1.0: 2^-8 for bf16, 2^-11 for fp16) covers what eager happens to get almost
exact. A compiled step that ignores autocast (float32 throughout) is closer to float64
and would pass the error rules: the dtype rule catches it. A wrong step is far outside:
its error is of order 1 where eager's is 1e-3 to 1e-1. Where eager's own gradients are
mostly noise (err_e near 1: CNNs whose batch norms see 2 images of a few pixels under
bf16) the error rules say little; the ``to eager`` figure below then tells whether the
compiled step reproduces eager's rounding.

Each row: graphs and breaks (``kiln.CompileProfiler``), graphs that ran eagerly in the
autograd stage (``eager-run``), eager's and the compiled step's errors (outputs,
gradients), ``to eager``: the compiled gradients' distance to eager's over eager's
distance to float64 (far below 1 when the compiled step rounds as eager does; at most
about 3 under the rules), the worst score (a rule's error over its bound; ok when
<= 1) and which rule or tensor it is, and ok or FAIL. A model that raises, or runs
past ``--timeout-s``, is a FAIL row with its error and the run goes on — unless the
error leaves the process's CUDA context unusable (an illegal memory access): then the
rest are listed as skipped, as they are once ``--budget-s`` is spent, each naming the
``--start MODEL`` to go on from in a new process. Rows are printed as they finish
(flushed), the summary and the JSON (``--out``) at the end. Sizes are the zoo's
(batch 2, 32-64 px images, 2-layer transformers), meant to fit all 68 models in one
ten-minute GPU call (on the 2-core CPU they take 15 minutes); ``--only tv.,timm.`` and
``--only hf.`` split the run in two.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import signal
import sys
import time

import torch

import kiln
from tests.models import zoo

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
#: one unit in the last place at 1.0 (the spacing of the dtype's numbers just above 1)
_FLOORS = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}


class ModelTimeout(BaseException):
    """Raised by the alarm: a BaseException, so no ``except Exception`` on the way (a
    compiler that falls back on errors) swallows it."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise ``ModelTimeout`` in this (main) thread after ``seconds`` (0: no limit)."""
    if not seconds or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum, frame):
        raise ModelTimeout(f"over the per-model limit of {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _to(tree, device, dtype=None):
    """Tensors moved to ``device``; floating ones also cast to ``dtype`` when given."""
    if isinstance(tree, torch.Tensor):
        t = tree.to(device)
        return t.to(dtype) if dtype is not None and t.is_floating_point() else t
    if isinstance(tree, dict):
        return {k: _to(v, device, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return type(tree)(_to(v, device, dtype) for v in tree)
    return tree


def _floating_leaves(out):
    return [t for t in zoo._leaves(out) if t.is_floating_point()]


def _loss(out, dtype):
    """The sum of each floating output times a fixed random tensor of its shape (every
    output gets a gradient; a plain sum would give ~0 through normalisations), computed
    outside autocast in ``dtype``. The tensors are drawn on the CPU from one seed, so
    every run (float64, eager, compiled) gets the same ones."""
    g = torch.Generator().manual_seed(7)
    return sum((t.to(dtype) * torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.device, dtype)).sum()
               for t in _floating_leaves(out))


def _model_dtype(model):
    return next(model.parameters()).dtype


def _step(call, model, args, kwargs, device, dtype, autocast):
    """Forward (under autocast when ``autocast``), loss, backward. Returns (the loss's
    dtype and the outputs' dtypes, {name: tensor compared}: each floating output, each
    parameter's gradient, each floating buffer after the step)."""
    ctx = torch.autocast(device, dtype) if autocast else contextlib.nullcontext()
    with ctx:
        out = call(*args, **kwargs)
    loss = _loss(out, torch.float64 if _model_dtype(model) is torch.float64 else torch.float32)
    loss.backward()
    leaves = _floating_leaves(out)
    dtypes = [loss.dtype] + [t.dtype for t in leaves]
    tensors = {f"output {i}": t.detach() for i, t in enumerate(leaves)}
    for n, p in model.named_parameters():
        tensors[f"grad {n}"] = None if p.grad is None else p.grad.detach()
    for n, b in model.named_buffers():
        if b.is_floating_point():
            tensors[f"buffer {n}"] = b.detach()
    return dtypes, tensors


#: a float64 tensor this small against its group's norm is zero up to float64's rounding
_ZERO64 = 2.0 ** -40


def _err(t, ref, zero_scale=0.0):
    """||t - ref|| / ||ref||; where ``ref`` is zero up to float64's rounding (a bias
    before a batch norm over two values: its gradient is zero, computed as ~1e-17),
    over ``zero_scale`` instead: the norm of its group (all outputs or all gradients),
    so that rounding noise is small and a real value is not."""
    num = torch.linalg.vector_norm(t.double() - ref.double()).item()
    den = _den(ref, zero_scale)
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _den(ref, zero_scale) -> float:
    """What ``_err`` divides by."""
    den = torch.linalg.vector_norm(ref.double()).item()
    return zero_scale if den <= _ZERO64 * zero_scale else den


def _norm(tensors: dict, prefix: str) -> float:
    return math.sqrt(sum(torch.linalg.vector_norm(t.double()).item() ** 2
                         for n, t in tensors.items() if n.startswith(prefix) and t is not None))


def _group_err(tensors: dict, ref: dict, prefix: str, base: dict | None = None) -> float:
    """The tensors named ``prefix ...`` as one vector: ||t - t64|| / ||t64||; with
    ``base``, ||t - t64|| / ||base - t64||."""
    num = den = 0.0
    for name, r in ref.items():
        if name.startswith(prefix) and r is not None:
            num += torch.linalg.vector_norm(tensors[name].double() - r.double()).item() ** 2
            d = r.double() if base is None else base[name].double() - r.double()
            den += torch.linalg.vector_norm(d).item() ** 2
    return math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else math.inf)


#: the rules over groups of tensors: (name in the row, prefix of the tensors' names)
_GROUPS = (("outputs", "output "), ("grads", "grad "))


def _strides(t):
    """The strides that address memory (those of size-1 dims do not)."""
    return tuple(st for n, st in zip(t.shape, t.stride()) if n > 1)


def compare(eager: dict, comp: dict, ref: dict, factor: float, floor: float,
            tensor_factor: float) -> dict:
    """The rules of the module docstring. Returns eager's and the compiled step's error
    for each group (``outputs_eager``, ``outputs_compiled``, ``grads_...``) and for the
    worst tensor (``tensor_...``), each rule's score (its error over its bound; ok when
    <= 1), the worst rule or tensor, and the first dtype or presence mismatch
    (``mismatch``), if any."""
    res = {"mismatch": "", "worst": "", "score": 0.0}
    for name, r in ref.items():
        e, c = eager[name], comp.get(name)
        if (e is None) != (c is None):
            res["mismatch"] = f"{name}: {'missing' if c is None else 'present'} compiled"
        elif e is not None and (c.dtype != e.dtype or c.shape != e.shape):
            res["mismatch"] = f"{name}: {c.dtype}{tuple(c.shape)} vs eager's {e.dtype}{tuple(e.shape)}"
        elif e is not None and name.startswith("output ") and _strides(c) != _strides(e):
            res["mismatch"] = f"{name}: strides {c.stride()} vs eager's {e.stride()}"
        if res["mismatch"]:
            return res
    for group, prefix in _GROUPS:
        ge, gc = _group_err(eager, ref, prefix), _group_err(comp, ref, prefix)
        res.update({f"{group}_eager": ge, f"{group}_compiled": gc,
                    f"{group}_score": gc / (factor * ge + floor),
                    f"{group}_vs_eager": _group_err(comp, eager, prefix, ref)})
    res["tensor_score"] = 0.0
    scales = {prefix: _norm(ref, prefix) for prefix in ("output ", "grad ", "buffer ")}
    for name, r in ref.items():
        if r is None:
            continue
        zero_scale = scales[name.split(" ")[0] + " "]
        ee, ec = _err(eager[name], r, zero_scale), _err(comp[name], r, zero_scale)
        if ee >= 1 and zero_scale > 0:     # eager's value is noise: the floor at the group's scale
            den = _den(r, zero_scale)
            score = ec * den / (tensor_factor * ee * den + floor * zero_scale)
        else:
            score = ec / (tensor_factor * ee + floor)
        if not score <= res["tensor_score"]:      # NaN counts as worse
            res.update(tensor_score=score, tensor=name, tensor_eager=ee, tensor_compiled=ec)
    for rule in ("outputs", "grads", "tensor"):
        if not res[f"{rule}_score"] <= res["score"]:
            res["score"], res["worst"] = res[f"{rule}_score"], res.get(rule, rule)
    return res


def check(spec, device: str, autocast: str, backend: str, factor: float, floor: float,
          tensor_factor: float, inner: bool = False) -> dict:
    """One model's row (raises on a crash; ``run`` turns that into a FAIL row)."""
    dtype = _DTYPES[autocast]
    kiln.reset()
    torch.manual_seed(0)
    base = zoo._zero_randomness(spec.build()).train()
    m64 = copy.deepcopy(base).to(device=device, dtype=torch.float64)
    me = copy.deepcopy(base).to(device)
    mc = copy.deepcopy(base).to(device)
    del base
    args, kwargs = spec.inputs(5)
    a64, k64 = _to((args, kwargs), device, torch.float64)
    a32, k32 = _to((args, kwargs), device, torch.float32)
    _, ref = _step(m64, m64, a64, k64, device, dtype, autocast=False)
    del m64
    e_dtypes, eager = _step(me, me, a32, k32, device, dtype, autocast=True)
    del me
    prof = kiln.CompileProfiler(backend=backend)
    if inner:   # autocast entered and left inside the compiled function
        def fwd(*a, **k):
            with torch.autocast(device, dtype):
                return mc(*a, **k)
        call, outer = kiln.compile(fwd, backend=prof), False
    else:       # the compiled model called under autocast
        call, outer = kiln.compile(mc, backend=prof), True
    c_dtypes, comp = _step(call, mc, a32, k32, device, dtype, autocast=outer)
    res = compare(eager, comp, ref, factor, floor, tensor_factor)
    if c_dtypes != e_dtypes and not res["mismatch"]:
        res["mismatch"] = f"loss and output dtypes {c_dtypes} vs eager's {e_dtypes}"
    metrics = prof.get_metrics()
    res.update(graphs=metrics["graphs"], breaks=metrics["graph_breaks"],
               eager_graphs=metrics["graph_fallbacks"], frames_eager=metrics["frames_run_eagerly"])
    if prof.breaks:
        b = prof.breaks[0]
        res["first_break"] = f"[{b.break_id}] {b.reason}"[:200]
    res["ok"] = not res["mismatch"] and res["score"] <= 1.0
    kiln.reset()
    return res


def _short(e: BaseException, n=160) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"[:n]


def _available(spec) -> bool:
    mod = spec.family if spec.family in ("timm", "transformers") else "torchvision"
    try:
        __import__(mod)
        return True
    except ImportError:
        return False


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['model']:34s} FAIL  {r['error']}  {r['seconds']:.1f}s"
    status = "ok  " if r["ok"] else "FAIL"
    head = (f"{r['model']:34s} {status}  graphs {r['graphs']:2d} breaks {r['breaks']:2d} "
            f"eager-run {r['eager_graphs']:d}")
    if r["mismatch"]:
        return f"{head}  {r['mismatch']}  {r['seconds']:.1f}s"
    return (f"{head}  outputs {r['outputs_eager']:.1e}/{r['outputs_compiled']:.1e}  grads "
            f"{r['grads_eager']:.1e}/{r['grads_compiled']:.1e} (to eager {r['grads_vs_eager']:.1e})  "
            f"score {r['score']:.2f} "
            f"({r['worst'][:36]})  {r['seconds']:.1f}s")


@contextlib.contextmanager
def _kiln_strict():
    """kiln's internal errors raise (a FAIL row) instead of running the frame eagerly,
    which would compare eager with itself; the perf fallback is off, so that the step
    checked runs kiln's kernels, not PyTorch running the aten graph in a timing trial."""
    old = kiln.config.suppress_errors, kiln.config.perf_fallback
    kiln.config.suppress_errors, kiln.config.perf_fallback = False, False
    try:
        yield
    finally:
        kiln.config.suppress_errors, kiln.config.perf_fallback = old


#: errors after which the process's CUDA context is unusable
_CUDA_FATAL = ("illegal memory access", "device-side assert", "unspecified launch failure",
               "CUDA error: misaligned address")


def run(specs, a, log=print) -> list[dict]:
    """Every spec in turn: a row each (FAIL with the error on a crash or timeout,
    ``skipped`` once the budget is spent)."""
    with _kiln_strict():
        return _run(specs, a, log)


def _run(specs, a, log) -> list[dict]:
    rows, t_start, lost = [], time.perf_counter(), None
    floor = a.floor if a.floor is not None else _FLOORS[a.autocast]
    for spec in specs:
        row = {"model": spec.name, "family": spec.family}
        resume = next((r["model"] for r in rows if "skipped" in r and "--start" in r["skipped"]), spec.name)
        if lost:
            row["skipped"] = f"the CUDA context was lost at {lost} (go on with --start {resume})"
        elif a.budget_s and time.perf_counter() - t_start > a.budget_s:
            row["skipped"] = f"budget of {a.budget_s:g} s spent (go on with --start {resume})"
        elif not _available(spec):
            row["skipped"] = f"{spec.family} not installed"
        elif not spec.train:
            row["skipped"] = "no training step in the zoo"
        if "skipped" in row:
            rows.append(row)
            log(f"{spec.name:34s} skipped: {row['skipped']}", flush=True)
            continue
        t0 = time.perf_counter()
        try:
            with deadline(a.timeout_s):
                row.update(check(spec, a.device, a.autocast, a.backend, a.factor, floor,
                                     a.tensor_factor, a.inner))
        except (Exception, ModelTimeout) as e:  # noqa: BLE001 -- a crash is this model's FAIL row
            row["ok"] = False
            row["error"] = _short(e)
            if a.device == "cuda" and any(m in str(e) for m in _CUDA_FATAL):
                lost = spec.name      # every later CUDA call in this process would fail
            with contextlib.suppress(Exception):
                kiln.reset()
        row["seconds"] = round(time.perf_counter() - t0, 2)
        if a.device == "cuda":
            with contextlib.suppress(Exception):
                torch.cuda.empty_cache()
        rows.append(row)
        log(_line(row), flush=True)
    return rows


def summary(rows, a, seconds) -> str:
    done = [r for r in rows if "skipped" not in r]
    ok = sum(bool(r.get("ok")) for r in done)
    fails = [r["model"] for r in done if not r.get("ok")]
    skipped = [r["model"] for r in rows if "skipped" in r]
    one_graph = sum(r.get("graphs") == 1 and r.get("breaks") == 0 for r in done)
    return (f"{ok}/{len(done)} models ok ({a.backend}, autocast {a.autocast}, {a.device}, "
            f"{'inner' if a.inner else 'outer'} autocast); {one_graph} in one graph without breaks; "
            f"FAIL: {fails}; skipped: {len(skipped)} {skipped[:10]}; {seconds:.0f} s")


def parse(argv=None):
    p = argparse.ArgumentParser(prog="python -m tests.models.zoo_autocast", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--autocast", choices=list(_DTYPES), default="bf16")
    p.add_argument("--backend", default="kiln", help="kiln backend compiling the graphs")
    p.add_argument("--only", default="", help="comma-separated substrings of model names (tv., hf.bert...)")
    p.add_argument("--start", default="", help="begin at this model (its full name), in zoo order")
    p.add_argument("--inner", action="store_true",
                   help="enter autocast inside the compiled function (default: around the compiled model)")
    p.add_argument("--factor", type=float, default=2.0, help="the outputs and gradients rules")
    p.add_argument("--tensor-factor", type=float, default=8.0, help="the per-tensor rule")
    p.add_argument("--floor", type=float, default=None, help="default: 2^-8 (bf16), 2^-11 (fp16)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per model (0: none)")
    p.add_argument("--budget-s", type=float, default=450.0, help="start no model after this (0: none)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--out", default="", help="also write the rows here (JSON)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no GPU visible", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    only = [s for s in a.only.split(",") if s]
    specs = [s for s in zoo.REGISTRY if not only or any(o in s.name for o in only)]
    if a.start:
        names = [s.name for s in specs]
        if a.start not in names:
            print(f"--start {a.start}: not among the selected models", file=sys.stderr)
            return 2
        specs = specs[names.index(a.start):]
    print(f"# {len(specs)} models, {a.backend}, autocast {a.autocast} on {a.device}", flush=True)
    t0 = time.perf_counter()
    rows = run(specs, a)
    text = summary(rows, a, time.perf_counter() - t0)
    print(text, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "summary": text, "rows": rows}, f, indent=1)
    done = [r for r in rows if "skipped" not in r]
    return 0 if done and all(r.get("ok") for r in done) else 1


if __name__ == "__main__":
    sys.exit(main())
