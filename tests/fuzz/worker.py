"""A subprocess that runs cases for ``pool.Pool``: one JSON request per line on stdin
(the program and the mode), one JSON ``CaseResult`` per line on the protocol stream.
Whatever the program, kiln or torch print goes to stderr, so that stdout carries the
protocol alone."""
from __future__ import annotations

import json
import os
import sys


def main() -> None:
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from .modes import lookup
    from .program import Program
    from .runner import run_case

    if os.environ.get("FUZZ_SUPPRESS_ERRORS") != "1":
        import kiln

        kiln.config.suppress_errors = False
    for line in sys.stdin:
        req = json.loads(line)
        p = req["program"]
        program = Program(p["seed"], p["source"], p["train_inputs"], tuple(p["features"]))
        result = run_case(program, lookup(req["mode"]), req["timeout"])
        proto.write(json.dumps(result.to_json()) + "\n")
        proto.flush()


if __name__ == "__main__":
    main()
