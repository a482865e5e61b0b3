"""Writing results: a text table, the JSON with every figure, a PNG of speedups."""
from __future__ import annotations

import json
import math
import os

COLUMNS = [  # (header, width, cell -> text)
    ("workload", 32, lambda c: c["workload"]),
    ("backend", 15, lambda c: c["backend"]),
    ("median ms", 10, lambda c: _f(c.get("median_ms"), "{:.3f}")),
    ("speedup", 7, lambda c: _f(c.get("speedup"), "{:.2f}x")),
    ("cold s", 7, lambda c: _f(c.get("cold_compile_s"), "{:.2f}")),
    ("warm s", 7, lambda c: _f(c.get("warm_compile_s"), "{:.2f}")),
    ("peak MB", 8, lambda c: _f(c.get("peak_mem_MB"), "{:.0f}")),
    ("graphs/breaks", 13, lambda c: _graphs(c)),
    ("err/tol", 16, lambda c: _acc(c)),
    ("%BW/%peak", 9, lambda c: _roof(c)),
    ("error", 60, lambda c: (f"[{c['error_phase']}] {c['error']}" if "error" in c else "")),
]


def _f(v, fmt):
    return "-" if v is None else fmt.format(v)


def _graphs(c):
    if "graph_count" in c:
        return f"{c['graph_count']}/{c['graph_break_count']}"
    return "err" if "explain_error" in c else "-"


def _acc(c):
    if "max_err" not in c:
        return "-"
    verdict = "ok" if c["match"] else "BAD"
    return f"{c['max_err']:.0e}/{c['tol']:.0e} {verdict}"


def _roof(c):
    if "frac_copy_bw" in c:
        return f"{100 * c['frac_copy_bw']:.0f}% bw"
    if "frac_matmul_peak" in c:
        return f"{100 * c['frac_matmul_peak']:.0f}% mm"
    return ""


def table(result: dict) -> str:
    lines = []
    m, ceil = result["meta"], result.get("ceilings", {})
    lines.append(f"device: {m['device']} {m.get('gpu', '')}  torch {m['torch']}  "
                 f"wall {m.get('wall_s', 0):.0f}s")
    if "copy_GBps" in ceil:
        mm = ", ".join(f"{k} {v:.2f}" for k, v in ceil.get("matmul_TFLOPs", {}).items())
        lines.append(f"ceilings: copy {ceil['copy_GBps']:.1f} GB/s (read+write); matmul TFLOP/s: {mm}")
    head = "  ".join(h.ljust(w) for h, w, _ in COLUMNS)
    lines += [head.rstrip(), "-" * len(head.rstrip())]
    for c in result["cells"]:
        row = "  ".join(str(get(c)).ljust(w)[: max(w, len(str(get(c))))] for _, w, get in COLUMNS)
        lines.append(row.rstrip()[:240])
    for s in result.get("skipped", []):
        lines.append(f"{s['workload']:<32}  {s.get('backend', '(all)'):<15}  skipped: {s['reason']}")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The same table in Markdown, for pasting into benchmarks/README.md."""
    heads = [h for h, _, _ in COLUMNS]
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for c in result["cells"]:
        out.append("| " + " | ".join(str(get(c)).replace("|", "/")[:80] for _, _, get in COLUMNS) + " |")
    for s in result.get("skipped", []):
        out.append(f"| {s['workload']} | {s.get('backend', '(all)')} | skipped: {s['reason']} |"
                   + " |" * (len(heads) - 3))
    return "\n".join(out)


def _jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(_jsonable(result), f, indent=1)


def chart(result: dict, path: str) -> str | None:
    """Grouped bars: one group per workload, one bar per backend, speedup over eager on
    a log axis. A cell without a speedup (error) gets a red 'x' at 1.0. Returns the
    path written, or None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return None
    cells = result["cells"]
    workloads = list(dict.fromkeys(c["workload"] for c in cells))
    backends = list(dict.fromkeys(c["backend"] for c in cells))
    if not workloads:
        return None
    by = {(c["workload"], c["backend"]): c for c in cells}
    width = 0.8 / max(1, len(backends))
    fig, ax = plt.subplots(figsize=(max(8, 0.6 * len(workloads) * max(1, len(backends)) / 2), 5))
    for j, b in enumerate(backends):
        xs, ys, bad = [], [], []
        for i, w in enumerate(workloads):
            c = by.get((w, b))
            x = i + (j - (len(backends) - 1) / 2) * width
            if c is not None and c.get("speedup"):
                xs.append(x)
                ys.append(c["speedup"])
            elif c is not None:
                bad.append(x)
        ax.bar(xs, ys, width, label=b)
        if bad:
            ax.plot(bad, [1.0] * len(bad), "x", color="red", markersize=5)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_ylabel("speedup over eager (log)")
    ax.set_xticks(range(len(workloads)))
    ax.set_xticklabels(workloads, rotation=60, ha="right", fontsize=7)
    m = result["meta"]
    ax.set_title(f"{m['device']} {m.get('gpu', '')} — red x: backend failed", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_all(result: dict, out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"json": os.path.join(out_dir, "results.json"),
             "table": os.path.join(out_dir, "table.txt"),
             "markdown": os.path.join(out_dir, "table.md"),
             "chart": os.path.join(out_dir, "speedups.png")}
    write_json(result, paths["json"])
    with open(paths["table"], "w") as f:
        f.write(table(result) + "\n")
    with open(paths["markdown"], "w") as f:
        f.write(markdown(result) + "\n")
    if chart(result, paths["chart"]) is None:
        paths.pop("chart")
    return paths
