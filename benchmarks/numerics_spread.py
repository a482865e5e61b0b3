"""The spread of ``numerics --zoo``'s measure over seeds, beside a control.

    python -m benchmarks.numerics_spread --only timm.skresnet18 [--inputs 5] [--weights 0,1]
        [--batch N] [--control channels_last|aot_eager|none]

One row of ``numerics --zoo`` is one draw: weight seed 0, input seed 0, batch 2. Where a
model's worst gradient is ill-conditioned (a normalisation over two samples, a gradient
that is zero by symmetry and so all rounding, a max-pool near-tie that routes a gradient
elsewhere), the ratio of two float32 errors measured from float64 swings from draw to
draw, and one row over 2x does not tell a systematic excess from noise. This prints,
per (weight seed, input seed), eager's and kiln's errors and their ratio, and the same
for a control: another valid float32 computation, which has no reason to be more or
less accurate than eager (``channels_last``: eager with the model and its images in
that memory format, other kernels and summation orders; ``aot_eager``: eager's kernels
run on kiln's traced graphs, kiln's op order without its kernels). Then the geometric
mean, min and max of each ratio over the draws. A systematic excess shows as kiln's
geometric mean well above 1 and above the control's.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from benchmarks.numerics import gradient_errors  # noqa: E402


def _gmean(v) -> float:
    return math.exp(sum(math.log(max(x, 1e-300)) for x in v) / len(v))


def spread(name, inputs, weights, control) -> list:
    """One line per draw, then the summary line."""
    runs = [("eager", None), ("kiln", "kiln")]
    if control != "none":
        runs.append((control, None if control == "eager" else control))
    lines, rk, rc = [], [], []
    for w in weights:
        for i in range(inputs):
            e = gradient_errors(name, runs, input_seed=i, weight_seed=w)
            rk.append(e["kiln"] / max(e["eager"], 1e-12))
            line = (f"| {name} | {w} | {i} | {e['eager']:.1e} | {e['kiln']:.1e} | "
                    f"{rk[-1]:.2f} |")
            if control != "none":
                rc.append(e[control] / max(e["eager"], 1e-12))
                line += f" {e[control]:.1e} | {rc[-1]:.2f} |"
            lines.append(line)
            print(line, flush=True)
    summary = (f"{name}: kiln/eager geomean {_gmean(rk):.2f} (min {min(rk):.2f}, max "
               f"{max(rk):.2f}) over {len(rk)} draws")
    if rc:
        summary += (f"; {control}/eager geomean {_gmean(rc):.2f} (min {min(rc):.2f}, max "
                    f"{max(rc):.2f})")
    lines.append(summary)
    print(summary, flush=True)
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", required=True, help="comma-separated zoo model names")
    p.add_argument("--inputs", type=int, default=5, help="input seeds 0..N-1")
    p.add_argument("--weights", default="0", help="comma-separated weight seeds")
    p.add_argument("--batch", type=int, default=0, help="the zoo's batch size (default 2)")
    p.add_argument("--control", default="channels_last",
                   choices=["channels_last", "aot_eager", "none"])
    p.add_argument("--out", default="")
    a = p.parse_args(argv)
    if a.batch:
        from tests.models import zoo
        zoo.BATCH = a.batch
    head = "| model | weight seed | input seed | eager | kiln | kiln/eager |"
    if a.control != "none":
        head += f" {a.control} | {a.control}/eager |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    print("\n".join(lines), flush=True)
    summaries = []
    for name in filter(None, a.only.split(",")):
        got = spread(name, a.inputs, [int(w) for w in a.weights.split(",")], a.control)
        lines += got[:-1]
        summaries.append(got[-1])
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(lines + [""] + summaries) + "\n")


if __name__ == "__main__":
    main()
