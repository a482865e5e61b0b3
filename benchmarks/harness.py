"""The benchmark loop: every workload under every backend, in this one process.

One cell (workload × backend) goes: build a fresh instance → point the backend's
on-disk caches at a fresh directory → compile and time the first call (cold) → check
the result (and for training the gradients) against eager's → warm up and time ≥30
calls → count graphs and breaks. Any exception becomes the cell's ``error`` and the
loop moves on. With ``interleave_rounds``, each workload's cells stay alive until all
its backends are done and are then timed again in interleaved rounds (``interleave``),
whose pooled median is the figure reported. Warm-cache compile times come afterwards from a second process per
backend (benchmarks/warm.py) reusing the cells' cache directories.
"""
from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field

import torch

from benchmarks import ceilings
from benchmarks.backends import make_backend
from benchmarks.measure import (PeakMemory, clone_out, grad_errors, grads_of, median, scaled_error,
                                sync, time_calls, time_first_call)
from benchmarks.workloads import DTYPE_NAMES, Instance, Workload

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Options:
    device: str = "cpu"
    #: names for make_backend, or backend objects (tests pass their own)
    backends: list = field(default_factory=lambda: ["eager", "torch.compile"])
    quick: bool = False
    min_runs: int = 30
    max_runs: int = 300
    #: aim for about this many seconds of timed calls per cell (never fewer than min_runs)
    target_s: float = 1.0
    warmup: int = 3
    #: after each workload's cells, time every backend again in this many interleaved
    #: rounds and report the pooled median (0: the sequential figures only)
    interleave_rounds: int = 0
    warm_compile: bool = True
    #: stop starting new cells after this many seconds (0: no limit); warm-cache
    #: measurements get what is left of it
    budget_s: float = 0.0
    #: the part of the budget kept back for the warm-cache subprocesses
    warm_share: float = 0.3
    keep_cache: bool = False
    log: object = print


def short_error(e: BaseException) -> str:
    msg = f"{type(e).__name__}: {e}".strip()
    msg = msg.splitlines()[0] if msg else type(e).__name__
    return msg[:300]


def _no_grad_if(infer: bool):
    return torch.no_grad() if infer else contextlib.nullcontext()


def make_train_step(compiled, inst: Instance):
    """One training step: compiled forward+loss, eager backward, eager optimizer step."""
    opt = torch.optim.SGD(inst.model.parameters(), lr=1e-3, momentum=0.9)

    def step(i):
        loss = compiled(*inst.inputs[i])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, opt


def first_call(compiled, inst: Instance, mode: str, device: str):
    """Time the first call (where compilation happens). Returns (seconds, outputs to
    check): the output for inference; (loss, gradients) for training, taken before the
    optimizer has stepped. Training's first call includes the backward, where a
    backend may compile the backward graph."""
    if mode == "infer":
        with torch.no_grad():
            t, out = time_first_call(lambda: compiled(*inst.inputs[0]), device)
        return t, clone_out(out)

    def fwd_bwd():
        loss = compiled(*inst.inputs[0])
        loss.backward()
        return loss

    t, loss = time_first_call(fwd_bwd, device)
    return t, (loss.detach().clone(), grads_of(inst.model))


def reference(w: Workload, device: str):
    """Eager's answer on input set 0 from a fresh instance (the same seeded weights)."""
    inst = w.build(device)
    _, ref = first_call(inst.fn, inst, w.mode, device)
    del inst
    return ref


def _compare(w: Workload, got, ref, cell: dict) -> None:
    if w.mode == "infer":
        cell["max_err"] = scaled_error(got, ref)
    else:
        cell["loss_err"] = scaled_error(got[0], ref[0])
        cell["grad_err"], cell["grad_err_param"] = grad_errors(got[1], ref[1])
        cell["max_err"] = max(cell["loss_err"], cell["grad_err"])
    cell["tol"] = w.tol
    cell["match"] = bool(cell["max_err"] <= w.tol)


def _throughput(w: Workload, cell: dict, ceil: dict) -> None:
    t = cell.get("median_ms")
    if not t:
        return
    t = t / 1e3
    if w.bytes_moved and ceil.get("copy_GBps"):
        gbps = w.bytes_moved / t / 1e9
        cell["GBps"] = gbps
        cell["frac_copy_bw"] = gbps / ceil["copy_GBps"]
    if w.flops:
        tf = w.flops / t / 1e12
        cell["TFLOPs"] = tf
        peak = ceil.get("matmul_TFLOPs", {}).get(DTYPE_NAMES.get(w.dtype, ""))
        if peak:
            cell["frac_matmul_peak"] = tf / peak


