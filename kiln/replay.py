"""``python -m kiln.replay FILE``: re-run a failed capture recorded with
``KILN_REPLAY_RECORD=1`` (the record's format is ``kiln/debug/replay.py``).

``replay(path)`` rebuilds the function over the recorded globals and runs it through
capture alone (the ``eager`` backend, the recorded fullgraph flag, ``suppress_errors``
off), after a readable summary: the failure reproduces as an exception with its
traceback."""
from __future__ import annotations

import sys

from kiln import config
from kiln.capture.api import compile as kiln_compile
from kiln.debug.replay import load, summary


def replay(path) -> int:
    """Re-run a record's capture; raises the failure when it reproduces, else 0."""
    fn, args, kwargs, rec = load(path)
    print(summary(fn, args, kwargs, rec))
    settings = {k: v for k, v in rec["config"].items()
                if hasattr(config, k) and k not in ("replay_record", "logs")}
    settings["suppress_errors"] = False
    print("re-running the capture (eager backend)...")
    with config.patch(**settings):
        compiled = kiln_compile(fn, backend="eager", fullgraph=rec["fullgraph"])
        try:
            compiled(*args, **kwargs)
        except Exception as e:
            print(f"REPRODUCED: {type(e).__qualname__}: {e}", file=sys.stderr)
            raise
    print("not reproduced: the capture succeeded")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m kiln.replay FILE", file=sys.stderr)
        return 2
    return replay(argv[0])


if __name__ == "__main__":
    sys.exit(main())
