"""The ``kiln`` logger and its artefacts, switched on by ``KILN_LOGS``.

Each artefact (graph_breaks, recompiles, guards, graph, bytecode, output_code,
fallbacks, aot_graphs, compile_times…) is a child logger ``kiln.<artefact>``.
``KILN_LOGS=graph_breaks,recompiles`` turns those on at INFO level with a handler on
stderr; ``KILN_LOGS=all`` turns every one on. Code logs with ``log_for(name)``.

The same records feed the trace directory (``KILN_TRACE``, trace_dir.py): while a
sink is set, every artefact logs at INFO and each record goes to the sink first; those
KILN_LOGS does not name stop there (they reach no handler), so one log call is both
the log line and the trace's artefact.
"""
from __future__ import annotations

import logging
import sys

ARTEFACTS = (
    "graph_breaks",
    "recompiles",
    "guards",
    "graph",
    "bytecode",
    "output_code",
    "fallbacks",
    "aot_graphs",
    "compile_times",
    "perf_hints",
    "perf",
    "cache",
    "passes",
    "ddp",
)

root = logging.getLogger("kiln")
_handler: logging.Handler | None = None
_shown: set = set()     # the artefacts KILN_LOGS names
_sink = None            # record -> None: the trace directory's collector, when one is on


def log_for(artefact: str) -> logging.Logger:
    """The logger of one artefact; its records are shown when KILN_LOGS names it."""
    return logging.getLogger(f"kiln.{artefact}")


def enabled(artefact: str) -> bool:
    return log_for(artefact).isEnabledFor(logging.INFO)


def set_logs(spec: str | None) -> None:
    """Switch artefacts on from a comma-separated spec (the KILN_LOGS syntax)."""
    global _handler
    names = [s.strip() for s in (spec or "").split(",") if s.strip()]
    if "all" in names:
        names = list(ARTEFACTS)
    unknown = [n for n in names if n not in ARTEFACTS]
    if unknown:
        raise ValueError(
            f"unknown KILN_LOGS artefact(s) {unknown}; known: {', '.join(ARTEFACTS)}"
        )
    _shown.clear()
    _shown.update(names)
    _apply_levels()
    if names and _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[kiln.%(name)s] %(message)s"))
        _handler.setFormatter(_ShortNameFormatter())
        root.addHandler(_handler)


def set_sink(sink) -> None:
    """Send every artefact's records to ``sink(record)`` (None: stop)."""
    global _sink
    _sink = sink
    _apply_levels()


def _apply_levels() -> None:
    for a in ARTEFACTS:
        log_for(a).setLevel(logging.INFO if a in _shown or _sink is not None else logging.WARNING)


class _Gate(logging.Filter):
    """On each artefact logger (and ``kiln`` itself): hand the record to the sink, then
    let it through only if KILN_LOGS names the artefact or it is a warning."""

    def __init__(self, artefact: str | None):
        super().__init__()
        self.artefact = artefact

    def filter(self, record):
        if _sink is not None:
            try:
                _sink(record)
            except Exception:  # noqa: BLE001  (the trace must never break a compile)
                pass
            return (record.levelno >= logging.WARNING or self.artefact is None
                    or self.artefact in _shown)
        return True


for _a in ARTEFACTS:
    log_for(_a).addFilter(_Gate(_a))
root.addFilter(_Gate(None))


class _ShortNameFormatter(logging.Formatter):
    def format(self, record):
        name = record.name[len("kiln."):] if record.name.startswith("kiln.") else record.name
        return f"[kiln:{name}] {record.getMessage()}"
