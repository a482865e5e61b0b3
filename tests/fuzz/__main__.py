"""``python -m tests.fuzz``: generate programs, run them eagerly and under each mode,
print the outcome table, write a reproducer for every failure.

    PYTHONPATH=. python -m tests.fuzz --seeds 0:200 --modes eager,aot_eager,kiln,train \\
        [--torch] [--torch-backend inductor] [--torch-seeds 0:50] [--out DIR] \\
        [--subprocess] [--jobs N] [--timeout S] [--suppress-errors] [--cache-dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def seeds(text: str) -> list[int]:
    """``a:b`` (a to b-1) or a comma-separated list."""
    if ":" in text:
        a, b = text.split(":")
        return list(range(int(a), int(b)))
    return [int(s) for s in text.split(",") if s]


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=seeds, default=seeds("0:50"))
    ap.add_argument("--modes", default="eager,aot_eager,kiln,train",
                    help="comma-separated: eager, aot_eager, kiln, train, train_aot_eager, train_eager, "
                         "torch[_train][_BACKEND]")
    ap.add_argument("--torch", action="store_true", help="also run torch.compile beside each kiln mode")
    ap.add_argument("--torch-backend", default="inductor")
    ap.add_argument("--torch-seeds", type=seeds, default=None, help="run the torch modes on these seeds only")
    ap.add_argument("--out", default="fuzz-out", help="reproducers and results.jsonl go here")
    ap.add_argument("--subprocess", action="store_true", help="run cases in worker processes (segfault-safe)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (with --subprocess)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    ap.add_argument("--suppress-errors", action="store_true",
                    help="let kiln fall back to eager on internal errors (its default) instead of raising")
    ap.add_argument("--cache-dir", default=None,
                    help="kiln's compile cache for this run (KILN_CACHE_DIR; default: kiln's own)")
    ap.add_argument("--quiet", action="store_true")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    if not args.suppress_errors:
        os.environ["KILN_SUPPRESS_ERRORS"] = "0"
    if args.cache_dir:
        os.environ["KILN_CACHE_DIR"] = os.path.abspath(args.cache_dir)
    from . import report
    from .generator import GenerationFailed, generate
    from .modes import lookup, torch_peer
    from .repro import write_repro

    modes = [lookup(m) for m in args.modes.split(",") if m]
    pairs = []
    if args.torch:
        for m in list(modes):
            if m.compiler == "kiln":
                peer = torch_peer(m, args.torch_backend)
                pairs.append((m.name, peer.name))
                if peer not in modes:
                    modes.append(peer)
    torch_seeds = set(args.torch_seeds if args.torch_seeds is not None else args.seeds)

    t0 = time.perf_counter()
    programs, tasks = {}, []
    for s in args.seeds:
        try:
            programs[s] = generate(s)
        except GenerationFailed as e:
            print(f"seed {s}: {e}", file=sys.stderr)
            continue
        tasks += [(programs[s], m) for m in modes if m.compiler == "kiln" or s in torch_seeds]
    gen_time = time.perf_counter() - t0

    if args.subprocess:
        from .pool import Pool

        stream = Pool(args.jobs, args.timeout, os.path.join(args.out, "logs"), args.suppress_errors).run(tasks)
    else:
        import kiln

        kiln.config.suppress_errors = args.suppress_errors
        from .runner import run_case

        stream = ((t, run_case(t[0], t[1], args.timeout)) for t in tasks)

    os.makedirs(args.out, exist_ok=True)
    results = []
    with open(os.path.join(args.out, "results.jsonl"), "w") as log:
        for (program, mode), result in stream:
            results.append(result)
            log.write(json.dumps(result.to_json()) + "\n")
            log.flush()
            if result.status in report.FAILURES:
                path = write_repro(args.out, program, mode, result)
                if not args.quiet:
                    first = str(result.mismatches[0]) if result.mismatches else result.error.split("\n")[0]
                    print(f"seed {program.seed:>5} {mode.name:<16} {result.status:<8} {first[:150]}  -> {path}",
                          flush=True)
    names = [m.name for m in modes]
    n_train = sum(p.train_inputs is not None for p in programs.values())
    print(f"\n{len(programs)} programs ({n_train} runnable in train mode), generated in {gen_time:.1f} s; "
          f"{len(results)} cases in {time.perf_counter() - t0:.1f} s\n")
    print(report.table(results, names))
    if pairs:
        print("\n" + report.side_by_side(results, pairs))
    print("\nkinds of failure (first difference of each case):\n" + report.kinds(results))
    print(f"\nreproducers and results.jsonl in {args.out}/")
    return 1 if any(r.status in report.FAILURES for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