def _cleanup(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


@dataclass
class LiveCell:
    """A cell whose compiled callable is still alive after its own timing, so that the
    interleaved phase can time it again beside the other backends."""
    cell: dict
    backend: object
    inst: object
    compiled: object
    step: object
    runs: int


def run_cell(w: Workload, backend, opts: Options, cache_dir: str, ref, explain_cache: dict,
             ceil: dict) -> dict:
    """One cell from start to end (built, compiled, checked, timed, explained, freed)."""
    cell, live = open_cell(w, backend, opts, cache_dir, ref, ceil)
    close_cell(w, backend, cell, live, explain_cache)
    return cell


def open_cell(w: Workload, backend, opts: Options, cache_dir: str, ref, ceil: dict,
              others_bytes: int = 0) -> tuple:
    """Build, compile, check and time one cell; returns (cell, LiveCell or None when it
    failed). ``others_bytes``: GPU memory held by other live cells, left out of this
    cell's peak."""
    cell = {"workload": w.key, "name": w.name, "suite": w.suite, "mode": w.mode,
            "dtype": DTYPE_NAMES.get(w.dtype, str(w.dtype)), "backend": backend.name}
    phase = "build"
    inst = compiled = None
    try:
        _safe(backend.reset)
        inst = w.build(opts.device)
        phase = "compile"
        backend.use_cache_dir(cache_dir)
        compiled = backend.compile(inst.fn)
        phase = "first call"
        cold, got = first_call(compiled, inst, w.mode, opts.device)
        cell["cold_compile_s"] = cold
        cell["cache_dir"] = cache_dir
        _compare(w, got, ref, cell)
        del got
        settle = getattr(backend, "settle", None)
        if settle is not None:           # kernels compiled in the background: time the
            phase = "background compile"  # steady state, and check it too
            t0 = time.perf_counter()
            if settle():
                cell["background_compile_s"] = time.perf_counter() - t0
                first = dict(cell)
                _, got = first_call(compiled, inst, w.mode, opts.device)
                _compare(w, got, ref, cell)
                del got
                cell["max_err"] = max(cell["max_err"], first["max_err"])
                cell["match"] = cell["match"] and first["match"]
        phase = "timed calls"
        if w.mode == "infer":
            def step(i):
                with torch.no_grad():
                    return compiled(*inst.inputs[i])
        else:
            inst.model.zero_grad(set_to_none=True)
            step, _ = make_train_step(compiled, inst)
        runs = _choose_runs(step, len(inst.inputs), opts)
        with PeakMemory(opts.device) as mem:
            warmup = opts.warmup + (backend.trial_calls() if hasattr(backend, "trial_calls") else 0)
            times = time_calls(step, len(inst.inputs), opts.device, runs=runs, warmup=warmup)
        cell["runs"] = len(times)
        cell["median_ms"] = median(times) * 1e3
        cell["min_ms"] = min(times) * 1e3
        cell["peak_mem_MB"] = None if mem.peak is None else (mem.peak - others_bytes) / 2**20
        _throughput(w, cell, ceil)
        return cell, LiveCell(cell, backend, inst, compiled, step, runs)
    except Exception as e:  # noqa: BLE001 — any backend failure is data, not a crash
        cell["error"] = short_error(e)
        cell["error_phase"] = phase
        cell["traceback"] = traceback.format_exc(limit=-8)
        return cell, LiveCell(cell, backend, inst, None, None, 0) if inst is not None else None


def close_cell(w: Workload, backend, cell: dict, live, explain_cache: dict) -> None:
    """Count graphs and breaks (kiln's three backends share one capture, so explain
    once), then free the cell's instance and reset its backend."""
    inst = live.inst if live is not None else None
    if live is not None:
        live.compiled = live.step = None
    if backend.family != "eager" and inst is not None:
        shared_key = (backend.family, w.key) if backend.family == "kiln" else None
        if shared_key in explain_cache:
            cell.update(explain_cache[shared_key])
        else:
            found = {}
            try:
                _safe(backend.reset)
                with _no_grad_if(w.mode == "infer"):
                    ex = backend.explain(inst.fn, inst.inputs[0])
                found = {"graph_count": ex.graph_count, "graph_break_count": ex.graph_break_count}
            except Exception as e:  # noqa: BLE001
                found = {"explain_error": short_error(e)}
            cell.update(found)
            if shared_key is not None:
                explain_cache[shared_key] = found
    if live is not None:
        live.inst = None
    del inst
    _safe(backend.reset)


def interleave(w: Workload, live: list, opts: Options, ceil: dict) -> None:
    """Time the live cells again in ``opts.interleave_rounds`` rounds, each round every
    backend in turn (the order rotated, and reversed every other round), and make the
    pooled median the cell's figure. A GPU's clock follows its power and temperature,
    which drift over seconds: timed one after another, the backend timed first (on a
    cool chip) is favoured; interleaved, all see the same conditions. Each block starts
    after a ``gc.collect()``, so that one backend's garbage is not collected in another's
    time. The sequential
    median stays as ``sequential_median_ms``, each round's as ``round_medians_ms``."""
    rounds = opts.interleave_rounds
    pooled = {id(lc): [] for lc in live}
    per_round = {id(lc): [] for lc in live}
    for r in range(rounds):
        order = live[r % len(live):] + live[:r % len(live)]
        if r % 2:
            order.reverse()
        for lc in order:
            n = len(lc.inst.inputs)
            gc.collect()   # another backend's garbage is not this one's cost
            times = time_calls(lc.step, n, opts.device, runs=max(1, math.ceil(lc.runs / rounds)),
                               warmup=1)
            pooled[id(lc)] += times
            per_round[id(lc)].append(median(times) * 1e3)
    for lc in live:
        c, times = lc.cell, pooled[id(lc)]
        c["sequential_median_ms"] = c["median_ms"]
        c["median_ms"] = median(times) * 1e3
        c["min_ms"] = min(c["min_ms"], min(times) * 1e3)
        c["runs"] = len(times)
        c["round_medians_ms"] = per_round[id(lc)]
        c["timing"] = f"interleaved, {rounds} rounds"
        _throughput(w, c, ceil)


def _allocated(device: str) -> int:
    return torch.cuda.memory_allocated() if device == "cuda" else 0


def _choose_runs(step, n_inputs: int, opts: Options) -> int:
    """≥ min_runs, and more for fast cells, so each cell times about target_s seconds."""
    if opts.quick:
        return opts.min_runs
    sync(opts.device)
    t0 = time.perf_counter()
    for i in range(n_inputs):
        step(i)
    sync(opts.device)
    est = (time.perf_counter() - t0) / n_inputs
    return int(max(opts.min_runs, min(opts.max_runs, opts.target_s / max(est, 1e-7))))


def _safe(f):
    try:
        f()
    except Exception:  # noqa: BLE001
        pass


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


def run(workloads: list[Workload], opts: Options) -> dict:
    """Run every cell; returns the JSON-ready result (meta, ceilings, cells, skipped)."""
    t_start = time.monotonic()
    log = opts.log
    backends = [make_backend(b) if isinstance(b, str) else b for b in opts.backends]
    cache_root = tempfile.mkdtemp(prefix="kiln-bench-cache-")
    result = {"meta": _meta(opts), "ceilings": {}, "cells": [], "skipped": []}
    try:
        result["ceilings"] = ceilings.measure(opts.device, opts.quick)
    except Exception as e:  # noqa: BLE001
        result["ceilings"] = {"error": short_error(e)}
    log(f"ceilings: {json.dumps(result['ceilings'])}")
    main_budget = opts.budget_s * (1 - opts.warm_share) if opts.warm_compile else opts.budget_s
    explain_cache: dict = {}
    for w in workloads:
        missing = w.missing()
        if missing:
            result["skipped"].append({"workload": w.key, "reason": f"missing package(s): {', '.join(missing)}"})
            log(f"skip {w.key}: missing {', '.join(missing)}")
            continue
        if opts.budget_s and time.monotonic() - t_start > main_budget:
            result["skipped"].append({"workload": w.key, "reason": "time budget spent"})
            log(f"skip {w.key}: time budget spent")
            continue
        try:
            ref = reference(w, opts.device)
        except Exception as e:  # noqa: BLE001 — eager itself failed: nothing to compare with
            result["skipped"].append({"workload": w.key, "reason": f"eager reference failed: {short_error(e)}"})
            log(f"skip {w.key}: eager failed: {short_error(e)}")
            continue
        cells, live = [], []
        base = _allocated(opts.device)
        for b in backends:
            if opts.budget_s and time.monotonic() - t_start > main_budget:
                result["skipped"].append({"workload": w.key, "backend": b.name,
                                          "reason": "time budget spent"})
                continue
            for lc in [lc for lc in live if lc.backend.family == b.family]:
                live.remove(lc)   # opening b resets the family's state: the earlier
                                  # cell keeps its sequential figure
                close_cell(w, lc.backend, lc.cell, lc, explain_cache)
            cache_dir = os.path.join(cache_root, _slug(b.name), _slug(w.key))
            os.makedirs(cache_dir, exist_ok=True)
            t0 = time.monotonic()
            cell, lc = open_cell(w, b, opts, cache_dir, ref, result["ceilings"],
                                 others_bytes=_allocated(opts.device) - base)
            if opts.interleave_rounds and lc is not None and lc.step is not None:
                live.append(lc)
            else:
                close_cell(w, b, cell, lc, explain_cache)
                _cleanup(opts.device)
            cell["cell_wall_s"] = time.monotonic() - t0
            cells.append(cell)
            log(_one_line(cell, cell["cell_wall_s"]))
        if len(live) > 1:
            try:
                interleave(w, live, opts, result["ceilings"])
                log("interleaved: " + ", ".join(f"{lc.backend.name} {lc.cell['median_ms']:.3f} ms"
                                                for lc in live))
            except Exception as e:  # noqa: BLE001 — keep the sequential figures
                log(f"interleaved timing failed ({short_error(e)}): sequential figures kept")
        for lc in live:
            close_cell(w, lc.backend, lc.cell, lc, explain_cache)
        live = []
        eager_ms = next((c.get("median_ms") for c in cells if c["backend"] == "eager"), None)
        for cell in cells:
            if eager_ms and cell.get("median_ms"):
                cell["speedup"] = eager_ms / cell["median_ms"]
            result["cells"].append(cell)
        del ref
        _cleanup(opts.device)
    if opts.warm_compile:
        _warm_phase(result, backends, opts, t_start)
    result["meta"]["wall_s"] = time.monotonic() - t_start
    if not opts.keep_cache:
        shutil.rmtree(cache_root, ignore_errors=True)
    else:
        result["meta"]["cache_root"] = cache_root
    return result


def _one_line(cell: dict, wall: float) -> str:
    if "error" in cell:
        what = f"ERROR ({cell['error_phase']}): {cell['error'][:120]}"
    else:
        what = (f"{cell['median_ms']:.3f} ms  cold {cell['cold_compile_s']:.2f}s  "
                f"err {cell['max_err']:.1e} {'ok' if cell['match'] else 'MISMATCH'}")
    return f"{cell['workload']:<34} {cell['backend']:<16} {what}  [{wall:.1f}s]"


def _warm_phase(result: dict, backends, opts: Options, t_start: float) -> None:
    """Warm compile: one subprocess per compiling backend times the first call of each
    of its successful cells, reusing the cell's on-disk cache directory."""
    compiling = [b for b in backends if b.family != "eager"]
    for k, b in enumerate(compiling):
        cells = [c for c in result["cells"] if c["backend"] == b.name and "cold_compile_s" in c]
        if not cells:
            continue
        try:
            make_backend(b.name)
        except ValueError:  # a backend object passed in (tests): a subprocess can't rebuild it
            for c in cells:
                c["warm_error"] = "backend has no name a subprocess can rebuild"
            continue
        timeout = None
        if opts.budget_s:
            # what is left, shared equally among the backends still to measure
            timeout = (opts.budget_s - (time.monotonic() - t_start)) / (len(compiling) - k)
            if timeout < 10:
                for c in cells:
                    c["warm_error"] = "time budget spent"
                continue
        spec = {"device": opts.device, "quick": opts.quick, "backend": b.name,
                "items": [{"workload": c["workload"], "cache_dir": c["cache_dir"]} for c in cells]}
        found = run_warm_subprocess(spec, timeout)
        for c in cells:
            r = found.get(c["workload"])
            if r is None:
                c["warm_error"] = "not measured (subprocess ended early)"
            elif "error" in r:
                c["warm_error"] = r["error"]
            else:
                c["warm_compile_s"] = r["warm_compile_s"]
        opts.log(f"warm compile ({b.name}): " + ", ".join(
            f"{c['workload']}={c.get('warm_compile_s', float('nan')):.2f}s" for c in cells))


def run_warm_subprocess(spec: dict, timeout: float | None) -> dict:
    """Run benchmarks.warm in a fresh interpreter; returns {workload key: record}.
    Records are streamed line by line, so a timeout keeps what was finished."""
    with tempfile.TemporaryDirectory(prefix="kiln-bench-warm-") as d:
        spec_path, out_path = os.path.join(d, "spec.json"), os.path.join(d, "out.jsonl")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        env = dict(os.environ)
        env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        try:
            subprocess.run([sys.executable, "-m", "benchmarks.warm", spec_path, out_path],
                           cwd=REPO_ROOT, env=env, timeout=timeout,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            pass
        found = {}
        if os.path.exists(out_path):
            with open(out_path) as f:
                for line in f:
                    with contextlib.suppress(ValueError):
                        r = json.loads(line)
                        found[r["workload"]] = r
        return found


def _meta(opts: Options) -> dict:
    import platform

    meta = {"device": opts.device, "torch": torch.__version__, "python": platform.python_version(),
            "backends": [b if isinstance(b, str) else b.name for b in opts.backends], "quick": opts.quick, "min_runs": opts.min_runs,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32, "load_avg_at_start": os.getloadavg()[0],
            "error_metric": "max|got-ref| / max|ref| per tensor, worst tensor; "
                            "training: loss and every parameter gradient after the first step"}
    if opts.device == "cuda":
        meta["gpu"] = torch.cuda.get_device_name()
    for pkg in ("triton", "torchvision", "transformers", "timm"):
        try:
            meta[pkg] = __import__(pkg).__version__
        except Exception:  # noqa: BLE001
            meta[pkg] = None
    return meta
