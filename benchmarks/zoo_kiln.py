"""The model zoo through the ``kiln`` backend (C++ kernels on the CPU): correctness and
the share of each graph's ops that fall back to aten, and the largest normwise error
(the rtol a compared tensor needed: (max|kiln - eager| - atol) / max|eager|).

Every zoo model (``tests/models/zoo.py``) is compiled with ``backend="kiln"`` and checked
by the zoo's own ``check_model`` — float64, eval outputs on two calls and a training
step's loss, gradients and buffers against eager, normwise tolerances. Each aten graph the
kernel compiler receives is counted: its ops (call_function nodes, ``getitem`` aside) and
those that fell back to aten (library calls — matmul, convolution, attention — are not
fallbacks). The issue's bar: at most 2% of a graph's ops fall back.

    .venv/bin/python -m benchmarks.zoo_kiln [--only resnet18,bert] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import collections
import time
import traceback


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated substrings of model names")
    ap.add_argument("--out", default="", help="also write the table here (markdown)")
    ap.add_argument("-v", action="store_true", help="print each failure's traceback")
    args = ap.parse_args(argv)
    import torch

    from tests.models import zoo

    torch.set_num_threads(2)
    only = [s for s in args.only.split(",") if s]
    rows, by_op = [], collections.Counter()
    for spec in zoo.REGISTRY:
        if only and not any(s in spec.name for s in only):
            continue
        if spec.family in ("timm", "transformers"):
            try:
                __import__(spec.family)
            except ImportError:
                continue
        t0 = time.perf_counter()
        try:
            with zoo.kernel_graphs() as seen:
                zoo.check_model(spec, "kiln", fullgraph=True)
            status = "ok"
        except Exception as e:          # noqa: BLE001  (reported per model)
            status = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
            if args.v:
                traceback.print_exc()
        worst = max((len(f) / max(o, 1) for o, f in seen), default=0.0)
        err = zoo._worst[0]             # largest normwise error compared (also on failure)
        for _, f in seen:
            by_op.update(f)
        rows.append((spec.name, status, len(seen), sum(o for o, _ in seen),
                     sum(len(f) for _, f in seen), worst, time.perf_counter() - t0, err))
        r = rows[-1]
        print(f"{r[0]:28s} {r[1][:60]:60s} graphs {r[2]} ops {r[3]:5d} fallbacks {r[4]:3d} "
              f"worst graph {100 * r[5]:.1f}% error {r[7]:.1e}  {r[6]:.0f}s", flush=True)
    lines = ["| model | result | graphs | ops | fallbacks | worst graph | largest error |",
             "|---|---|---|---|---|---|---|"]
    for name, status, g, o, f, w, _, e in rows:
        lines.append(f"| {name} | {status} | {g} | {o} | {f} | {100 * w:.1f}% | {e:.1e} |")
    ok = sum(r[1] == "ok" for r in rows)
    total_ops, total_fb = sum(r[3] for r in rows), sum(r[4] for r in rows)
    summary = (f"{ok}/{len(rows)} models correct; {total_fb} of {total_ops} ops fall back "
               f"({100 * total_fb / max(total_ops, 1):.2f}%); worst graph "
               f"{100 * max((r[5] for r in rows), default=0):.1f}%; over 2%: "
               f"{[r[0] for r in rows if r[5] > 0.02]}")
    lines += ["", summary, "", "Fallback ops: " + ", ".join(f"{k} ×{v}" for k, v in by_op.most_common())]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
