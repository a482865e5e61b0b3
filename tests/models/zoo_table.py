"""``python -m tests.models.zoo_table [-k SUBSTR] [--family F] [--out FILE] [--eval-only]``

Runs the model zoo (``tests/models/zoo.py``) and prints the markdown table of issue 6:
model, family, graphs, breaks, ops (from ``kiln.explain`` on the eval model), capture
seconds (the eval trace on the eager backend), and whether the compiled model matches
eager with ``fullgraph=True`` on the eager and aot_eager backends (eval outputs and one
training step's loss, gradients and buffers).  Where ``fullgraph=True`` fails, the model
is checked again without it, so the column says whether the graph-broken model is still
correct.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

os.environ.setdefault("KILN_SUPPRESS_ERRORS", "0")

import torch  # noqa: E402

import kiln  # noqa: E402
from tests.models import zoo  # noqa: E402


def _short(e: BaseException, n=110) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    msg = f"{type(e).__name__}: {msg}"
    msg = msg.replace("|", "\\|")
    return msg if len(msg) <= n else msg[: n - 1] + "…"


def _correct(spec, backend, train):
    try:
        zoo.check_model(spec, backend, fullgraph=True, train=train)
        return "yes", None
    except kiln.Unsupported as e:
        full_err = e
    except Exception as e:  # noqa: BLE001 -- reported in the table
        return "**no**", e
    try:
        zoo.check_model(spec, backend, fullgraph=False, train=train)
        return "yes (not one graph)", full_err
    except Exception as e:  # noqa: BLE001
        return "**no**", e


def run(specs, train=True, verbose=False):
    rows, notes = [], []
    for spec in specs:
        t0 = time.perf_counter()
        row = {"model": spec.name, "family": spec.family}
        try:
            ex, dt = zoo.explain_model(spec)
            row.update(graphs=ex.graph_count, breaks=ex.graph_break_count, ops=ex.op_count, capture=f"{dt:.2f}")
            if ex.break_reasons:
                r = ex.break_reasons[0]
                where = r.user_stack[-1] if r.user_stack else ""
                notes.append(f"{spec.name}: first break: {r.reason} at {where}".replace("|", "\\|"))
        except Exception as e:  # noqa: BLE001
            row.update(graphs="-", breaks="-", ops="-", capture="-")
            notes.append(f"{spec.name}: explain failed: {_short(e, 300)}")
            if verbose:
                traceback.print_exc()
        for backend in ("eager", "aot_eager"):
            ok, err = _correct(spec, backend, train)
            row[backend] = ok
            if err is not None:
                notes.append(f"{spec.name} [{backend}]: {_short(err, 300)}")
                if verbose:
                    traceback.print_exception(err)
        if spec.xfail:
            notes.append(f"{spec.name}: marked xfail in test_zoo: {spec.xfail}")
        rows.append(row)
        print(f"# {spec.name}: {row} ({time.perf_counter() - t0:.1f}s)", file=sys.stderr, flush=True)
    return rows, notes


def markdown(rows, notes):
    head = "| model | family | graphs | breaks | ops | capture s | correct (eager) | correct (aot_eager) |"
    lines = [head, "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['model']} | {r['family']} | {r['graphs']} | {r['breaks']} | {r['ops']} | "
                     f"{r['capture']} | {r['eager']} | {r['aot_eager']} |")
    if notes:
        lines.append("")
        lines += [f"- {n}" for n in notes]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-k", default=None, help="only models whose name contains this")
    p.add_argument("--family", default=None)
    p.add_argument("--out", default=None, help="also write the table to this file")
    p.add_argument("--eval-only", action="store_true", help="skip the training-step comparison")
    p.add_argument("-v", action="store_true", help="print tracebacks")
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    specs = [s for s in zoo.REGISTRY if (a.k is None or a.k in s.name) and (a.family is None or s.family == a.family)]
    t0 = time.perf_counter()
    rows, notes = run(specs, train=not a.eval_only, verbose=a.v)
    text = markdown(rows, notes)
    text += f"\n\n{len(rows)} models in {time.perf_counter() - t0:.0f} s.\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
