"""The ``kiln`` logger and its artefacts, switched on by ``KILN_LOGS``.

Each artefact (graph_breaks, recompiles, guards, graph, bytecode, output_code,
fallbacks, aot_graphs, compile_times…) is a child logger ``kiln.<artefact>``.
``KILN_LOGS=graph_breaks,recompiles`` turns those on at INFO level with a handler on
stderr; ``KILN_LOGS=all`` turns every one on. Code logs with ``log_for(name)``.
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
)

root = logging.getLogger("kiln")
_handler: logging.Handler | None = None


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
    for a in ARTEFACTS:
        log_for(a).setLevel(logging.INFO if a in names else logging.WARNING)
    if names and _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[kiln.%(name)s] %(message)s"))
        _handler.setFormatter(_ShortNameFormatter())
        root.addHandler(_handler)


class _ShortNameFormatter(logging.Formatter):
    def format(self, record):
        name = record.name[len("kiln."):] if record.name.startswith("kiln.") else record.name
        return f"[kiln:{name}] {record.getMessage()}"
