"""The campaign's summary: outcome counts per mode, kiln beside torch.compile, and the
most common kinds of difference and crash."""
from __future__ import annotations

import collections

from .runner import STATUSES, CaseResult

FAILURES = ("wrong", "crash", "segfault", "timeout")


def _row(name, results: list[CaseResult]) -> str:
    c = collections.Counter(r.status for r in results)
    ran = len(results) - c["skipped"]
    failed = sum(c[s] for s in FAILURES)
    rate = f"{100.0 * failed / ran:5.1f}%" if ran else "    -"
    return f"{name:<22}{len(results):>6}" + "".join(f"{c[s]:>9}" for s in STATUSES) + f"{rate:>8}"


def table(results: list[CaseResult], modes: list[str]) -> str:
    by_mode = collections.defaultdict(list)
    for r in results:
        by_mode[r.mode].append(r)
    head = f"{'mode':<22}{'cases':>6}" + "".join(f"{s:>9}" for s in STATUSES) + f"{'fail%':>8}"
    lines = [head, "-" * len(head)]
    lines += [_row(m, by_mode[m]) for m in modes if m in by_mode]
    return "\n".join(lines)


def side_by_side(results: list[CaseResult], pairs: list[tuple[str, str]]) -> str:
    """kiln modes beside their torch.compile peers, over the programs both ran."""
    status = {(r.seed, r.mode): r.status for r in results}
    lines = []
    for kiln_mode, torch_mode in pairs:
        seeds = sorted({s for s, m in status if m == torch_mode} & {s for s, m in status if m == kiln_mode})
        if not seeds:
            continue
        k = collections.Counter(status[(s, kiln_mode)] for s in seeds)
        t = collections.Counter(status[(s, torch_mode)] for s in seeds)
        fmt = lambda c: ", ".join(f"{s} {c[s]}" for s in FAILURES if c[s]) or "no failures"  # noqa: E731
        lines.append(f"{kiln_mode} vs {torch_mode} on {len(seeds)} programs: "
                     f"kiln {fmt(k)}  |  torch.compile {fmt(t)}")
    return "\n".join(lines)


def kinds(results: list[CaseResult], top: int = 12) -> str:
    """Per mode: the first difference of each failing case, grouped by where/facet, and
    crash messages grouped by their first line."""
    lines = []
    by_mode = collections.defaultdict(collections.Counter)
    for r in results:
        if r.status == "wrong" and r.mismatches:
            m = r.mismatches[0]
            by_mode[r.mode][f"wrong {m.where}/{m.facet}"] += 1
        elif r.status in ("crash", "segfault", "timeout"):
            first = (r.error.splitlines() or [""])[0][:90]
            by_mode[r.mode][f"{r.status} {first}"] += 1
    for mode, c in by_mode.items():
        lines.append(f"{mode}:")
        lines += [f"  {n:>4}  {k}" for k, n in c.most_common(top)]
    return "\n".join(lines)


def failing_seeds(results: list[CaseResult]) -> dict[str, list[int]]:
    out = collections.defaultdict(list)
    for r in results:
        if r.status in FAILURES:
            out[r.mode].append(r.seed)
    return dict(out)
